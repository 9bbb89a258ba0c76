-- Extends a lease's liveness key if, and only if, the caller still owns it.
-- KEYS[1]: lease key
-- ARGV[1]: epoch, ARGV[2]: owner, ARGV[3]: TTL in ms
-- Returns 1 when extended, 0 when another owner holds it, -1 when the key is gone
-- (expired, or Redis lost its keys).
local current = redis.call('GET', KEYS[1])
if not current then
  return -1
end
if current ~= (ARGV[1] .. ':' .. ARGV[2]) then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
