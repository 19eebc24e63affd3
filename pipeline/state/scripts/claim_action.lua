-- Long connections: the holder, about to run an action taken from the bot's queue, checks its
-- fencing token and what became of the action before (its sender gave up waiting and asked again,
-- or an earlier holder took it), and records that it is about to send it.
-- KEYS: 1 the lease of the channel actions go over, 2 the action's marker.
-- ARGV: 1 `holder|token`, 2 the marker's lifetime (s).
-- Returns {'fenced'} when the lease is not this holder's any more (a newer holder took it: the
-- action goes back to the queue); {'done', outcome} when it ended before; {'mine'} when this holder
-- sent it already; {'unknown'} when an earlier holder sent it and never recorded how it ended (it
-- may have been posted: it is not sent again); {'run'} otherwise, with the marker now `sending:`.
local current = redis.call('GET', KEYS[1])
local owner = ARGV[1] .. '|'
if not current or string.sub(current, 1, #owner) ~= owner then
  return {'fenced'}
end
local marker = redis.call('GET', KEYS[2])
if marker then
  if string.sub(marker, 1, 5) == 'done:' then
    return {'done', string.sub(marker, 6)}
  end
  if marker == 'sending:' .. ARGV[1] then
    return {'mine'}
  end
  return {'unknown'}
end
redis.call('SET', KEYS[2], 'sending:' .. ARGV[1], 'EX', ARGV[2])
return {'run'}
