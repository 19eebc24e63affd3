-- Ingest's batch step: de-duplicate inbound messages and keep the group-context window, in order.
-- ARGV[1..3]: marker TTL, window size, window TTL. Then per item, in order: its flags (w: return the
-- window as it was before, p: push the entry onto it, m: set the marker now, c: the push is within
-- a quota), its entry, and with c: the chat's limit and window (ms), the user's limit and window (ms)
-- (a limit 0: none). KEYS per item: its marker, its chat's window, and with c: the chat's and the
-- user's counters of their current windows (all in the conversation's hash slot).
-- Returns per item {0} (a duplicate), {1, window…}, or {2, window…} (over its quota: not pushed).
local marker_ttl, size, window_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
-- Windows pushed onto: trimmed and their TTL renewed once, after the loop (a busy chat's messages
-- share one call). A read in between takes only the newest `size` entries, so it sees what a
-- trimmed window would hold.
local pushed = {}

local function under(counter, limit)
  return limit <= 0 or tonumber(redis.call('GET', counter) or '0') < limit
end

local function count(counter, limit, ms)
  if limit > 0 and redis.call('INCR', counter) == 1 then
    redis.call('PEXPIRE', counter, ms)
  end
end

local k, a, i = 1, 4, 0
while k <= #KEYS do
  i = i + 1
  local marker, window = KEYS[k], KEYS[k + 1]
  local flags, entry = ARGV[a], ARGV[a + 1]
  local quota = string.find(flags, 'c', 1, true)
  local chat, user, chat_limit, chat_ms, user_limit, user_ms
  if quota then
    chat, user = KEYS[k + 2], KEYS[k + 3]
    chat_limit, chat_ms = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    user_limit, user_ms = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    k, a = k + 4, a + 6
  else
    k, a = k + 2, a + 2
  end
  local fresh
  if string.find(flags, 'm', 1, true) then
    fresh = redis.call('SET', marker, '1', 'NX', 'EX', marker_ttl) -- false when the marker exists
  else
    fresh = redis.call('EXISTS', marker) == 0
  end
  if not fresh then
    out[i] = {0}
  else
    local reply = {1}
    if string.find(flags, 'w', 1, true) then
      for _, v in ipairs(redis.call('LRANGE', window, 0, size - 1)) do reply[#reply + 1] = v end
    end
    if string.find(flags, 'p', 1, true) then
      if quota and not (under(chat, chat_limit) and under(user, user_limit)) then
        reply[1] = 2
      else
        if quota then
          count(chat, chat_limit, chat_ms)
          count(user, user_limit, user_ms)
        end
        redis.call('LPUSH', window, entry)
        pushed[window] = true
      end
    end
    out[i] = reply
  end
end
for window in pairs(pushed) do
  redis.call('LTRIM', window, 0, size - 1)
  redis.call('EXPIRE', window, window_ttl)
end
return out
