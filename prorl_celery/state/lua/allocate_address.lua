-- Lease the first free loopback address of a network to an owner, on one node.
-- KEYS[1] prorl:node:<node>:addresses   address -> owner (hash)
-- ARGV[1] first address as an integer, ARGV[2] last address as an integer, ARGV[3] owner
-- Returns the dotted address, or false when every address is leased. Skips x.x.x.0,
-- x.x.x.255 and 127.0.0.1 (the host's own).
local function dotted(n)
  return string.format('%d.%d.%d.%d', math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                       math.floor(n / 256) % 256, n % 256)
end
for n = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  local last = n % 256
  if last ~= 0 and last ~= 255 and n ~= 2130706433 then
    if redis.call('HSETNX', KEYS[1], dotted(n), ARGV[3]) == 1 then return dotted(n) end
  end
end
return false
