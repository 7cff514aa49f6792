-- Move a job to a new status when its current status allows it, with PausableTimer accounting.
-- KEYS[1] prorl:job:<id>          job record (hash): status, budget_s, active_s, resumed_at, <stage>_s
-- KEYS[2] prorl:stats:status      status counters (hash)
-- KEYS[3] prorl:jobs:ended        stream of ended jobs ({job, status}; capped), tailed by waiters
-- KEYS[4] prorl:jobs:active       ids of jobs not yet ended (set)
-- KEYS[5] prorl:jobs:leases       job id -> lease deadline of its executing stage (zset)
-- KEYS[6] prorl:jobs:waiting_run  queue -> node it is local to, per node's queue with jobs in
--                                 pending_run (hash; the shared queue is never listed); each
--                                 queue's ids in <ARGV[11].waiting_prefix><queue> (set)
-- KEYS[7] prorl:stats:outcomes    outcome class -> jobs that ended with it (hash)
-- KEYS[8], KEYS[9] (optional) the job's journal and its meta hash: they expire with the job
-- ARGV[1] job id
-- ARGV[2] target status, or "" to only set the fields (ARGV[12..]) under the same guard
-- ARGV[3] allowed current statuses, comma separated (from prorl_celery.core.status.ALLOWED_FROM)
-- ARGV[4] timer operation: "resume" (a stage starts) | "pause" (a stage ends) | "none"
-- ARGV[5] "1" when the target is terminal
-- ARGV[6] TTL in seconds given to the job's keys once terminal
-- ARGV[7] "1" to return the whole job record too (a stage claim: saves a round trip)
-- ARGV[8] the attempt the caller works for, or "" for any: a stage of an attempt that was
--         given up (its worker was presumed lost) cannot move the retried job
-- ARGV[9] key prefix of the per-minute ended-job counters (prorl:stats:minute:), "" for none
-- ARGV[10] TTL in seconds of those counters
-- ARGV[11] the indexes, JSON: {executing: [statuses], lease_s, waiting: "pending_run",
--          shared_queue: "run", waiting_prefix, unclaimed: {status: zset}} (from
--          prorl_celery.state.store.index_spec)
-- ARGV[12..] field, value pairs to set on the job record
-- Returns {1, previous status, budget left in s, redis time[, record as HGETALL]} on success
--         ({1, current status} for a guarded write of fields only),
--         {0, current status} when not allowed, {0, ""} when the job does not exist.
-- Time comes from the Redis server so that workers on different nodes share one clock.
-- every field this script reads, in one call (read before the fields are written)
local at, record
if ARGV[7] == '1' then
  -- a claim returns the whole record: read it once, here, and return it with this script's
  -- writes applied (one command instead of HMGET now and HGETALL at the end)
  local raw = redis.call('HGETALL', KEYS[1])
  record = {}
  for i = 1, #raw, 2 do record[raw[i]] = raw[i + 1] end
  at = {record.status, record.attempt, record.resumed_at, record.budget_s, record.active_s,
        record.run_queue, record.init_node, record.init_s, record.run_s, record.eval_s}
else
  at = redis.call('HMGET', KEYS[1], 'status', 'attempt', 'resumed_at', 'budget_s', 'active_s',
                  'run_queue', 'init_node', 'init_s', 'run_s', 'eval_s')
end
local current = at[1]
if not current then return {0, ''} end
local allowed = false
for status in string.gmatch(ARGV[3], '[^,]+') do
  if status == current then allowed = true end
end
if not allowed then return {0, current} end
if ARGV[8] ~= '' and (at[2] or '1') ~= ARGV[8] then
  return {0, current}
end
if ARGV[2] == '' then
  -- a stage's own fields while it runs (sandbox, backend): never onto another attempt's job
  if #ARGV > 11 then redis.call('HSET', KEYS[1], unpack(ARGV, 12)) end
  return {1, current}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local stamp = string.format('%.6f', now)
local resumed_at, budget, active = at[3], tonumber(at[4] or '0'), tonumber(at[5] or '0')
local stage_s = {init_s = at[8], run_s = at[9], eval_s = at[10]}
local updates = {'status', ARGV[2], 'status_at', stamp}
if ARGV[4] == 'pause' and resumed_at and resumed_at ~= '' then
  -- only an executing stage has resumed_at set, so `current` names that stage
  local elapsed = now - tonumber(resumed_at)
  active = active + elapsed
  local field = current .. '_s'
  if field == 'init_s' or field == 'run_s' or field == 'eval_s' then  -- read above: set with the rest
    table.insert(updates, field)
    table.insert(updates, string.format('%.6f', tonumber(stage_s[field] or '0') + elapsed))
  else
    local total = redis.call('HINCRBYFLOAT', KEYS[1], field, string.format('%.6f', elapsed))
    if record then record[field] = total end
  end
  table.insert(updates, 'active_s'); table.insert(updates, string.format('%.6f', active))
  table.insert(updates, 'resumed_at'); table.insert(updates, '')
