-- KEYS[1] experience stream, KEYS[2] obsref sorted set, KEYS[3] seen:<sender uuid>
-- KEYS[4..] obs:<digest> key of every observation the chunks reference (at most 256, each once); the
--   first u of them are uploaded by this call (each must be referenced by a chunk), the others must
--   exist already
-- ARGV[1] batch seq (integer > 0), ARGV[2] floor: the sender's lowest seq whose fate it does not know
--   yet (floor <= seq < floor + 1024), ARGV[3] seen ttl in seconds, ARGV[4] m = number of chunks
--   (1..64), ARGV[5] u = number of uploaded observations, ARGV[6..5+u] their encoded bytes (KEYS order)
-- ARGV[6+u..] m x (agent id, env index, digests csv, payload): the stream fields a, e, o, d
-- returns {"OK", id_1 .. id_m} | {"DUP", seq} | {"MISSING", digest ...}; nothing is written
-- unless "OK" (all checks run before the first write, so an OOM refusal also writes nothing).
-- Dedup window: seen holds "<floor>,<seq>,<seq>,...," - the highest floor sent and every seq stored
-- at or above it. A seq in that set, or below the floor (its fate was settled), answers DUP; any
-- other seq may be stored, in any order, so a batch refused before a later one was stored is still
-- stored when resent. Stored seqs below a new floor are forgotten: the set stays under 1024.
-- Uploaded observations are stored without a TTL: they are referenced from the moment they exist.
-- They are stored with SETNX, never SET: the agent user may not overwrite an observation (acl.py).
-- obsref score = ms * 1024 + min(seq, 1023) of the newest entry id referencing the digest.
local MAX_CHUNKS, MAX_OBS, SLOTS, WINDOW = 64, 256, 1024, 1024
local seq, floor, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local m, u = tonumber(ARGV[4]), tonumber(ARGV[5])
if not seq or seq < 1 or seq % 1 ~= 0 or not floor or floor < 1 or floor % 1 ~= 0 or floor > seq
    or seq >= floor + WINDOW
    or not ttl or ttl < 1 or not m or m < 1 or m > MAX_CHUNKS then
  return redis.error_reply('insert: bad seq/floor/ttl/chunk count ' .. tostring(ARGV[1]) .. '/' ..
    tostring(ARGV[2]) .. '/' .. tostring(ARGV[3]) .. '/' .. tostring(ARGV[4]))
end
if #KEYS - 3 > MAX_OBS then
  return redis.error_reply('insert: ' .. (#KEYS - 3) .. ' obs keys exceed ' .. MAX_OBS)
end
if not u or u < 0 or u > #KEYS - 3 then
  return redis.error_reply('insert: bad upload count ' .. tostring(ARGV[5]))
end
local base = 5 + u
if #ARGV ~= base + 4 * m then
  return redis.error_reply('insert: expected ' .. (base + 4 * m) .. ' arguments, got ' .. #ARGV)
end

-- Reads and checks first: any refusal returns before the first write.
local state = redis.call('GET', KEYS[3])
local known_floor, stored = 0, ','
if state then
  local f, rest = string.match(state, '^(%d+)(,[%d,]*)$')
  if not f then
    return redis.error_reply('insert: malformed seen state ' .. string.sub(state, 1, 40))
  end
  known_floor, stored = tonumber(f), rest
end
if seq < known_floor or string.find(stored, ',' .. string.format('%d', seq) .. ',', 1, true) then
  return {'DUP', ARGV[1]}
end
local known = {}
local missing = {'MISSING'}
for i = 4, #KEYS do
  local digest = string.match(KEYS[i], ':obs:(%x+)$')
  if not digest then
    return redis.error_reply('insert: KEYS[' .. i .. '] is not an obs key')
  end
  if known[digest] then
    return redis.error_reply('insert: obs key ' .. digest .. ' listed twice')
  end
  known[digest] = i
  if i > 3 + u and redis.call('EXISTS', KEYS[i]) == 0 then
    missing[#missing + 1] = digest
  end
end
if #missing > 1 then
  return missing
end
local refs, referenced = {}, {}
for c = 1, m do
  local list = {}
  for digest in string.gmatch(ARGV[base + 4 * c - 1], '[^,]+') do
    if not known[digest] then
      return redis.error_reply('insert: chunk ' .. c .. ' references ' .. digest .. ' missing from KEYS')
    end
    list[#list + 1] = digest
    referenced[digest] = true
  end
  refs[c] = list
end
for digest, i in pairs(known) do
  -- an upload no chunk references would never enter obsref, so gc would never see it
  if i <= 3 + u and not referenced[digest] then
    return redis.error_reply('insert: uploaded observation ' .. digest .. ' is referenced by no chunk')
  end
end

for i = 1, u do
  redis.call('SETNX', KEYS[3 + i], ARGV[5 + i])
end
local result = {'OK'}
for c = 1, m do
  local f = base + 4 * c - 4
  local id = redis.call('XADD', KEYS[1], '*', 'a', ARGV[f + 1], 'e', ARGV[f + 2], 'o', ARGV[f + 3], 'd', ARGV[f + 4])
  result[#result + 1] = id
  if #refs[c] > 0 then
    local ms, sq = string.match(id, '^(%d+)-(%d+)$')
    local score = string.format('%.0f', tonumber(ms) * SLOTS + math.min(tonumber(sq), SLOTS - 1))
    local args = {}
    for _, digest in ipairs(refs[c]) do
      args[#args + 1] = score
      args[#args + 1] = digest
    end
    redis.call('ZADD', KEYS[2], 'GT', unpack(args))
  end
end
if floor > known_floor then
  local kept = {''}
  for s in string.gmatch(stored, '%d+') do
    if tonumber(s) >= floor then
      kept[#kept + 1] = s
    end
  end
  kept[#kept + 1] = ''
  known_floor, stored = floor, table.concat(kept, ',')
end
redis.call('SET', KEYS[3], string.format('%d', known_floor) .. stored .. string.format('%d', seq) .. ',', 'EX', ARGV[3])
return result
