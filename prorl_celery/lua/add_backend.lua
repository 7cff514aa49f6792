-- Register an LLM backend. A newcomer starts at the current lowest count, so it does not take
-- every new job until it has caught up with backends that have served for hours.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset)
-- KEYS[2] prorl:llm:types         address -> protocol (hash)
-- KEYS[3] prorl:llm:generation    backend-set generation (string)
-- ARGV[1] address, ARGV[2] protocol
-- Returns {1 if newly added else 0, generation}.
local added = 0
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local start = 0
  if #lowest > 0 then start = tonumber(lowest[2]) end
  redis.call('ZADD', KEYS[1], start, ARGV[1])
  added = 1
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {added, redis.call('GET', KEYS[3]) or '0'}
