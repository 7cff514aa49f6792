-- Extend the leases of jobs a worker is still executing.
-- KEYS[1] prorl:jobs:leases       job id -> lease deadline (zset), read by the reaper
-- KEYS[2..n] prorl:job:<id>       job records (hash) of the jobs being executed
-- ARGV[1] lease length in seconds
-- ARGV[2] the executing statuses, JSON list (from prorl_celery.core.status.EXECUTING)
-- ARGV[3..n] the job ids, in the order of KEYS[2..n]
-- Only a job still in an executing status is touched, so a renewal never recreates an expired
-- record nor revives a job that has ended meanwhile. lease_until stays on the record too: the
-- reaper checks a candidate against it.
local t = redis.call('TIME')
local until_ = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1]))
local executing = {}
for _, status in ipairs(cjson.decode(ARGV[2])) do executing[status] = true end
local renewed = 0
for i = 2, #KEYS do
  local status = redis.call('HGET', KEYS[i], 'status')
  if status and executing[status] then
    redis.call('HSET', KEYS[i], 'lease_until', until_)
    redis.call('ZADD', KEYS[1], until_, ARGV[i + 1])
    renewed = renewed + 1
  end
end
return renewed
