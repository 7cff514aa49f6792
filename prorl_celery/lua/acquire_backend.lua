-- Assign a job to the LLM backend with the fewest assignments and count the assignment.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset)
-- KEYS[2] prorl:llm:types         address -> protocol (hash)
-- KEYS[3] prorl:llm:inflight      address -> jobs in RUN on it (hash)
-- KEYS[4] prorl:llm:generation    backend-set generation (string)
-- Returns {address, protocol, generation}, or false when no backend is registered.
local lowest = redis.call('ZRANGE', KEYS[1], 0, 0)
if #lowest == 0 then return false end
local address = lowest[1]
redis.call('ZINCRBY', KEYS[1], 1, address)
redis.call('HINCRBY', KEYS[3], address, 1)
return {address, redis.call('HGET', KEYS[2], address) or 'vllm', redis.call('GET', KEYS[4]) or '0'}
