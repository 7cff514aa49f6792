-- Put jobs into the reaper's indexes where they belong and take them out where they do not:
-- the backfill for jobs written by a version without the indexes, and the repair of an entry
-- left behind by one. Every other change to the indexes is made by transition.lua.
-- KEYS[1] prorl:jobs:leases       job id -> lease deadline (zset)
-- KEYS[2] prorl:jobs:waiting_run  queue -> node it is local to, per node's queue with waiting
--                                 jobs (hash; the shared queue is never listed)
-- KEYS[3..n] prorl:job:<id>       job records (hash)
-- ARGV[1] the indexes, JSON (as transition.lua's ARGV[11]; lease_s: the reaper's lease)
-- ARGV[2] a queue whose waiting set the ids were read from, or "" (then only added, never
--         taken out of a waiting set)
-- ARGV[3..n] the job ids, in the order of KEYS[3..n]
-- A lease entry that exists keeps its deadline (claim and renewal wrote it); a missing one gets
-- the deadline the record implies: max(status_at + lease_s, lease_until).
-- A job in a status listed in index.unclaimed is put into that status's zset (scored by its
-- status_at) and taken out of the others.
-- Returns the number of entries added and removed.
local index = cjson.decode(ARGV[1])
local executing = {}
for _, status in ipairs(index.executing) do executing[status] = true end
local changed = 0
for i = 3, #KEYS do
  local id = ARGV[i]
  local job = redis.call('HMGET', KEYS[i], 'status', 'status_at', 'lease_until', 'run_queue', 'init_node')
  local status = job[1]
  if status and executing[status] then
    local deadline = math.max((tonumber(job[2]) or 0) + tonumber(index.lease_s), tonumber(job[3]) or 0)
    changed = changed + redis.call('ZADD', KEYS[1], 'NX', string.format('%.6f', deadline), id)
  else
    changed = changed + redis.call('ZREM', KEYS[1], id)
  end
  local queue, node = nil, ''
  if status == index.waiting then
    queue = job[4] or ''
    if queue == '' then queue = index.shared_queue else node = job[5] or '' end
    changed = changed + redis.call('SADD', index.waiting_prefix .. queue, id)
    -- as transition.lua: only a node's queue is listed (the shared one has no node to lose)
    if queue ~= index.shared_queue then redis.call('HSET', KEYS[2], queue, node) end
  end
  -- the index of jobs waiting for a stage consumed without acks: a missing entry is scored by
  -- status_at (when the job entered the status), an existing one keeps its score
  for name, zset in pairs(index.unclaimed or {}) do
    if status == name then
      changed = changed + redis.call('ZADD', zset, 'NX', job[2] or '0', id)
    else
      changed = changed + redis.call('ZREM', zset, id)
    end
  end
  if ARGV[2] ~= '' and ARGV[2] ~= queue then
    local waiting = index.waiting_prefix .. ARGV[2]
    changed = changed + redis.call('SREM', waiting, id)
    if ARGV[2] ~= index.shared_queue and redis.call('SCARD', waiting) == 0 then
      redis.call('HDEL', KEYS[2], ARGV[2])
    end
  end
end
return changed
