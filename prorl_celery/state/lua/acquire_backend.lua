-- Assign jobs to the healthy LLM backend with the fewest assignments, one by one, and count them.
-- KEYS[1] prorl:llm:backends      address -> assignments (zset)
-- KEYS[2] prorl:llm:types         address -> protocol (hash)
-- KEYS[3] prorl:llm:inflight      address -> jobs in RUN on it now (hash)
-- KEYS[4] prorl:llm:generation    backend-set generation (string)
-- KEYS[5] prorl:llm:unhealthy     addresses taken out of routing until a probe answers (set)
-- KEYS[6..] prorl:job:<id>        (optional) the jobs' records: each job's assignment is written
--                                 there (backend, backend_protocol, generation) while the job is
--                                 in status ARGV[1] on its attempt ARGV[1 + i], as store.update's
--                                 guard would; a record's prefer_backend (a fork's: its source's
--                                 backend, whose cache holds the shared prefix) is taken instead of
--                                 the least-assigned one while it is registered and healthy
-- Returns {address, protocol, generation} per job, flat (one triple without job keys), or false
-- when no healthy backend is registered (the job waits, as with none registered).
local ROUTE_KEYS = 5
local jobs = math.max(1, #KEYS - ROUTE_KEYS)
local generation = redis.call('GET', KEYS[4]) or '0'
local any_down = redis.call('SCARD', KEYS[5]) > 0

-- the least-assigned backend not in the unhealthy set (ZRANGE 0 0 alone while none is down)
local function lowest()
  if not any_down then
    return redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  end
  local start, step = 0, 16
  while true do
    local batch = redis.call('ZRANGE', KEYS[1], start, start + step - 1)
    if #batch == 0 then return nil end
    for _, address in ipairs(batch) do
      if redis.call('SISMEMBER', KEYS[5], address) == 0 then return address end
    end
    start = start + step
  end
end

local reply = {}
for i = 1, jobs do
  local job_key = KEYS[ROUTE_KEYS + i]
  local address = nil
  if job_key then
    local prefer = redis.call('HGET', job_key, 'prefer_backend')
    if prefer and prefer ~= '' and redis.call('ZSCORE', KEYS[1], prefer)
        and redis.call('SISMEMBER', KEYS[5], prefer) == 0 then
      address = prefer
    end
  end
  address = address or lowest()
  if not address then return false end
  redis.call('ZINCRBY', KEYS[1], 1, address)
  redis.call('HINCRBY', KEYS[3], address, 1)
  local protocol = redis.call('HGET', KEYS[2], address) or 'vllm'
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
