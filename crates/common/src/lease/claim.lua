-- Sets the liveness key of a lease claimed in PostgreSQL.
-- KEYS[1]: lease key
-- ARGV[1]: epoch (the PostgreSQL fencing token), ARGV[2]: owner, ARGV[3]: TTL in ms
-- Returns 1 when set, 0 when a holder of an equal or newer epoch already owns the key.
-- Epochs only grow, so an older owner's late call can never take the key back.
local current = redis.call('GET', KEYS[1])
if current then
  local sep = string.find(current, ':', 1, true)
  local held_epoch = tonumber(string.sub(current, 1, sep - 1))
  if held_epoch >= tonumber(ARGV[1]) and current ~= (ARGV[1] .. ':' .. ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
return 1
