-- KEYS[1] inbox list of the shard, KEYS[2] pinned set of the shard, KEYS[3] seen hash of the shard
-- KEYS[4..] obs:<digest> key of every blob (observation or payload) the chunks reference (at most
--   256, each once); the first u of them are uploaded by this call (each must be referenced by a
--   chunk), the others must exist already
-- ARGV[1] sender uuid (1..64 hex digits), ARGV[2] batch seq (integer > 0), ARGV[3] floor: the
--   sender's lowest seq whose fate it does not know yet (floor <= seq < floor + 1024), ARGV[4] m =
--   number of chunks (1..64), ARGV[5] u = number of uploaded observations, ARGV[6..5+u] their encoded
--   bytes (KEYS order)
-- ARGV[6+u..] m x (agent id, env index, digests csv, payload): the stream fields a, e, o, d; a
--   chunk's digests are comma-separated, each at most once (so at most 256), each one of KEYS; a
--   payload may be a digest instead (see below)
-- returns {"OK"} (queued) | {"DUP"} (queued or stored before: this copy is dropped at the door) |
-- {"MISSING", digest ...}; nothing is written unless "OK" (all checks run before the first write,
-- so an OOM refusal also writes nothing), but for DUP's one pin (below).
-- Door: a queued batch is pinned as "q:<uuid>:<seq>" (move.lua unpins it when it takes the batch),
-- and move.lua's dedup window of the uuid (KEYS[3], read only: the agent knows its own uuid only)
-- names every seq it stored at or above the floor: a resend of either (a lost reply, a replica that
-- did not acknowledge) is answered DUP and costs the inbox nothing. DUP pins one new member
-- "w:<uuid>:<time>" (no digest: move.lua drops it with the pins) so that the write propagates and
-- a WAIT after it on this connection covers the batch stored before.
-- A chunk's fields (a, e, o, d) hold at most MAX_INLINE bytes (1 MiB; inbox.py MAX_INLINE_BYTES):
-- a fixed bound, not an argument, since the agent chooses every argument. It stops honest mistakes
-- early; the learner's own bound (move.lua ARGV[5], from its config) is the one an agent cannot
-- pass around (it may RPUSH to the inbox by hand). Bigger payloads travel as blobs (below).
-- A payload that is a blob id (the digest grammar; a payload proper begins with "SRC1") references
-- the blob holding it, one of KEYS and none of the chunk's observations: the agent stores big
-- payloads under an id bound to the batch (move.lua checks it) with its own SETNX, after pinning
-- the id with SADD, so their bytes never pass through Lua.
-- Runs as the agent, whose ACL user may only append to the inbox: it queues the batch there as one
-- item (netstrings "<len>:<bytes>" of uuid, seq, floor, m and the 4m fields) and pins every digest
-- the chunks reference, so gc keeps those observations until the learner's move.lua has moved the
-- batch into the stream (and deduplicated it by (uuid, seq): a copy queued around the door is
-- dropped there). Uploads are stored with SETNX, never SET: the agent user may not
-- overwrite an observation (acl.py).
local MAX_CHUNKS, MAX_OBS, WINDOW, MAX_INLINE = 64, 256, 1024, 1048576
local O = 3  -- KEYS[O + i]: the i-th obs key
-- an observation digest: keys.py DIGEST_CHARS lower-case hex digits, nothing else
local DIGEST = '^' .. string.rep('[0-9a-f]', 32) .. '$'
local uuid, seq, floor = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local m, u = tonumber(ARGV[4]), tonumber(ARGV[5])
if not string.match(uuid, '^%x+$') or #uuid > 64
    or not seq or seq < 1 or seq % 1 ~= 0 or not floor or floor < 1 or floor % 1 ~= 0 or floor > seq
    or seq >= floor + WINDOW or not m or m < 1 or m > MAX_CHUNKS or m % 1 ~= 0 then
  return redis.error_reply('insert: bad uuid/seq/floor/chunk count ' .. string.sub(tostring(ARGV[1]), 1, 64) ..
    '/' .. tostring(ARGV[2]) .. '/' .. tostring(ARGV[3]) .. '/' .. tostring(ARGV[4]))
