-- Keep the first ARGV[2] events of a job's journal (a resume that replayed fewer than it held,
-- or a restart from turn zero), for the attempt that owns it.
-- KEYS[1] prorl:job:<id>:journal, KEYS[2] prorl:job:<id>:journal:meta
-- ARGV[1] the attempt; ARGV[2] events kept
-- Returns 1, or 0 when another attempt owns the journal.
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[1] then return 0 end
local keep = tonumber(ARGV[2])
if keep == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('LTRIM', KEYS[1], 0, keep - 1)
end
local bytes = 0
for _, event in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do bytes = bytes + #event end
redis.call('HSET', KEYS[2], 'bytes', bytes, 'full', '')
return 1
