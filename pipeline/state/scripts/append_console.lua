-- The console's delivery: append to a chat (capped) and wake its viewers, at most once per message.
-- KEYS: the chat's list, its live channel, the posted marker ('' for none).
-- ARGV: payload, cap, list TTL, chat id, marker TTL.
if KEYS[3] ~= '' and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[5]) then return 0 end
local count = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[4])
return count
