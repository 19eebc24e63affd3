-- Render, after the turn's output is in the broker: write the turn's end in one step.
-- KEYS: 1 conversation hash, 2 the session's turns, 3 held list, 4 the idle's handled marker, 5 the
-- ended turn's sent marker (4, 5: none is '' or a bare hash tag), 6 the in-flight hash (the
-- partition's; on a cluster the conversation's).
-- ARGV: 1 state TTL, 2 marker TTL, 3 session id, 4 cursor (the idle's event id, or ''), 5 mode
-- ('end': the turn is over; 'wait': the session waits on the chat), 6 n, then n field/value pairs to
-- set, then field names to delete.
-- 'end' sets the status idle only when no sent turn remains (those run next); it returns the number
-- of held messages to flush, or -1 when turns remain. The handled marker is 'flush' when a flush is
-- owed: a replay of this idle produces the flush again (a flush is harmless when nothing is held).
local function given(key) return key ~= '' and key:sub(1, 1) ~= '{' end  -- '' or a bare hash tag: none
local conv, turns, held, handled_key, sent_key, inflight = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ttl, marker_ttl, session, cursor, mode = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local n = tonumber(ARGV[6])
if n > 0 then redis.call('HSET', conv, unpack(ARGV, 7, 6 + 2 * n)) end
if #ARGV > 6 + 2 * n then redis.call('HDEL', conv, unpack(ARGV, 7 + 2 * n)) end
if cursor ~= '' then redis.call('HSET', conv, 'cursor', session .. '|' .. cursor) end
redis.call('EXPIRE', conv, ttl)
if given(sent_key) then redis.call('SET', sent_key, '1', 'EX', marker_ttl) end
local result = -1
if mode == 'wait' then
  redis.call('HDEL', inflight, session)
  result = 0
elseif redis.call('LLEN', turns) == 0 then
  redis.call('HSET', conv, 'status', 'idle')
  redis.call('HDEL', inflight, session)
  result = redis.call('LLEN', held)
end
if given(handled_key) then
  redis.call('SET', handled_key, (result > 0) and 'flush' or '1', 'EX', marker_ttl)
end
return result
