-- Dispatch, after a flush's turn was sent: drop the commands it carried.
-- KEYS: 1 held list, 2 conversation hash. ARGV: 1 how many (the oldest).
-- Returns how many stay held (also kept in the hash's `held`).
local held, conv = KEYS[1], KEYS[2]
redis.call('LPOP', held, tonumber(ARGV[1]))
local remaining = redis.call('LLEN', held)
redis.call('HSET', conv, 'held', remaining)
return remaining
