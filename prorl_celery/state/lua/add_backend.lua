-- Register an LLM backend with the health its probe found. A newcomer starts at the current lowest
-- count, so it does not take every new job until it has caught up with backends that have served
-- for hours; an unhealthy one is out of routing (acquire_backend.lua) until a probe answers.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset)
-- KEYS[2] prorl:llm:types         address -> protocol (hash)
-- KEYS[3] prorl:llm:generation    backend-set generation (string)
-- KEYS[4] prorl:llm:health        address -> {"healthy", "since", "detail"} (hash of JSON)
-- KEYS[5] prorl:llm:unhealthy     addresses out of routing (set)
-- ARGV[1] address, ARGV[2] protocol, ARGV[3] "1" healthy | "0" not, ARGV[4] detail,
-- ARGV[5] now (unix seconds)
-- Returns {1 if newly added else 0, generation, the health record (JSON)}.
local added = 0
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local start = 0
  if #lowest > 0 then start = tonumber(lowest[2]) end
  redis.call('ZADD', KEYS[1], start, ARGV[1])
  added = 1
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
-- the health, as set_backend_health.lua writes it: "since" changes only with the state
local healthy = ARGV[3] == '1'
local since = tonumber(ARGV[5])
local current = redis.call('HGET', KEYS[4], ARGV[1])
if current then
  local old = cjson.decode(current)
  if old.healthy == healthy and old.since then since = old.since end
end
local record = cjson.encode({healthy = healthy, since = since, detail = ARGV[4]})
redis.call('HSET', KEYS[4], ARGV[1], record)
if healthy then redis.call('SREM', KEYS[5], ARGV[1]) else redis.call('SADD', KEYS[5], ARGV[1]) end
return {added, redis.call('GET', KEYS[3]) or '0', record}
