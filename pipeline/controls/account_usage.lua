-- Usage budgets: account a session's cumulative usage report (session.usage) exactly once.
-- KEYS: 1 the session's last accounted values (hash tokens, ms), 2 the bot's window totals, 3 the
-- chat's, 4 (optional) the user's (hashes tokens, ms, grant_tokens, grant_ms).
-- ARGV: 1 reported cumulative tokens, 2 reported cumulative active ms, 3 the session hash's TTL (s),
-- 4 when the window totals expire (unix s).
-- Only what the report adds to the last accounted value is added (never negative), and the last
-- value is raised in the same step: a replayed or older report adds nothing, on any worker.
-- Returns {tokens added, ms added, bot tokens, bot ms, bot granted tokens, bot granted ms}.
local tokens, ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local last = redis.call('HMGET', KEYS[1], 'tokens', 'ms')
local last_tokens, last_ms = tonumber(last[1]) or 0, tonumber(last[2]) or 0
local add_tokens = math.max(0, tokens - last_tokens)
local add_ms = math.max(0, ms - last_ms)
if add_tokens > 0 or add_ms > 0 then
  redis.call('HSET', KEYS[1], 'tokens', math.max(tokens, last_tokens), 'ms', math.max(ms, last_ms))
  for i = 2, #KEYS do
    if add_tokens > 0 then redis.call('HINCRBY', KEYS[i], 'tokens', add_tokens) end
    if add_ms > 0 then redis.call('HINCRBY', KEYS[i], 'ms', add_ms) end
    redis.call('EXPIREAT', KEYS[i], ARGV[4])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
local bot = redis.call('HMGET', KEYS[2], 'tokens', 'ms', 'grant_tokens', 'grant_ms')
return {add_tokens, add_ms, tonumber(bot[1]) or 0, tonumber(bot[2]) or 0, tonumber(bot[3]) or 0, tonumber(bot[4]) or 0}
