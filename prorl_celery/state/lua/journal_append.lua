-- Append events to a job's per-turn journal, for the attempt that owns it, within its bounds.
-- KEYS[1] prorl:job:<id>:journal        list of JSON events
-- KEYS[2] prorl:job:<id>:journal:meta   hash: attempt (the writer), bytes, full (why it stopped)
-- ARGV[1] the writer's attempt: an older attempt's stage (its worker presumed lost) appends nothing
-- ARGV[2] the index the first event takes (the list's length the writer expects): a gap or an
--         overlap is refused, so the journal never holds a turn twice nor misses one
-- ARGV[3] most events the journal may hold, ARGV[4] most bytes
-- ARGV[5..] the events
-- Returns {1, length} on success; {0, reason, length} when refused (reason: fenced | order | full).
local meta = redis.call('HMGET', KEYS[2], 'attempt', 'bytes', 'full')
local length = redis.call('LLEN', KEYS[1])
if meta[1] ~= ARGV[1] then return {0, 'fenced', length} end
if meta[3] and meta[3] ~= '' then return {0, 'full', length} end
if length ~= tonumber(ARGV[2]) then return {0, 'order', length} end
local size = 0
for i = 5, #ARGV do size = size + #ARGV[i] end
local bytes = tonumber(meta[2] or '0')
if length + #ARGV - 4 > tonumber(ARGV[3]) or bytes + size > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], 'full', string.format('%d events, %d bytes', length + #ARGV - 4, bytes + size))
  return {0, 'full', length}
end
redis.call('RPUSH', KEYS[1], unpack(ARGV, 5))
redis.call('HINCRBY', KEYS[2], 'bytes', size)
return {1, length + #ARGV - 4}
