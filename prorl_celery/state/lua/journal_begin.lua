-- A stage of attempt ARGV[1] takes a job's journal over: from now on only it may append.
-- KEYS[1] prorl:job:<id>:journal, KEYS[2] prorl:job:<id>:journal:meta
-- ARGV[1] the attempt; ARGV[2] "1" to start the journal empty (a rollout from turn zero)
-- Returns {1, full, events...}; {0, attempt} when a later attempt owns it already.
local owner = tonumber(redis.call('HGET', KEYS[2], 'attempt') or '0')
if owner > tonumber(ARGV[1]) then return {0, tostring(owner)} end
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'bytes', 0, 'full', '')
end
redis.call('HSET', KEYS[2], 'attempt', ARGV[1])
local full = redis.call('HGET', KEYS[2], 'full') or ''
local reply = {1, full}
for _, event in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do table.insert(reply, event) end
return reply
