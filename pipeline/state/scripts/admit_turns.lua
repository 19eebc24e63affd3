-- Inbound rate limits: may each message start or join a turn? One call per batch and bot (every key
-- of one bot's limits shares its hash tag). Fixed windows: a counter per scope and window index.
-- ARGV[1]: the number of items. Per item, in order: ARGV n (its counters), seen TTL (ms), then n ×
-- (limit, window TTL in ms). KEYS per item: its seen marker, then n × (counter, notice marker).
-- A message over a limit is not counted in any of its windows (a flooding user does not use up the
-- chat's); the first message over a limit in a window sets that window's notice marker.
-- Returns per item {allowed 0|1, the counter over its limit (1..n, 0: none), notice 0|1, again 0|1}.
-- A message seen before (a replay) gets its first answer again, with again = 1, and changes nothing.
local items = tonumber(ARGV[1])
local a, k = 2, 1
local out = {}
for i = 1, items do
  local n, seen_ttl = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local seen = KEYS[k]
  local before = redis.call('GET', seen)
  if before then
    local allowed, over, notice = string.match(before, '^(%d):(%d+):(%d)$')
    out[i] = {tonumber(allowed), tonumber(over), tonumber(notice), 1}
  else
    local over = 0
    for j = 1, n do
      local limit = tonumber(ARGV[a + 2 * j])
      local count = tonumber(redis.call('GET', KEYS[k + 2 * j - 1]) or '0')
      if count >= limit then
        over = j
        break
      end
    end
    local notice = 0
    if over == 0 then
      for j = 1, n do
        local counter = KEYS[k + 2 * j - 1]
        if redis.call('INCR', counter) == 1 then
          redis.call('PEXPIRE', counter, tonumber(ARGV[a + 2 * j + 1]))
        end
      end
    elseif redis.call('SET', KEYS[k + 2 * over], '1', 'NX', 'PX', tonumber(ARGV[a + 2 * over + 1])) then
      notice = 1
    end
    local allowed = over == 0 and 1 or 0
    redis.call('SET', seen, allowed .. ':' .. over .. ':' .. notice, 'PX', seen_ttl)
    out[i] = {allowed, over, notice, 0}
  end
  a = a + 2 + 2 * n
  k = k + 1 + 2 * n
end
return out
