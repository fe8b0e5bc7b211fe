-- KEYS[1] parameter meta hash (sr:{run.p}:meta)
-- KEYS[2] staging string the caller uploaded the new blob to (sr:{run.p}:staging:<publisher>)
-- KEYS[3] blob key of the new version (sr:{run.p}:blob:<new>)
-- KEYS[4] blob key of the version the caller believes is current (sr:{run.p}:blob:<prev>)
-- ARGV[1] new version, ARGV[2] prev version (0 when nothing was published yet)
-- ARGV[3] nbytes of the new blob, ARGV[4] suggested read chunk size in bytes
-- ARGV[5] digest ("sha256:<hex>"), ARGV[6] codec, ARGV[7] spec (JSON)
-- ARGV[8] learner iteration, ARGV[9] publish time (unix seconds), ARGV[10] message
-- ARGV[11] grace in ms before the previous blob expires, ARGV[12] notify channel
-- returns the new version; error replies (nothing written): non-monotonic version, stale prev,
-- missing or wrong-sized staged blob
local new_version = tonumber(ARGV[1])
local prev_version = tonumber(ARGV[2])
local nbytes = tonumber(ARGV[3])

local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') or 0
if new_version <= current then
  return redis.error_reply('version ' .. ARGV[1] .. ' is not greater than the published version ' .. current)
end
if prev_version ~= current then
  return redis.error_reply('publisher out of sync: declared previous version ' .. ARGV[2]
    .. ' but the published version is ' .. current)
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('staged blob for version ' .. ARGV[1] .. ' does not exist')
end
local stored = redis.call('STRLEN', KEYS[2])
if stored ~= nbytes then
  return redis.error_reply('staged blob for version ' .. ARGV[1] .. ' has ' .. stored .. ' bytes, declared '
    .. ARGV[3])
end

-- RENAME moves the string without copying; the staging TTL (leak guard) is dropped once published.
redis.call('RENAME', KEYS[2], KEYS[3])
redis.call('PERSIST', KEYS[3])
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'nbytes', ARGV[3], 'chunk', ARGV[4], 'digest', ARGV[5],
  'codec', ARGV[6], 'spec', ARGV[7], 'iteration', ARGV[8], 'time', ARGV[9], 'message', ARGV[10])
-- Readers still downloading the previous version get the grace period to finish.
if prev_version > 0 then
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[11]))
end
redis.call('PUBLISH', ARGV[12], ARGV[1])
return new_version
