-- Extend the leases of jobs a worker is still executing.
-- KEYS[1..n] prorl:job:<id>       job records (hash) of the jobs being executed
-- ARGV[1] lease length in seconds
-- Only a job still in an executing status (init, run, eval) is touched, so a renewal never
-- recreates an expired record nor revives a job that has ended meanwhile.
local t = redis.call('TIME')
local until_ = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1]))
local renewed = 0
for _, key in ipairs(KEYS) do
  local status = redis.call('HGET', key, 'status')
  if status == 'init' or status == 'run' or status == 'eval' then
    redis.call('HSET', key, 'lease_until', until_)
    renewed = renewed + 1
  end
end
return renewed
