-- KEYS[1] experience stream, KEYS[2] obsref sorted set, KEYS[3] seen:<sender uuid>
-- KEYS[4..] obs:<digest> key of every observation the chunks reference (at most 256, each once)
-- ARGV[1] batch seq (integer > 0), ARGV[2] seen ttl in seconds, ARGV[3] m = number of chunks (1..64)
-- ARGV[4..] m x (agent id, env index, digests csv, payload): the stream fields a, e, o, d
-- returns {"OK", id_1 .. id_m} | {"DUP", last seq} | {"MISSING", digest ...}; nothing is written
-- unless "OK". obsref score = ms * 1024 + min(seq, 1023) of the newest entry id referencing it.
local MAX_CHUNKS, MAX_OBS, SLOTS = 64, 256, 1024
local seq, ttl, m = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not seq or seq < 1 or not ttl or ttl < 1 or not m or m < 1 or m > MAX_CHUNKS then
  return redis.error_reply('insert: bad seq/ttl/chunk count ' .. tostring(ARGV[1]) .. '/' ..
    tostring(ARGV[2]) .. '/' .. tostring(ARGV[3]))
end
if #ARGV ~= 3 + 4 * m then
  return redis.error_reply('insert: expected ' .. (3 + 4 * m) .. ' arguments, got ' .. #ARGV)
end
if #KEYS - 3 > MAX_OBS then
  return redis.error_reply('insert: ' .. (#KEYS - 3) .. ' obs keys exceed ' .. MAX_OBS)
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
  if redis.call('EXISTS', KEYS[i]) == 0 then
    missing[#missing + 1] = digest
  end
end
if #missing > 1 then
  return missing
end
local refs = {}
for c = 1, m do
  local list = {}
  for digest in string.gmatch(ARGV[4 * c + 2], '[^,]+') do
    if not known[digest] then
      return redis.error_reply('insert: chunk ' .. c .. ' references ' .. digest .. ' missing from KEYS')
    end
    list[#list + 1] = digest
  end
  refs[c] = list
end

local result = {'OK'}
for c = 1, m do
  local base = 4 * c
  local id = redis.call('XADD', KEYS[1], '*', 'a', ARGV[base], 'e', ARGV[base + 1],
    'o', ARGV[base + 2], 'd', ARGV[base + 3])
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
for i = 4, #KEYS do
  redis.call('PERSIST', KEYS[i])
end
redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[2])
return result
