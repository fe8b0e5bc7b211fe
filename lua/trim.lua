-- KEYS[1] experience stream
-- ARGV[1] consumer group, ARGV[2] "AGE", "CAP", "ACKED" or "OLDEST", ARGV[3] for AGE: the oldest
--   entry id young enough to keep; for CAP: the entry count to trim down to; ACKED and OLDEST
--   ignore it; ARGV[4] limit (1..1000)
-- returns {entries removed, unread entries among them, id of the first retained entry or ""}: one
-- bounded approximate XTRIM (whole stream nodes, at most limit entries), counted atomically with it.
-- AGE removes only entries the group has acked (below its last-delivered id and its oldest pending
-- one), so age never loses data. CAP first removes delivered entries, and only once no whole node of
-- them is left does it trim unread ones; those are counted exactly here ("unread": never delivered).
-- Memory pressure (the janitor, when Redis is near or at maxmemory): ACKED removes whole nodes of
-- acked entries (below the oldest pending one; the last-delivered one too once acked); OLDEST then
-- removes the oldest min(limit, length) entries exactly (an exact XTRIM MAXLEN: bounded by limit,
-- and it also takes acked entries left in a partial node), counting the unread ones among them.
-- Frees memory only (no denyoom command), so it runs under maxmemory/OOM.
local MAX_LIMIT = 1000
local MODES = {AGE = true, CAP = true, ACKED = true, OLDEST = true}
local group, mode, limit = ARGV[1], ARGV[2], tonumber(ARGV[4])
if not MODES[mode] or not limit or limit < 1 or limit > MAX_LIMIT or limit % 1 ~= 0 then
  return redis.error_reply('trim: bad mode/limit ' .. tostring(mode) .. '/' .. tostring(ARGV[4]))
end
local function parse(id)
  local ms, sq = string.match(id, '^(%d+)-(%d+)$')
  if not ms then
    return nil
  end
  return {tonumber(ms), tonumber(sq)}
end
local function older(a, b)
  local x, y = parse(a), parse(b)
  return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2])
end
local function first_id()
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if #first > 0 then
    return first[1][1]
  end
  return ''
end

local length = redis.call('XLEN', KEYS[1])
if length == 0 then
  return {0, 0, ''}
end
-- The group's last-delivered id (nil: no group, nothing was ever delivered).
local delivered = nil
for _, info in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local fields = {}
  for i = 1, #info, 2 do
    fields[info[i]] = info[i + 1]
  end
  if fields['name'] == group then
    delivered = fields['last-delivered-id']
  end
end
if delivered == '0-0' then
  delivered = nil
end

if mode == 'AGE' or mode == 'ACKED' then
  local keep = ARGV[3]
  if mode == 'AGE' and not parse(keep) then
    return redis.error_reply('trim: bad entry id ' .. tostring(keep))
  end
  if not delivered then
    return {0, 0, first_id()}
  end
  local pending = redis.call('XPENDING', KEYS[1], group)
  if mode == 'ACKED' then
    -- the last-delivered entry too (once acked): MINID keeps ids >= keep
    local last = parse(delivered)
    keep = last[2] < 2 ^ 53 and string.format('%d-%d', last[1], last[2] + 1) or delivered
  elseif older(delivered, keep) then
    keep = delivered
  end
  if pending[1] > 0 and older(pending[2], keep) then
    keep = pending[2]
  end
  local removed = redis.call('XTRIM', KEYS[1], 'MINID', '~', keep, 'LIMIT', limit)
  return {removed, 0, first_id()}
end

if mode == 'OLDEST' then
  local take = math.min(limit, length)
  local delivered_taken = 0
  if delivered then
    -- the delivered entries among the oldest take (the first ones, all ids up to delivered)
    delivered_taken = #redis.call('XRANGE', KEYS[1], '-', delivered, 'COUNT', take)
  end
  local removed = redis.call('XTRIM', KEYS[1], 'MAXLEN', length - take)
  return {removed, math.max(0, removed - delivered_taken), first_id()}
end

local cap = tonumber(ARGV[3])
if not cap or cap < 0 or cap % 1 ~= 0 then
  return redis.error_reply('trim: bad entry count ' .. tostring(ARGV[3]))
end
if length <= cap then
  return {0, 0, first_id()}
end
local delivered_before = 0
if delivered then
  -- Delivered entries first, no more than the cap asks for.
  local removed = redis.call('XTRIM', KEYS[1], 'MINID', '~', delivered, 'LIMIT', math.min(limit, length - cap))
  if removed > 0 then
    return {removed, 0, first_id()}
  end
  -- What is left at or below the last-delivered id fits in about one stream node (bounded by limit).
  delivered_before = #redis.call('XRANGE', KEYS[1], '-', delivered, 'COUNT', limit)
end
local removed = redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', cap, 'LIMIT', limit)
local unread = 0
if delivered_before < limit then
  unread = math.max(0, removed - delivered_before)
end
return {removed, unread, first_id()}
