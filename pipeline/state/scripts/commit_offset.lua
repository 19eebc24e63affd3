-- Long connections: the holder of a polled bot records how far its updates are durable, only while
-- the lease is still its own (a stale holder cannot move it).
-- KEYS: 1 the lease of the channel updates come over, 2 the bot's offset.
-- ARGV: 1 `holder|token`, 2 the offset (what the next poll starts from).
-- Returns 1 when recorded, 0 when the lease is not this holder's any more.
local current = redis.call('GET', KEYS[1])
local owner = ARGV[1] .. '|'
if not current or string.sub(current, 1, #owner) ~= owner then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
