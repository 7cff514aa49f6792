-- Assign jobs to the LLM backend with the fewest assignments, one by one, and count them.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset)
-- KEYS[2] prorl:llm:types         address -> protocol (hash)
-- KEYS[3] prorl:llm:inflight      address -> jobs in RUN on it (hash)
-- KEYS[4] prorl:llm:generation    backend-set generation (string)
-- KEYS[5..] prorl:job:<id>        (optional) the jobs' records: each job's assignment is written
--                                 there (backend, backend_protocol, generation) while the job is
--                                 in status ARGV[1] on its attempt ARGV[1 + i], as store.update's
--                                 guard would
-- Returns {address, protocol, generation} per job, flat (one triple without job keys), or false
-- when no backend is registered.
local jobs = math.max(1, #KEYS - 4)
local generation = redis.call('GET', KEYS[4]) or '0'
local reply = {}
for i = 1, jobs do
  local lowest = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #lowest == 0 then return false end
  local address = lowest[1]
  redis.call('ZINCRBY', KEYS[1], 1, address)
  redis.call('HINCRBY', KEYS[3], address, 1)
  local protocol = redis.call('HGET', KEYS[2], address) or 'vllm'
  local job_key = KEYS[4 + i]
  if job_key then
    local job = redis.call('HMGET', job_key, 'status', 'attempt')
    if job[1] == ARGV[1] and (job[2] or '1') == ARGV[1 + i] then
      redis.call('HSET', job_key, 'backend', address, 'backend_protocol', protocol, 'generation', generation)
    end
  end
  reply[#reply + 1] = address
  reply[#reply + 1] = protocol
  reply[#reply + 1] = generation
end
return reply
