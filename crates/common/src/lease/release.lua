-- Deletes a lease's liveness key if, and only if, the caller still owns it.
-- KEYS[1]: lease key
-- ARGV[1]: epoch, ARGV[2]: owner
-- Returns 1 when deleted, 0 otherwise.
if redis.call('GET', KEYS[1]) == (ARGV[1] .. ':' .. ARGV[2]) then
  return redis.call('DEL', KEYS[1])
end
return 0
