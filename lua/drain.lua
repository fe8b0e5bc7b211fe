-- KEYS[1] list the agents append records to, KEYS[2] stream the records are moved to
-- ARGV[1] most items to move (1..10000), ARGV[2] stream MAXLEN (approximate), ARGV[3] largest item
--   kept, in bytes
-- returns {items taken, items too large (dropped), items left in the list}
-- Runs as the learner: moves the oldest items of an append-only list into a stream it alone writes
-- (field "r": the item as the agent wrote it; the reader parses and checks it), so an agent, which
-- may only append to the list, cannot trim what was recorded. Reads first and writes last: under
-- maxmemory the first XADD is refused (OOM) before anything changed.
local count, maxlen, largest = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not count or count < 1 or count > 10000 or count % 1 ~= 0 or not maxlen or maxlen < 1
    or not largest or largest < 1 then
  return redis.error_reply('drain: bad count/maxlen/size ' .. tostring(ARGV[1]) .. '/' .. tostring(ARGV[2]) ..
    '/' .. tostring(ARGV[3]))
end
local items = redis.call('LRANGE', KEYS[1], 0, count - 1)
local dropped = 0
for _, item in ipairs(items) do
  if #item > largest then
    dropped = dropped + 1
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'r', item)
  end
end
if #items > 0 then
  redis.call('LTRIM', KEYS[1], #items, -1)
end
return {#items, dropped, redis.call('LLEN', KEYS[1])}
