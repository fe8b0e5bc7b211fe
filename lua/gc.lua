-- KEYS[1] experience stream, KEYS[2] obsref sorted set, KEYS[3] pinned set, KEYS[4..] obs:<digest>
--   candidate keys (at most 256)
-- ARGV none
-- returns {obs keys deleted, orphans among them}: those whose obsref score is below the score of the first
-- retained entry (all of them when the stream is empty), re-checked here so a concurrent insert
-- that re-referenced a digest keeps it. Obs keys whose digest is absent from obsref are deleted too:
-- insert.lua writes each obs key together with its pin and move.lua gives it its reference, so such a
-- key is an orphan (written around the script) that nothing can reach. A pinned digest is referenced
-- by a batch still in the inbox and is never deleted. Frees memory only, so it runs under OOM.
local MAX_OBS, SLOTS = 256, 1024
if #KEYS - 3 > MAX_OBS then
  return redis.error_reply('gc: ' .. (#KEYS - 3) .. ' candidate keys exceed ' .. MAX_OBS)
end
local limit = nil
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first > 0 then
  local ms, sq = string.match(first[1][1], '^(%d+)-(%d+)$')
  limit = tonumber(ms) * SLOTS + math.min(tonumber(sq), SLOTS - 1)
end
local deleted, orphans = 0, 0
for i = 4, #KEYS do
  if not string.match(KEYS[i], ':obs:(%x+)$') then
    return redis.error_reply('gc: KEYS[' .. i .. '] is not an obs key')
  end
end
for i = 4, #KEYS do
  local digest = string.match(KEYS[i], ':obs:(%x+)$')
  if redis.call('SISMEMBER', KEYS[3], digest) == 0 then
    local score = redis.call('ZSCORE', KEYS[2], digest)
    if not score then
      orphans = orphans + redis.call('DEL', KEYS[i])
    elseif limit == nil or tonumber(score) < limit then
      redis.call('DEL', KEYS[i])
      redis.call('ZREM', KEYS[2], digest)
      deleted = deleted + 1
    end
  end
end
return {deleted + orphans, orphans}
