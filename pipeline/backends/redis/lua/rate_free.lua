-- ARGV: prefix, type, N, window (ms). How long until a claim of this rate-limited type may take a
-- job again (Backend.rate_free_at), in ms: 0 while fewer than N of its claims (rate:<type>) are
-- within the last window; else until the oldest of those that keep the window full leaves it (the
-- (count - N + 1)-th oldest, as the claim drops a record once it is a whole window old). Reads only.
local now = now_ms()
local key, n, window = P .. 'rate:' .. ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local since = '(' .. (now - window)
local count = redis.call('ZCOUNT', key, since, '+inf')
if count < n then return 0 end
local r = redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES', 'LIMIT', count - n, 1)
return math.max(tonumber(r[2]) + window - now, 0)
