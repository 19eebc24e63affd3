-- Reply deadlines that are due, claimed: each is due again only after the claim, so one worker at a
-- time handles it (and another one, should that worker die before removing it).
-- KEYS: 1 the deadlines (sorted set: member → when it is due, Unix ms).
-- ARGV: 1 now (ms), 2 how long a claim holds (ms), 3 at most this many.
-- Returns the members claimed.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local claimed_until = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', claimed_until, member) end
return due
