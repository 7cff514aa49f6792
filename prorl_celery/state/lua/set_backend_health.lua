-- Record a registered LLM backend's health: an unhealthy one is out of routing
-- (acquire_backend.lua) until a probe finds it answering again. "since" changes only with the
-- state, so it says how long the backend has been up (or down); "detail" is the latest word.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset): only a registered address is set
-- KEYS[2] prorl:llm:health        address -> {"healthy", "since", "detail"} (hash of JSON)
-- KEYS[3] prorl:llm:unhealthy     addresses out of routing (set)
-- ARGV[1] address, ARGV[2] "1" healthy | "0" not, ARGV[3] detail, ARGV[4] now (unix seconds)
-- Returns the health record written (JSON), or false when the address is not registered (removed
-- meanwhile: nothing is written).
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return false end
local healthy = ARGV[2] == '1'
local since = tonumber(ARGV[4])
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current then
  local old = cjson.decode(current)
  if old.healthy == healthy and old.since then since = old.since end
end
local record = cjson.encode({healthy = healthy, since = since, detail = ARGV[3]})
redis.call('HSET', KEYS[2], ARGV[1], record)
if healthy then redis.call('SREM', KEYS[3], ARGV[1]) else redis.call('SADD', KEYS[3], ARGV[1]) end
return record
