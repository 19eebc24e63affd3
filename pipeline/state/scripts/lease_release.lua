-- Long connections: the holder gives its leases up (on stop), never a newer holder's.
-- KEYS: the channel leases. ARGV: 1 `holder|token`. Returns how many were released.
local owner = ARGV[1] .. '|'
local released = 0
for i = 1, #KEYS do
  local current = redis.call('GET', KEYS[i])
  if current and string.sub(current, 1, #owner) == owner then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
return released