elseif ARGV[4] == 'resume' then
  table.insert(updates, 'resumed_at'); table.insert(updates, stamp)
end
if ARGV[5] == '1' then
  table.insert(updates, 'ended_at'); table.insert(updates, stamp)
end
-- run_queue and init_node as they are once the fields below are written (the last one wins)
local run_queue, init_node = at[6], at[7]
for i = 12, #ARGV do table.insert(updates, ARGV[i]) end
for i = 12, #ARGV - 1, 2 do
  if ARGV[i] == 'run_queue' then run_queue = ARGV[i + 1] end
  if ARGV[i] == 'init_node' then init_node = ARGV[i + 1] end
end
-- the queue a job leaves pending_run from, read before the fields (a retry clears run_queue)
local index = cjson.decode(ARGV[11])
local left_queue = nil
if current == index.waiting then left_queue = at[6] or '' end
redis.call('HSET', KEYS[1], unpack(updates))
if record then
  for i = 1, #updates - 1, 2 do record[updates[i]] = updates[i + 1] end
end
-- The indexes move with the status, in this script only, so the reaper reads candidates instead
-- of every active job: a stage claim takes a lease until now + lease_s (renew_leases.lua extends
-- it); leaving an executing status drops it. A job in pending_run sits in its queue's set.
local executing = {}
for _, status in ipairs(index.executing) do executing[status] = true end
if executing[ARGV[2]] then
  redis.call('ZADD', KEYS[5], string.format('%.6f', now + tonumber(index.lease_s)), ARGV[1])
elseif executing[current] then
  redis.call('ZREM', KEYS[5], ARGV[1])
end
-- A job waiting for a stage whose queue is consumed without acks (pending_init, pending_eval)
-- is scored by when it entered that status: the reaper finds a job whose message was lost.
local unclaimed = index.unclaimed or {}
if unclaimed[current] then redis.call('ZREM', unclaimed[current], ARGV[1]) end
if unclaimed[ARGV[2]] then redis.call('ZADD', unclaimed[ARGV[2]], stamp, ARGV[1]) end
if left_queue then  -- a status never moves to itself, so the job left pending_run
  local queue = left_queue ~= '' and left_queue or index.shared_queue
  local waiting = index.waiting_prefix .. queue
  redis.call('SREM', waiting, ARGV[1])
  -- the shared queue has no node that could die, so KEYS[6] never lists it (nothing to drop)
  if queue ~= index.shared_queue and redis.call('SCARD', waiting) == 0 then
    redis.call('HDEL', KEYS[6], queue)
  end
end
if ARGV[2] == index.waiting then
  local queue = run_queue or ''
  if queue == '' then queue = index.shared_queue end
  redis.call('SADD', index.waiting_prefix .. queue, ARGV[1])
  if queue ~= index.shared_queue then redis.call('HSET', KEYS[6], queue, init_node or '') end
end
redis.call('HINCRBY', KEYS[2], current, -1)
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
if ARGV[5] == '1' then
  redis.call('SREM', KEYS[4], ARGV[1])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '100000', '*', 'job', ARGV[1], 'status', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  for i = 8, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[6]) end
  -- the class the job ended with: as the fields give it, else (an ender that names none) the
  -- one its status implies (prorl_celery.core.outcomes.of_status)
  local ending = nil
  for i = 12, #ARGV - 1, 2 do
    if ARGV[i] == 'outcome' and ARGV[i + 1] ~= '' then ending = ARGV[i + 1] end
  end
  if not ending then
    local implied = {completed = 'ok', cancelled = 'cancelled', timeout = 'timeout'}
    ending = implied[ARGV[2]] or 'env_error'
  end
  redis.call('HINCRBY', KEYS[7], ending, 1)
  if ARGV[9] ~= '' then
    -- exact per-minute throughput and reward for the dashboard, by the Redis clock
    local minute = ARGV[9] .. string.format('%d', math.floor(now / 60) * 60)
    -- the hash is created by a status's first count (the reward sum follows it): that one
    -- sets the TTL, instead of every job that ends in the minute
    if redis.call('HINCRBY', minute, ARGV[2], 1) == 1 then redis.call('EXPIRE', minute, ARGV[10]) end
    redis.call('HINCRBY', minute, 'outcome:' .. ending, 1)
    if ARGV[2] == 'completed' then
      for i = 12, #ARGV - 1, 2 do
        if ARGV[i] == 'reward' and tonumber(ARGV[i + 1]) then
          redis.call('HINCRBYFLOAT', minute, 'reward_sum', ARGV[i + 1])
        end
      end
    end
  end
end
local reply = {1, current, string.format('%.6f', budget - active), stamp}
if record then
  local flat = {}
  for name, value in pairs(record) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  reply[5] = flat  -- as HGETALL would list the record now (in another order)
end
return reply
