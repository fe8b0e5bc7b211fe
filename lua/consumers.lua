-- KEYS[1] experience stream
-- ARGV[1] consumer group, ARGV[2..] consumer names to remove if they have no pending entry (at most 100)
-- returns the names removed: each one is re-checked here with XPENDING, so a consumer that has read
-- entries since the caller listed it keeps them (XGROUP DELCONSUMER would drop its pending list).
local MAX_CONSUMERS = 100
if #ARGV - 1 > MAX_CONSUMERS then
  return redis.error_reply('consumers: ' .. (#ARGV - 1) .. ' names exceed ' .. MAX_CONSUMERS)
end
local removed = {}
for i = 2, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[i]) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    removed[#removed + 1] = ARGV[i]
  end
end
return removed
