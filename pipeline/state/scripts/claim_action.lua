-- Long connections: the holder, about to execute an action taken from the bot's queue, checks its
-- fencing token and whether the action already ran (its sender gave up waiting and asked again).
-- KEYS: 1 the lease of the channel actions go over, 2 the action's outcome marker.
-- ARGV: 1 `holder|token`.
-- Returns {'fenced'} when the lease is not this holder's any more (a newer holder took it: the
-- action goes back to the queue), {'done', outcome} when it ran before, {'run'} otherwise.
local current = redis.call('GET', KEYS[1])
local owner = ARGV[1] .. '|'
if not current or string.sub(current, 1, #owner) ~= owner then
  return {'fenced'}
end
local done = redis.call('GET', KEYS[2])
if done then
  return {'done', done}
end
return {'run'}
