-- KEYS[1] parameter meta hash (sr:{run.p}:meta), KEYS[2] staging string the caller uploaded the
-- new blob to (sr:{run.p}:staging:<publisher>), KEYS[3] blob key of the new version
-- (sr:{run.p}:blob:<new>), KEYS[4] blob key of the version the caller believes is current
-- (sr:{run.p}:blob:<prev>), KEYS[5] optional: the production quota hash (sr:{run.p}:quota), whose
-- grant's unclaimed rest then moves to the new version (overlap production; 0 steps when the grant
-- is another version's, or none), plus ARGV[13] steps, announced after the version as
-- "grant:<new>:<steps>"
-- ARGV[1] new version, ARGV[2] prev version (0 when nothing was published yet)
-- ARGV[3] nbytes of the new blob, ARGV[4] read piece size in bytes (for the clients)
-- ARGV[5] digest ("xxh3_128:<hex>"), ARGV[6] codec, ARGV[7] spec (JSON)
-- ARGV[8] learner iteration, ARGV[9] publish time (unix seconds), ARGV[10] message
-- ARGV[11] grace in ms before the previous blob expires, ARGV[12] notify channel
-- ARGV[13] with KEYS[5]: env steps granted on top of the rest (the learner's next batch but one);
-- then an overshoot (a negative rest: agents claim whole flushes) is taken off them; 0: the rest alone
-- returns the new version, also for a re-sent call whose version and digest are already live (its
-- first reply was lost: the quota stays as that call and the claims since left it; a staged copy
-- is dropped). Error replies, nothing written: "VERSION ..." (not greater than the published
-- version, or a stale prev),
-- "STAGING ..." (staged blob missing, wrong-sized, or recreated without its TTL by a write after a
-- Redis restart: upload it again), "ARGS ..." (ARGV[13] not a whole number >= 0)
local new_version = tonumber(ARGV[1])
local prev_version = tonumber(ARGV[2])
local nbytes = tonumber(ARGV[3])
local ahead = tonumber(ARGV[13] or '0')
if not ahead or ahead < 0 or ahead ~= math.floor(ahead) then
  return redis.error_reply('ARGS grant ahead must be a whole number >= 0, got ' .. tostring(ARGV[13]))
end

local live = redis.call('HMGET', KEYS[1], 'version', 'digest')
local current = tonumber(live[1] or '0') or 0
if new_version == current and live[2] == ARGV[5] then
  redis.call('DEL', KEYS[2])  -- a re-sent upload staged the blob again
  return new_version
end
if new_version <= current then
  return redis.error_reply('VERSION version ' .. ARGV[1] .. ' is not greater than the published version '
    .. current)
end
if prev_version ~= current then
  return redis.error_reply('VERSION publisher out of sync: declared previous version ' .. ARGV[2]
    .. ' but the published version is ' .. current)
end
-- The publisher SETs the first piece with a TTL and SETRANGEs the rest; a piece written after a
-- restart lost that key recreates it without a TTL (and zero-filled below the piece).
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
  return redis.error_reply('STAGING staged blob for version ' .. ARGV[1] .. ' does not exist')
end
if ttl == -1 then
  return redis.error_reply('STAGING staged blob for version ' .. ARGV[1] .. ' has no TTL: it was recreated'
    .. ' mid-upload')
end
local stored = redis.call('STRLEN', KEYS[2])
if stored ~= nbytes then
  return redis.error_reply('STAGING staged blob for version ' .. ARGV[1] .. ' has ' .. stored
    .. ' bytes, declared ' .. ARGV[3])
end

-- HSET goes first: it is the only write Redis refuses when out of memory, and a refusal must
-- leave nothing half done.
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'nbytes', ARGV[3], 'piece', ARGV[4], 'digest', ARGV[5],
  'codec', ARGV[6], 'spec', ARGV[7], 'iteration', ARGV[8], 'time', ARGV[9], 'message', ARGV[10])
-- RENAME moves the string without copying; the staging TTL (leak guard) is dropped once published.
redis.call('RENAME', KEYS[2], KEYS[3])
redis.call('PERSIST', KEYS[3])
-- Readers still downloading the previous version get the grace period to finish.
if prev_version > 0 then
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[11]))
end
redis.call('PUBLISH', ARGV[12], ARGV[1])
if KEYS[5] then
  -- In the same script as the version swap: no claim lands between the read and the write.
  local grant = redis.call('HMGET', KEYS[5], 'version', 'left')
  local rest = 0
  if tonumber(grant[1] or '-1') == prev_version then
    rest = tonumber(grant[2] or '0') or 0
  end
  local left = math.max(0, rest)
  if ahead > 0 then
    left = rest + ahead  -- below 0 while the overshoot is larger: agents wait
  end
  redis.call('HSET', KEYS[5], 'version', ARGV[1], 'left', left)
  redis.call('PUBLISH', ARGV[12], 'grant:' .. ARGV[1] .. ':' .. math.max(0, left))
end
return new_version
