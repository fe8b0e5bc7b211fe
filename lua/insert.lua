-- KEYS[1] experience stream, KEYS[2] obsref sorted set, KEYS[3] seen:<sender uuid>
-- KEYS[4..] obs:<digest> key of every observation the chunks reference (at most 256, each once); the
--   first u of them are uploaded by this call, the others must exist already
-- ARGV[1] batch seq (integer > 0), ARGV[2] seen ttl in seconds, ARGV[3] m = number of chunks (1..64),
-- ARGV[4] u = number of uploaded observations, ARGV[5..4+u] their encoded bytes (KEYS order)
-- ARGV[5+u..] m x (agent id, env index, digests csv, payload): the stream fields a, e, o, d
-- returns {"OK", id_1 .. id_m} | {"DUP", last seq} | {"MISSING", digest ...}; nothing is written
-- unless "OK" (all checks run before the first write, so an OOM refusal also writes nothing).
-- Uploaded observations are stored without a TTL: they are referenced from the moment they exist.
-- obsref score = ms * 1024 + min(seq, 1023) of the newest entry id referencing the digest.
local MAX_CHUNKS, MAX_OBS, SLOTS = 64, 256, 1024
local seq, ttl, m, u = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not seq or seq < 1 or not ttl or ttl < 1 or not m or m < 1 or m > MAX_CHUNKS then
  return redis.error_reply('insert: bad seq/ttl/chunk count ' .. tostring(ARGV[1]) .. '/' ..
    tostring(ARGV[2]) .. '/' .. tostring(ARGV[3]))
end
if #KEYS - 3 > MAX_OBS then
  return redis.error_reply('insert: ' .. (#KEYS - 3) .. ' obs keys exceed ' .. MAX_OBS)
end
if not u or u < 0 or u > #KEYS - 3 then
  return redis.error_reply('insert: bad upload count ' .. tostring(ARGV[4]))
end
local base = 4 + u
if #ARGV ~= base + 4 * m then
  return redis.error_reply('insert: expected ' .. (base + 4 * m) .. ' arguments, got ' .. #ARGV)
end

-- Reads and checks first: any refusal returns before the first write.
local last = redis.call('GET', KEYS[3])
if last and seq <= tonumber(last) then
  return {'DUP', last}
end
local known = {}
local missing = {'MISSING'}
for i = 4, #KEYS do
  local digest = string.match(KEYS[i], ':obs:(%x+)$')
  if not digest then
    return redis.error_reply('insert: KEYS[' .. i .. '] is not an obs key')
  end
  known[digest] = true
  if i > 3 + u and redis.call('EXISTS', KEYS[i]) == 0 then
    missing[#missing + 1] = digest
  end
end
if #missing > 1 then
  return missing
end
local refs = {}
for c = 1, m do
  local list = {}
  for digest in string.gmatch(ARGV[base + 4 * c - 1], '[^,]+') do
    if not known[digest] then
      return redis.error_reply('insert: chunk ' .. c .. ' references ' .. digest .. ' missing from KEYS')
    end
    list[#list + 1] = digest
  end
  refs[c] = list
end

for i = 1, u do
  redis.call('SET', KEYS[3 + i], ARGV[4 + i])
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
redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[2])
return result
