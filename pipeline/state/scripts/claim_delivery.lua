-- Egress, before a platform call: what a replay already delivered, and the rate windows' slots.
-- KEYS: 1…n delivered markers (the message's, then its calls'; n may be 0), then the sliding
-- windows to take a slot in (per chat, per bot).
-- ARGV: 1 n, 2 now (ms), 3 a unique member for the windows, then per window: limit, length (ms).
-- A slot is taken in every window or in none. Returns {markers…, wait}: wait is 0 when the slots
-- were taken (or the message was delivered before: then none is taken), else the milliseconds until
-- the fullest window frees a slot.
local n, now, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local out = {}
if n > 0 then
  out = redis.call('MGET', unpack(KEYS, 1, n))
  if out[1] then
    out[n + 1] = 0
    return out
  end
end
local wait = 0
for j = n + 1, #KEYS do
  local base = 4 + 2 * (j - n - 1)
  local limit, length = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
  redis.call('ZREMRANGEBYSCORE', KEYS[j], '-inf', now - length)
  if redis.call('ZCARD', KEYS[j]) >= limit then
    local oldest = redis.call('ZRANGE', KEYS[j], 0, 0, 'WITHSCORES')
    wait = math.max(wait, tonumber(oldest[2]) + length - now)
  end
end
if wait == 0 then
  for j = n + 1, #KEYS do
    local length = tonumber(ARGV[5 + 2 * (j - n - 1)])
    redis.call('ZADD', KEYS[j], now, member)
    redis.call('PEXPIRE', KEYS[j], length)
  end
end
out[n + 1] = wait
return out
