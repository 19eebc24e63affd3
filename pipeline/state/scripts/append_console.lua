-- The console's delivery: number it in its chat, append it (capped), publish it once for every viewer.
-- At most once per outbound id.
-- KEYS: the chat's list, its sequence counter, the posted marker (none: '' or a bare hash tag).
-- ARGV: the message (a JSON object), cap, list TTL, marker TTL, the header's `[bot, chat]` as JSON,
-- the live channel (a channel is not a key: on a cluster it would not hash to the chat's slot).
-- The sequence number goes first into the object (`{"seq":N,` + the rest of it); the live message is
-- `[bot, chat, seq]\n<message>`.
local function given(key) return key ~= '' and key:sub(1, 1) ~= '{' end  -- '' or a bare hash tag: none
if given(KEYS[3]) and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[4]) then return 0 end
local seq = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
local message = '{"seq":' .. seq .. ',' .. string.sub(ARGV[1], 2)
redis.call('RPUSH', KEYS[1], message)
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[6], string.sub(ARGV[5], 1, -2) .. ',' .. seq .. ']\n' .. message)
return seq
