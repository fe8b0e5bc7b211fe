-- KEYS[1] parameter meta hash (sr:{run.p}:meta), KEYS[2] staging string the caller uploaded the
-- new blob to (sr:{run.p}:staging:<publisher>), KEYS[3] blob key of the new version, KEYS[4] blob
-- key of the version the caller believes is current, KEYS[5] optional: the quota hash (overlap
-- production), whose grant moves to the new version, announced as "grant:<new>:<steps>"
-- ARGV[1] new version, ARGV[2] prev version (0 when nothing was published yet), ARGV[3] nbytes of
-- the new blob, ARGV[4] read piece size in bytes, ARGV[5] digest ("xxh3_128:<hex>"), ARGV[6]
-- codec, ARGV[7] spec (JSON), ARGV[8] learner iteration, ARGV[9] publish time (unix seconds),
-- ARGV[10] message, ARGV[11] grace in ms before the previous blob expires, ARGV[12] notify channel,
-- ARGV[13] with KEYS[5]: "" to carry the unclaimed rest of the live version's grant (0 steps when
-- the grant is another version's, or none), or the new version's grant in env steps (>= 0)
-- returns the new version, also for a re-sent call whose version and digest are already live (its
-- first reply was lost: the quota stays as that call and the claims since left it; a staged copy
-- is dropped). Error replies, nothing written: "VERSION ..." (not greater than the published
-- version, or a stale prev), "STAGING ..." (staged blob missing, wrong-sized, or recreated without
-- its TTL by a write after a Redis restart: upload it again), "ARGS ..." (a bad ARGV[13])
local new_version = tonumber(ARGV[1])
local prev_version = tonumber(ARGV[2])
local nbytes = tonumber(ARGV[3])
local grant_steps = nil  -- nil: carry the rest
if ARGV[13] and ARGV[13] ~= '' then
  grant_steps = tonumber(ARGV[13])
  if not grant_steps or grant_steps < 0 or grant_steps ~= math.floor(grant_steps) then
    return redis.error_reply('ARGS the grant must be empty or a whole number >= 0, got ' .. ARGV[13])
  end
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
  local left = grant_steps
  if not left then
    local grant = redis.call('HMGET', KEYS[5], 'version', 'left')
    left = 0
    if tonumber(grant[1] or '-1') == prev_version then
      left = math.max(0, tonumber(grant[2] or '0') or 0)
    end
  end
  redis.call('HSET', KEYS[5], 'version', ARGV[1], 'left', left)
  redis.call('PUBLISH', ARGV[12], 'grant:' .. ARGV[1] .. ':' .. left)
end
return new_version
