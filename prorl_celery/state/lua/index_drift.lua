-- How far the reaper's indexes are from the status counters, read at one instant.
-- KEYS[1] prorl:stats:status      status -> number of jobs in it (hash), kept by every version
-- KEYS[2] prorl:jobs:leases       job id -> lease deadline (zset)
-- KEYS[3] prorl:jobs:waiting_run  queue -> node, per node's queue with waiting jobs (hash); each
--                                 queue's ids, the shared queue's too, in
--                                 <ARGV[1].waiting_prefix><queue> (set)
-- ARGV[1] the indexes, JSON (as transition.lua's ARGV[11])
-- Returns {jobs executing, lease entries, jobs in the waiting status, waiting entries, jobs in
-- the statuses of index.unclaimed, entries of their zsets}.
-- O(queues): one per node, never one per job.
local index = cjson.decode(ARGV[1])
local executing = 0
for _, status in ipairs(index.executing) do
  executing = executing + (tonumber(redis.call('HGET', KEYS[1], status)) or 0)
end
local waiting = tonumber(redis.call('HGET', KEYS[1], index.waiting)) or 0
-- the shared queue's set is not listed in KEYS[3] (only node queues are; an older version's
-- entry for it may linger there): counted once, on its own
local listed = redis.call('SCARD', index.waiting_prefix .. index.shared_queue)
for _, queue in ipairs(redis.call('HKEYS', KEYS[3])) do
  if queue ~= index.shared_queue then
    listed = listed + redis.call('SCARD', index.waiting_prefix .. queue)
  end
end
local unclaimed, unclaimed_listed = 0, 0
for status, zset in pairs(index.unclaimed or {}) do
  unclaimed = unclaimed + (tonumber(redis.call('HGET', KEYS[1], status)) or 0)
  unclaimed_listed = unclaimed_listed + redis.call('ZCARD', zset)
end
return {executing, redis.call('ZCARD', KEYS[2]), waiting, listed, unclaimed, unclaimed_listed}
