-- Long connections: the holder extends its leases, only while every one is still its own.
-- KEYS: the channel leases. ARGV: 1 `holder|token`, 2 lease length (ms), 3 state (`dialing`, `up`).
-- Returns 1 when extended, 0 when any lease expired or has a newer holder (the connection must stop).
local owner = ARGV[1] .. '|'
for i = 1, #KEYS do
  local current = redis.call('GET', KEYS[i])
  if not current or string.sub(current, 1, #owner) ~= owner then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], owner .. ARGV[3], 'PX', ARGV[2])
end
return 1
