-- KEYS[1] the run's lease (string: its owner's value, a random token and who holds it)
-- ARGV[1] the caller's value (what its SET NX PX wrote), ARGV[2] "RENEW" or "RELEASE",
--   ARGV[3] for RENEW: the new time to live in ms (1..3600000); RELEASE ignores it
-- returns 1 renewed or released (the caller owns the lease), 2 renewed by taking it again (it had
-- expired, or Redis came back without it, and nobody else took it), 0 another holder owns it:
-- nothing was written. One key, so it works on a Redis Cluster (the key's hash tag is the run's).
-- The compare and the write are one step: a lease never expires between the owner's check and its
-- PEXPIRE or DEL, so an owner can only renew or release its own lease, never another's.
local value, mode, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if mode ~= 'RENEW' and mode ~= 'RELEASE' then
  return redis.error_reply('lease: bad mode ' .. tostring(mode))
end
if value == nil or value == '' then
  return redis.error_reply('lease: empty owner value')
end
if mode == 'RENEW' and (not ttl or ttl < 1 or ttl > 3600000 or ttl % 1 ~= 0) then
  return redis.error_reply('lease: bad ttl_ms ' .. tostring(ARGV[3]))
end
local held = redis.call('GET', KEYS[1])
if mode == 'RELEASE' then
  if held == value then
    redis.call('DEL', KEYS[1])
    return 1
  end
  return 0
end
if held == value then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
if held == false then
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  return 2
end
return 0
