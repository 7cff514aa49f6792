-- End a loopback lease on one node, only while it still belongs to the given owner.
-- KEYS[1] prorl:node:<node>:addresses   address -> owner (hash)
-- ARGV[1] address, ARGV[2] owner ("" releases whatever owner holds it)
-- Several workers may reap the same dead sandbox; without the owner check the late ones would
-- free an address already leased again to a new sandbox.
if ARGV[2] == '' or redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
