-- KEYS[1] experience stream
-- ARGV[1] "MAXLEN" or "MINID", ARGV[2] threshold (entry count or entry id), ARGV[3] limit (1..1000)
-- returns {entries removed, id of the first retained entry or ""}: one bounded approximate XTRIM
-- (whole stream nodes, at most limit entries) and, atomically with it, the new first id that the
-- caller needs to pick gc candidates. Frees memory only, so it runs under maxmemory/OOM.
local MAX_LIMIT = 1000
local mode, limit = ARGV[1], tonumber(ARGV[3])
if (mode ~= 'MAXLEN' and mode ~= 'MINID') or not limit or limit < 1 or limit > MAX_LIMIT then
  return redis.error_reply('trim: bad mode/limit ' .. tostring(mode) .. '/' .. tostring(ARGV[3]))
end
local removed = redis.call('XTRIM', KEYS[1], mode, '~', ARGV[2], 'LIMIT', limit)
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first > 0 then
  return {removed, first[1][1]}
end
return {removed, ''}
