-- Give a sandbox's ledger entry a new owner, only over the entry exactly as the caller read it.
-- KEYS[1] prorl:node:<node>:sandboxes   sandbox id -> record JSON (hash)
-- ARGV[1] sandbox id, ARGV[2] the entry as read, ARGV[3] that entry with the new owner
-- Returns 1 (transferred), 0 (the entry is gone: the sandbox was stopped meanwhile) or -1 (the
-- entry was rewritten meanwhile, e.g. a failed stop marked: read it again). A read, then a
-- plain HSET, would re-create the entry of a sandbox stopped in between, or undo that mark.
-- The JSON is compared, not decoded: cjson would re-encode an empty list as {} and round floats.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  return 0
end
if current ~= ARGV[2] then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
