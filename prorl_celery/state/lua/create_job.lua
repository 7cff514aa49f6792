-- Create a job record once; a repeated job id returns the existing job (idempotent submit).
-- KEYS[1] prorl:job:<id>          job record (hash)
-- KEYS[2] prorl:stats:status      status counters (hash)
-- KEYS[3] prorl:jobs:recent       job id -> creation time (zset)
-- KEYS[4] prorl:service:state     "started" | "stopped" (string)
-- KEYS[5] prorl:jobs:active       ids of jobs not yet ended (set)
-- KEYS[6] prorl:jobs:unclaimed:pending_init  job id -> when it entered pending_init (zset; the
--                                 reaper's index of jobs whose INIT message may be lost)
-- ARGV[1] job id, ARGV[2] how many recent ids to keep (about: see the trim below), ARGV[3..] field, value pairs
-- Returns {1, "pending_init"} when created, {0, <status>} when it existed, {-1, "stopped"}.
local current = redis.call('HGET', KEYS[1], 'status')
if current then return {0, current} end
if redis.call('GET', KEYS[4]) == 'stopped' then return {-1, 'stopped'} end
local t = redis.call('TIME')
local now = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6)
local record = {'id', ARGV[1], 'status', 'pending_init', 'created_at', now, 'status_at', now,
                'active_s', '0', 'resumed_at', ''}
for i = 3, #ARGV do table.insert(record, ARGV[i]) end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('HINCRBY', KEYS[2], 'pending_init', 1)
redis.call('ZADD', KEYS[3], now, ARGV[1])
-- trimmed on about one creation in 64 (the Redis clock's microseconds pick it), each trim
-- dropping everything past the limit: the listing may hold a few dozen ids more than ARGV[2],
-- and a job pays no trim of its own
if tonumber(t[2]) % 64 == 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[2]) + 1)) end
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[6], now, ARGV[1])
return {1, 'pending_init'}