end
if #KEYS - O > MAX_OBS then
  return redis.error_reply('insert: ' .. (#KEYS - O) .. ' obs keys exceed ' .. MAX_OBS)
end
if not u or u < 0 or u > #KEYS - O or u % 1 ~= 0 then
  return redis.error_reply('insert: bad upload count ' .. tostring(ARGV[5]))
end
local base = 5 + u
if #ARGV ~= base + 4 * m then
  return redis.error_reply('insert: expected ' .. (base + 4 * m) .. ' arguments, got ' .. #ARGV)
end

-- The door (see above): a copy of a batch queued or stored before writes nothing of it.
local marker = 'q:' .. uuid .. ':' .. string.format('%d', seq)
local dup = redis.call('SISMEMBER', KEYS[2], marker) == 1
if not dup then
  local f, stored = string.match(redis.call('HGET', KEYS[3], uuid) or '', '^%d+:(%d+)(,[%d,]*)$')
  dup = f ~= nil and (seq < tonumber(f) or string.find(stored, ',' .. string.format('%d', seq) .. ',', 1, true) ~= nil)
end
if dup then
  local now = redis.call('TIME')
  redis.call('SADD', KEYS[2], 'w:' .. uuid .. ':' .. now[1] .. '.' .. now[2])
  return {'DUP'}
end

-- Reads and checks first: any refusal returns before the first write.
local known = {}
local missing = {'MISSING'}
for i = O + 1, #KEYS do
  local digest = string.match(KEYS[i], ':obs:([^:]*)$')
  if not digest or not string.match(digest, DIGEST) then
    return redis.error_reply('insert: KEYS[' .. i .. '] is not an obs key with a digest of 32 lower-case hex digits')
  end
  if known[digest] then
    return redis.error_reply('insert: obs key ' .. digest .. ' listed twice')
  end
  known[digest] = i
  if i > O + u and redis.call('EXISTS', KEYS[i]) == 0 then
    missing[#missing + 1] = digest
  end
end
if #missing > 1 then
  return missing
end
local referenced = {}
for c = 1, m do
  local refs = ARGV[base + 4 * c - 1]
  if string.find(refs, ',,', 1, true) or string.sub(refs, 1, 1) == ',' or string.sub(refs, -1) == ',' then
    return redis.error_reply('insert: chunk ' .. c .. ' has an empty digest in its list')
  end
  local in_chunk = {}
  for digest in string.gmatch(refs, '[^,]+') do
    if not known[digest] then
      return redis.error_reply('insert: chunk ' .. c .. ' references ' .. string.sub(digest, 1, 64) ..
        ' missing from KEYS')
    end
    if in_chunk[digest] then
      return redis.error_reply('insert: chunk ' .. c .. ' references ' .. digest .. ' more than once')
    end
    in_chunk[digest] = true
    referenced[digest] = true
  end
  local payload = ARGV[base + 4 * c]
  local size = #ARGV[base + 4 * c - 3] + #ARGV[base + 4 * c - 2] + #refs + #payload
  if size > MAX_INLINE then
    return redis.error_reply('insert: chunk ' .. c .. ' holds ' .. size .. ' bytes, over ' .. MAX_INLINE)
  end
  if string.match(payload, DIGEST) then  -- anchored: a payload proper fails at its first byte
    if not known[payload] then
      return redis.error_reply('insert: chunk ' .. c .. ' references payload ' .. payload .. ' missing from KEYS')
    end
    if in_chunk[payload] then
      return redis.error_reply('insert: chunk ' .. c .. ' names its payload ' .. payload .. ' among its observations')
    end
    referenced[payload] = true
  end
end
local pins = {}
for digest, i in pairs(known) do
  -- an upload no chunk references would never enter obsref, so gc would never see it
  if i <= O + u and not referenced[digest] then
    return redis.error_reply('insert: uploaded observation ' .. digest .. ' is referenced by no chunk')
  end
  if referenced[digest] then
    pins[#pins + 1] = digest
  end
end

local parts = {}
local function put(value)  -- no '<len>:' .. value: a payload is copied once, by table.concat
  parts[#parts + 1] = #value .. ':'
  parts[#parts + 1] = value
end
put(uuid)
put(ARGV[2])
put(ARGV[3])
put(ARGV[4])
for f = base + 1, #ARGV do
  put(ARGV[f])
end
for i = 1, u do
  redis.call('SETNX', KEYS[O + i], ARGV[5 + i])
end
pins[#pins + 1] = marker
redis.call('SADD', KEYS[2], unpack(pins))
redis.call('RPUSH', KEYS[1], table.concat(parts))
return {'OK'}
