-- The console's delivery: number it in its chat, append it (capped), publish it once for every viewer.
-- At most once per outbound id.
-- KEYS: the chat's list, its sequence counter, the live channel, the posted marker ('' for none).
-- ARGV: the message (a JSON object), cap, list TTL, marker TTL, the header's `[bot, chat]` as JSON.
-- The sequence number goes first into the object (`{"seq":N,` + the rest of it); the live message is
-- `[bot, chat, seq]\n<message>`.
if KEYS[4] ~= '' and not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[4]) then return 0 end
local seq = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
local message = '{"seq":' .. seq .. ',' .. string.sub(ARGV[1], 2)
redis.call('RPUSH', KEYS[1], message)
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', KEYS[3], string.sub(ARGV[5], 1, -2) .. ',' .. seq .. ']\n' .. message)
return seq
