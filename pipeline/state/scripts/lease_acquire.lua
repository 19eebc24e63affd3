-- Long connections: a worker becomes the holder of a bot's connection channels.
-- KEYS: 1 the bot's fencing-token counter, 2… the channel leases (held together).
-- ARGV: 1 holder id, 2 lease length (ms), 3 state (`dialing` or `up`), 4 `take` or `free`.
-- `free`: only when none of the channels is held (workers competing to dial); `take`: whoever held
-- them (the newest accepted connection wins). Each lease's value is `holder|token|state`; the token
-- grows with every new holder of the bot. Returns {token, previous value of the first lease or ''},
-- or {0, current value} when a `free` acquisition finds a channel held.
if ARGV[4] ~= 'take' then
  for i = 2, #KEYS do
    local current = redis.call('GET', KEYS[i])
    if current then
      return {0, current}
    end
  end
end
local previous = redis.call('GET', KEYS[2]) or ''
local token = redis.call('INCR', KEYS[1])
local value = ARGV[1] .. '|' .. token .. '|' .. ARGV[3]
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
end
return {token, previous}
