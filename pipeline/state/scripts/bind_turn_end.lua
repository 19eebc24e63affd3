-- Render, an idle arrives: was it handled before, the conversation's state, and the turn it ends.
-- The session runs user turns in the order it accepted them and ends each with an idle, so an idle
-- ends the oldest turn sent and not yet ended; the binding is kept, so a replayed idle binds the same
-- turn (not whichever turn is "current" by then).
-- KEYS: 1 conversation hash, 2 the session's turns, 3 this idle's binding (none without an event id),
-- 4 this idle's handled marker (none without an event id).
-- ARGV: 1 the prefix of turn records, 2 marker TTL, 3 '1' to bind a turn (an idle that ends one).
-- Returns {handled marker or false, the hash as a flat list, turn id or false, turn record or false}.
local function given(key) return key ~= '' and key:sub(1, 1) ~= '{' end  -- '' or a bare hash tag: none
local handled = false
if given(KEYS[4]) then handled = redis.call('GET', KEYS[4]) end
local state = redis.call('HGETALL', KEYS[1])
if handled or ARGV[3] ~= '1' then return {handled, state, false, false} end
local turn_id = false
if given(KEYS[3]) then turn_id = redis.call('GET', KEYS[3]) end
if not turn_id then
  turn_id = redis.call('LPOP', KEYS[2])
  if turn_id and given(KEYS[3]) then redis.call('SET', KEYS[3], turn_id, 'EX', ARGV[2]) end
end
local turn = false
if turn_id then turn = redis.call('GET', ARGV[1] .. turn_id) end
return {false, state, turn_id, turn}
