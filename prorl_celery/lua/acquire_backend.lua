-- Assign a job to the LLM backend with the fewest assignments and count the assignment.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset)
-- KEYS[2] prorl:llm:types         address -> protocol (hash)
-- KEYS[3] prorl:llm:inflight      address -> jobs in RUN on it (hash)
-- KEYS[4] prorl:llm:generation    backend-set generation (string)
-- KEYS[5] prorl:job:<id>          (optional) the job's record: the assignment is written there
--                                 (backend, backend_protocol, generation) while the job is in
--                                 status ARGV[1] on attempt ARGV[2], as store.update's guard would
-- Returns {address, protocol, generation}, or false when no backend is registered.
local lowest = redis.call('ZRANGE', KEYS[1], 0, 0)
if #lowest == 0 then return false end
local address = lowest[1]
redis.call('ZINCRBY', KEYS[1], 1, address)
redis.call('HINCRBY', KEYS[3], address, 1)
local protocol = redis.call('HGET', KEYS[2], address) or 'vllm'
local generation = redis.call('GET', KEYS[4]) or '0'
if KEYS[5] then
  local job = redis.call('HMGET', KEYS[5], 'status', 'attempt')
  if job[1] == ARGV[1] and (job[2] or '1') == ARGV[2] then
    redis.call('HSET', KEYS[5], 'backend', address, 'backend_protocol', protocol, 'generation', generation)
  end
end
return {address, protocol, generation}
