-- KEYS[1] inbox list, KEYS[2] experience stream, KEYS[3] obsref sorted set, KEYS[4] seen hash,
-- KEYS[5] pinned set, KEYS[6] dead-letter stream (all of one shard)
-- ARGV[1] most inbox items to move (1..256), ARGV[2] how long a sender's dedup window is kept after
--   its last batch (ms), ARGV[3] dead-letter stream MAXLEN (approximate), ARGV[4] byte budget: no
--   item is taken once the items taken hold this many bytes (the first always is), ARGV[5] the most
--   bytes one chunk's fields (a, e, o, d: its stream entry) may hold (1 MiB if not given): a batch
--   with a bigger chunk is set aside, an item too big to hold 64 such chunks unparsed (the
--   learner's receiver.max_payload_bytes, capped by insert.lua's bound: an agent may RPUSH any item)
-- returns {items taken, entries added, duplicate items, malformed items, items left in the inbox,
--   items whose storing failed (set aside with the error), pins left to score (inbox empty), items
--   naming a payload blob not bound to their batch (set aside, reason unbound_payload)}
-- Runs as the learner: moves the oldest batches agents queued with insert.lua into the stream, in
-- order, each batch once per (sender uuid, seq). An item that is not a well-formed batch (an agent
-- may push anything to the inbox) goes to the dead-letter stream with its reason, so nothing an
-- agent queues can stop the move or cost another agent's batch: every item taken is parsed and
-- checked before the first write (a chunk names at most 256 digests, each once, each of 32
-- lower-case hex digits, keys.py's grammar), and an error while one item is stored (pcall) sets
-- that item aside with the error and the move goes on. A learner key of the wrong type refuses
-- the whole call before anything is written. Runs under maxmemory (OOM) too, adding about what it
-- frees: its first write is the LTRIM that takes the items, which Redis allows under OOM, and once a script
-- has written Redis lets it finish (it cannot stop in the middle); so a learner restarted into a
-- Redis the agents filled can move their batches, and its janitor then trims and collects them.
-- Dedup window (per sender, the field of KEYS[4]): "<ms>:<floor>,<seq>,<seq>,...," - when its last
-- batch was stored, the highest floor sent and every seq stored at or above it. A seq in that set,
-- or below the floor (its fate was settled), is a duplicate; any other seq is stored, in any order,
-- so a batch refused before a later one was queued is still stored when resent. Seqs below a new
-- floor are forgotten: the set stays under 1024. Windows idle for ARGV[2] ms are dropped, two
-- random fields checked per call.
-- A chunk whose payload field is a blob id (insert.lua: the payload stored as a blob by the agent)
-- becomes an entry with field p (that id) instead of d; its blob is scored like an observation.
-- That id is bound to the batch: the first 32 hex digits of sha1("<uuid>:<seq>:<chunk index>")
-- (wire.py payload_id), so no agent can name a blob another agent stored (it sees the id in the
-- stream, never the uuid) or reuse one of its own under another seq: such an item is set aside
-- whole (reason unbound_payload) and nothing of it is trained on.
-- obsref score = ms * 1024 + min(seq, 1023) of the newest entry id referencing the digest. Once the
-- inbox is empty no batch references a pin: up to 1024 pins a call (the caller calls again while
-- pins are left, as while batches are) go into obsref (ZADD NX at the current time's score, so
-- one a retained entry references keeps its score), and gc collects
-- the blobs no retained entry references once the stream is past them (of an agent stopped after
-- storing a payload but before its insert, of a resend the dedup window dropped, of a batch set
-- aside): no pinned blob is left behind. Pins that are no digest are dropped (insert.lua's door
-- pins: "q:<uuid>:<seq>" of a queued batch, unpinned here when its batch is taken, and DUP's
-- "w:<uuid>:<time>").
local MAX_ITEMS, MAX_CHUNKS, MAX_REFS, WINDOW, SLOTS, PIN_PAGE = 256, 64, 256, 1024, 1024, 1024
-- an observation digest: keys.py DIGEST_CHARS lower-case hex digits, nothing else
local DIGEST = '^' .. string.rep('[0-9a-f]', 32) .. '$'
local count, ttl, dead_maxlen, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_entry = tonumber(ARGV[5] or '1048576')
if not count or count < 1 or count > MAX_ITEMS or count % 1 ~= 0 or not ttl or ttl < 1
    or not dead_maxlen or dead_maxlen < 1 or not budget or budget < 1 or not max_entry or max_entry < 1 then
  return redis.error_reply('move: bad item count/ttl/maxlen/budget/entry bytes ' .. tostring(ARGV[1]) .. '/' ..
    tostring(ARGV[2]) .. '/' .. tostring(ARGV[3]) .. '/' .. tostring(ARGV[4]) .. '/' .. tostring(ARGV[5]))
end
local items, bytes = {}, 0
while #items < count and bytes < budget do
  local item = redis.call('LINDEX', KEYS[1], #items)
  if not item then
    break
  end
  items[#items + 1] = item
  bytes = bytes + #item
end
for i, expected in pairs({[2] = 'stream', [3] = 'zset', [4] = 'hash', [5] = 'set', [6] = 'stream'}) do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= expected and kind ~= 'none' then
    return redis.error_reply('move: KEYS[' .. i .. '] holds a ' .. kind .. ', not a ' .. expected)
  end
end

-- netstrings "<len>:<bytes>" -> list of at most `limit` strings, or nil and why
local function split(item, limit)
  local out, pos, n = {}, 1, #item
  while pos <= n do
    if #out >= limit then
      return nil, 'more than ' .. limit .. ' fields'
    end
    local colon = string.find(item, ':', pos, true)
    local size = colon and colon - pos <= 9 and string.match(string.sub(item, pos, colon - 1), '^%d+$')
    if not size or colon + tonumber(size) > n then
      return nil, 'bad netstring at byte ' .. pos
    end
    out[#out + 1] = string.sub(item, colon + 1, colon + tonumber(size))
    pos = colon + tonumber(size) + 1
  end
  return out
end

local function integer(text)
  return string.match(text, '^%d+$') and #text <= 15 and tonumber(text)
end

-- the batch of one item, or nil and why
local function parse(item)
  local f, why = split(item, 4 + 4 * MAX_CHUNKS)
  if not f then
    return nil, why
  end
  if #f < 8 or (#f - 4) % 4 ~= 0 then
    return nil, #f .. ' fields'
  end
  local uuid, seq, floor, m = f[1], integer(f[2]), integer(f[3]), integer(f[4])
  if not string.match(uuid, '^%x+$') or #uuid > 64 then
    return nil, 'bad sender uuid'
  end
  if not seq or not floor or seq < 1 or floor < 1 or floor > seq or seq >= floor + WINDOW then
    return nil, 'bad seq/floor'
  end
  if m ~= (#f - 4) / 4 then
    return nil, 'chunk count ' .. tostring(f[4]) .. ' for ' .. (#f - 4) .. ' fields'
  end
  local chunks = {}
  for c = 1, m do
    local refs, seen_refs, text = {}, {}, f[4 * c + 3]
    if string.find(text, ',,', 1, true) or string.sub(text, 1, 1) == ',' or string.sub(text, -1) == ',' then
      return nil, 'empty digest in chunk ' .. c
    end
    for digest in string.gmatch(text, '[^,]+') do
      if not string.match(digest, DIGEST) then
        return nil, 'bad digest in chunk ' .. c .. ' (not 32 lower-case hex digits)'
      end
      if seen_refs[digest] then
        return nil, 'chunk ' .. c .. ' references ' .. digest .. ' more than once'
      end
      if #refs == MAX_REFS then
        return nil, 'chunk ' .. c .. ' references more than ' .. MAX_REFS .. ' digests'
      end
      seen_refs[digest] = true
      refs[#refs + 1] = digest
    end
    local payload = f[4 * c + 4]
    local size = #f[4 * c + 1] + #f[4 * c + 2] + #f[4 * c + 3] + #payload
    if size > max_entry then
      return nil, 'chunk ' .. c .. ' holds ' .. size .. ' bytes, over the limit of ' .. max_entry
    end
    local apart = string.match(payload, DIGEST) and payload or nil  -- anchored: a payload fails at once
    if apart and seen_refs[apart] then
      return nil, 'chunk ' .. c .. ' names its payload ' .. apart .. ' among its observations'
    end
    if apart and apart ~= string.sub(redis.sha1hex(uuid .. ':' .. string.format('%d', seq) .. ':' .. c), 1, 32) then
      return nil, 'chunk ' .. c .. ' names payload ' .. apart .. ', not the id bound to its batch', 'unbound_payload'
    end
    chunks[c] = {f[4 * c + 1], f[4 * c + 2], f[4 * c + 3], payload, refs, apart}
  end
  return {uuid = uuid, seq = seq, floor = floor, chunks = chunks}
end

-- Every item is parsed before the first write; a Lua error while parsing makes the item malformed.
local batches = {}
for i, item in ipairs(items) do
  local ok, batch, why, reason = false, nil, nil, nil
  if #item > MAX_CHUNKS * (max_entry + 64) + 1024 then  -- not split: a too big item is never copied
    batch, why = nil, 'item of ' .. #item .. ' bytes exceeds 64 chunks of ' .. max_entry .. ' bytes'
  else
    ok, batch, why, reason = pcall(parse, item)
    if not ok then
      batch, why = nil, 'parse error: ' .. tostring(batch)
    end
  end
  batches[i] = batch or {why = why, reason = reason or 'malformed_batch'}
end
if #items > 0 then
  redis.call('LTRIM', KEYS[1], #items, -1)
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- the stream entries of one batch, its obsref scores and its dedup window; returns entries added
local function store(batch)
  local state = redis.call('HGET', KEYS[4], batch.uuid)
  local known_floor, stored = 0, ','
  if state then
    local f, rest = string.match(state, '^%d+:(%d+)(,[%d,]*)$')
    if f then  -- written by this script only; anything else is treated as no window
      known_floor, stored = tonumber(f), rest
    end
  end
  if batch.seq < known_floor or string.find(stored, ',' .. string.format('%d', batch.seq) .. ',', 1, true) then
    return nil
  end
  local added = 0
  -- s: the chunk's origin "<sender tag>:<seq>:<index>:<count>" (wire.py), so the learner drops a
  -- chunk it consumed once that a failover (losing this move and this window) delivers again. The
  -- tag is the SHA1 of the sender's uuid, never the uuid: agents read the stream (XRANGE), and a
  -- uuid they read would let them queue batches under it and spoil its sender's dedup window
  local origin = redis.sha1hex(batch.uuid) .. ':' .. string.format('%d', batch.seq) .. ':'
  for c, chunk in ipairs(batch.chunks) do
    local id = redis.call('XADD', KEYS[2], '*', 'a', chunk[1], 'e', chunk[2], 'o', chunk[3],
      chunk[6] and 'p' or 'd', chunk[4], 's', origin .. c .. ':' .. #batch.chunks)
    added = added + 1
    if #chunk[5] > 0 or chunk[6] then
      local ms, sq = string.match(id, '^(%d+)-(%d+)$')
      local score = string.format('%.0f', tonumber(ms) * SLOTS + math.min(tonumber(sq), SLOTS - 1))
      local args = {}
      for _, digest in ipairs(chunk[5]) do
        args[#args + 1] = score
        args[#args + 1] = digest
      end
      if chunk[6] then
        args[#args + 1] = score
        args[#args + 1] = chunk[6]
      end
      redis.call('ZADD', KEYS[3], 'GT', unpack(args))
    end
  end
  if batch.floor > known_floor then
    local kept = {''}
    for s in string.gmatch(stored, '%d+') do
      if tonumber(s) >= batch.floor then
        kept[#kept + 1] = s
      end
    end
    kept[#kept + 1] = ''
    known_floor, stored = batch.floor, table.concat(kept, ',')
  end
  redis.call('HSET', KEYS[4], batch.uuid, string.format('%.0f:%d', now, known_floor) .. stored ..
    string.format('%d', batch.seq) .. ',')
  return added
end

local function set_aside(item, reason, detail)
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', dead_maxlen, '*', 'id', 'inbox', 'reason', reason,
    'detail', string.sub(detail, 1, 1000), 'f.raw', string.sub(item, 1, 1024))
end

local added, duplicates, malformed, failed, unbound = 0, 0, 0, 0, 0
for i, item in ipairs(items) do
  local batch = batches[i]
  if not batch.chunks then
    if batch.reason == 'unbound_payload' then
      unbound = unbound + 1
    else
      malformed = malformed + 1
    end
    set_aside(item, batch.reason, batch.why)
  else
    -- insert.lua's door pin of a queued batch: from now on the dedup window answers for it
    redis.call('SREM', KEYS[5], 'q:' .. batch.uuid .. ':' .. string.format('%d', batch.seq))
    local ok, result = pcall(store, batch)
    if not ok then
      -- redis.call raises a table {err = ...}; a Lua error is a string
      failed = failed + 1
      set_aside(item, 'script_error', type(result) == 'table' and tostring(result.err) or tostring(result))
    elseif result == nil then
      duplicates = duplicates + 1
    else
      added = added + result
    end
  end
end
local left, pins_left = redis.call('LLEN', KEYS[1]), 0
if left == 0 then
  local now_score = string.format('%.0f', now * SLOTS)
  local args = {}
  for _, digest in ipairs(redis.call('SPOP', KEYS[5], PIN_PAGE)) do
    if string.match(digest, DIGEST) then
      args[#args + 1] = now_score
      args[#args + 1] = digest
    end
  end
  if #args > 0 then
    redis.call('ZADD', KEYS[3], 'NX', unpack(args))
  end
  pins_left = redis.call('SCARD', KEYS[5])
end
local sample = redis.call('HRANDFIELD', KEYS[4], 2)
for _, sender in ipairs(type(sample) == 'table' and sample or {}) do
  local touched = tonumber(string.match(redis.call('HGET', KEYS[4], sender) or '', '^(%d+):') or '0')
  if touched + ttl < now then
    redis.call('HDEL', KEYS[4], sender)
  end
end
return {#items, added, duplicates, malformed, left, failed, pins_left, unbound}
