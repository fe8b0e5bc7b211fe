-- KEYS[1] experience stream, KEYS[2] obsref sorted set, KEYS[3] pinned set, KEYS[4..] obs:<digest>
--   candidate keys of the same shard (at most 256)
-- ARGV none
-- returns {obs keys deleted, orphans among them, candidates skipped, candidates spared, junk keys
-- among the deleted}. Deleted:
-- those whose obsref score is below the score of the first retained entry (all of them when the
-- stream is empty), re-checked here so a concurrent insert that re-referenced a digest keeps it, and
-- counted only when DEL removed a key (their obsref member goes either way). Obs keys whose digest is
-- absent from obsref are deleted too: a blob is written only while pinned (insert.lua writes an
-- observation together with its pin; an agent pins a payload with SADD before its own SETNX of it)
-- and move.lua scores every pin in obsref, so such a key is an orphan (written around the scripts)
-- that nothing can reach. Junk: this shard's obs: keys whose suffix is no digest of keys.py's
-- grammar (an agent may SETNX any obs: suffix): no script writes, pins or references such a key,
-- so nothing can reach it and it is deleted. Skipped: keys that are not this shard's obs: keys,
-- left alone and counted, never a refusal of the call. Spared: candidates kept because they are pinned (a batch still in the inbox references
-- them) or referenced by a retained entry, which the caller pages past. Frees memory only, so it
-- runs under OOM.
local MAX_OBS, SLOTS = 256, 1024
-- an observation digest: keys.py DIGEST_CHARS lower-case hex digits, nothing else
local DIGEST = '^' .. string.rep('[0-9a-f]', 32) .. '$'
if #KEYS - 3 > MAX_OBS then
  return redis.error_reply('gc: ' .. (#KEYS - 3) .. ' candidate keys exceed ' .. MAX_OBS)
end
local prefix = string.match(KEYS[1], '^(.*:)exp$')
if not prefix then
  return redis.error_reply('gc: KEYS[1] ' .. string.sub(KEYS[1], 1, 200) .. ' is not an experience stream')
end
prefix = prefix .. 'obs:'
local limit = nil
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first > 0 then
  local ms, sq = string.match(first[1][1], '^(%d+)-(%d+)$')
  limit = tonumber(ms) * SLOTS + math.min(tonumber(sq), SLOTS - 1)
end
local deleted, orphans, skipped, spared, junk = 0, 0, 0, 0, 0
for i = 4, #KEYS do
  local key = KEYS[i]
  local digest = string.sub(key, 1, #prefix) == prefix and string.sub(key, #prefix + 1) or nil
  if not digest then
    skipped = skipped + 1
  elseif not string.match(digest, DIGEST) then
    junk = junk + redis.call('DEL', key)
  elseif redis.call('SISMEMBER', KEYS[3], digest) == 1 then
    spared = spared + 1
  else
    local score = redis.call('ZSCORE', KEYS[2], digest)
    if not score then
      orphans = orphans + redis.call('DEL', key)
    elseif limit == nil or tonumber(score) < limit then
      deleted = deleted + redis.call('DEL', key)
      redis.call('ZREM', KEYS[2], digest)
    else
      spared = spared + 1
    end
  end
end
return {deleted + orphans + junk, orphans, skipped, spared, junk}
