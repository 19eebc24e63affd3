-- Ingest's batch step: de-duplicate inbound messages and keep the group-context window, in order.
-- Per item i: KEYS[2i-1] its marker, KEYS[2i] its chat's window; ARGV[2+2i] flags (w: return the
-- window as it was before, p: push ARGV[3+2i] onto it, m: set the marker now).
-- ARGV[1..3]: marker TTL, window size, window TTL. Returns per item {0} (a duplicate) or {1, window…}.
local marker_ttl, size, window_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
-- Windows pushed onto: trimmed and their TTL renewed once, after the loop (a busy chat's messages
-- share one call). A read in between takes only the newest `size` entries, so it sees what a
-- trimmed window would hold.
local pushed = {}
for i = 1, #KEYS / 2 do
  local marker, window = KEYS[2 * i - 1], KEYS[2 * i]
  local flags, entry = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
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
      redis.call('LPUSH', window, entry)
      pushed[window] = true
    end
    out[i] = reply
  end
end
for window in pairs(pushed) do
  redis.call('LTRIM', window, 0, size - 1)
  redis.call('EXPIRE', window, window_ttl)
end
return out
