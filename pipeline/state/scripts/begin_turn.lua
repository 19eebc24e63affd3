-- Dispatch, one user turn: decide and record it in one step.
-- KEYS: 1 conversation hash, 2 held list, 3 the session's turns, 4 this turn's record, 5 the
-- in-flight hash (the partition's; on a cluster the conversation's), 6 this turn's sent marker, 7 conversation → session, 8… the markers
-- of the inbound messages the turn carries.
-- ARGV: 1 turn id, 2 held entry, 3 mode (merge | queue | interrupt | flush | resume), 4 turn record,
-- 5 in-flight entry, 6 state TTL, 7 marker TTL, 8 a channel ('' for none) and 9 a status note to
-- PUBLISH on it when the turn is newly held, or started by a flush (the console's live notes), 10 a
-- session just created after a 'no_session' ('' for none): mapped here unless one is mapped already,
-- 11 '1' when the caller can take messages out of this turn (a merged turn that says which content
-- blocks are whose), 12 a status note to PUBLISH on the channel when the turn starts other than by
-- a flush ('' for none; the console's note on messages ingest merged).
-- Returns {decision, session id, cursor, interrupt, taken}: 'failed' (its send failed and the chat was
-- told instead; `taken` is the notice's kind: a replay tells it again, never sends; not for 'resume',
-- an operator's replay), 'done' (sent before, or every message it
-- carries already started, held or merged: a replay), 'partial' (some of its messages, not all,
-- already taken by another turn: a merged turn replayed after a crash, its batch split otherwise
-- than the first time; `taken` says which, '1' or '0' per message in order; nothing written: begin
-- again without them), 'resume' (a
-- send cut short: look it up in history first), 'held' (busy: kept for the turn's end), 'hold' (busy,
-- and no held entry was given: call again with one; most turns never need it), 'behind' (idle, but
-- messages held before it still wait for their flush: kept after them; flush now), 'busy' (a flush while
-- another turn runs), 'no_session' (create one, then call again), 'start' (recorded; send it now).
local conv, held, turns, turn_key, inflight, sent_key, c2s = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local turn_id, held_entry, mode, turn_json, stream_json = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttl, marker_ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local note_channel, note = ARGV[8] or '', ARGV[9] or ''
local new_session = ARGV[10] or ''
local can_cut, start_note = ARGV[11] == '1', ARGV[12] or ''

local function mark_inbound()
  for i = 8, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', marker_ttl) end
end

local sent = redis.call('GET', sent_key)
local status = redis.call('HGET', conv, 'status')
local session = redis.call('HGET', conv, 'session_id') or redis.call('GET', c2s)
local cursor = redis.call('HGET', conv, 'cursor') or ''
if sent == '1' then
  mark_inbound()
  return {'done', session or '', cursor, '0'}
end
if sent and string.sub(sent, 1, 7) == 'failed:' and mode ~= 'resume' then
  mark_inbound()
  return {'failed', session or '', cursor, '0', string.sub(sent, 8)}
end
if sent == 'sending' and mode ~= 'resume' then return {'resume', session or '', cursor, '0'} end
-- Every message of this turn already marked: a copy of messages that were started, held or merged
-- into another turn under another id (a platform's redelivery that passed ingest before the first
-- copy got here). A flush carries held messages, marked when they were held: it is not a copy.
-- A turn that can be cut checks every marker (one EXISTS per message, as marking them takes); any
-- other stops at the first one not set.
if mode ~= 'flush' and mode ~= 'resume' and #KEYS >= 8 then
  local flags, marked = {}, 0
  for i = 8, #KEYS do
    local set = redis.call('EXISTS', KEYS[i])
    if set == 0 and not can_cut then break end
    marked = marked + set
    flags[#flags + 1] = set == 1 and '1' or '0'
  end
  if marked == #KEYS - 7 then return {'done', session or '', cursor, '0'} end
  if can_cut and marked > 0 then return {'partial', session or '', cursor, '0', table.concat(flags)} end
end
local busy = status and status ~= 'idle' and session
if busy and mode == 'flush' then return {'busy', session, cursor, '0'} end
-- Keep this turn for later: once (a replay finds it held), and only with its command. A turn that
-- carries inbound markers was marked when it was held, so a replay of it returned 'done' above:
-- only a turn without any is looked for in the list. (Reading the whole list on every hold cost a
-- chat's flood O(held) each, all of it inside Redis, which stalled every other chat's calls.)
local function hold(decision)
  local prefix = turn_id .. '\n'
  local items = #KEYS >= 8 and {} or redis.call('LRANGE', held, 0, -1)
  for _, item in ipairs(items) do
    if string.sub(item, 1, #prefix) == prefix then
      mark_inbound()
      return {decision, session or '', cursor, '0'}
    end
  end
  if held_entry == '' then return {'hold', session or '', cursor, '0'} end
  redis.call('RPUSH', held, held_entry)
  redis.call('EXPIRE', held, ttl)
  redis.call('HINCRBY', conv, 'held', 1)
  mark_inbound()
  if note_channel ~= '' then redis.call('PUBLISH', note_channel, note) end
  return {decision, session or '', cursor, '0'}
end
if mode == 'merge' or mode == 'queue' then
  if busy then return hold('held') end
  -- Idle, but messages held during the last turn still wait for its flush: starting this one now
  -- would overtake them. It goes behind them, and the caller flushes at once.
  if redis.call('LLEN', held) > 0 then return hold('behind') end
end
if not session then
  if new_session == '' then return {'no_session', '', cursor, '0'} end
  session = new_session
  redis.call('SET', c2s, session, 'EX', ttl)
end
redis.call('SET', sent_key, 'sending', 'EX', marker_ttl)
redis.call('HSET', conv, 'status', 'running', 'session_id', session, 'turn', turn_json, 'interrupted', '0', 'pending', '[]')
redis.call('HDEL', conv, 'last_message', 'last_message_id')
redis.call('EXPIRE', conv, ttl)
redis.call('HSET', inflight, session, stream_json)
local listed = false
for _, id in ipairs(redis.call('LRANGE', turns, 0, -1)) do
  if id == turn_id then listed = true break end
end
if not listed then redis.call('RPUSH', turns, turn_id) end
redis.call('EXPIRE', turns, ttl)
redis.call('SET', turn_key, turn_json, 'EX', ttl)
mark_inbound()
if note_channel ~= '' and mode == 'flush' then
  redis.call('PUBLISH', note_channel, note)
elseif note_channel ~= '' and start_note ~= '' then
  redis.call('PUBLISH', note_channel, start_note)
end
return {'start', session, cursor, (busy and mode == 'interrupt') and '1' or '0'}
