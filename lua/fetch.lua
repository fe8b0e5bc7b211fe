-- KEYS[1..n] blob keys (obs:<digest> or obs:<payload id>) of one shard, each at most once
-- ARGV[1] byte budget of the call, ARGV[2..n+1] the size limit of each key (bytes, KEYS order)
-- returns n replies in KEYS order: the blob's bytes; nil when the key does not exist; its size
-- (an integer >= 0) when that exceeds its limit (never fetched); -1 when the key holds no string;
-- -2 when the budget was spent before it (not fetched: ask again)
-- Runs as the learner, read-only. An agent writes blobs of any size with its own SETNX (its ACL
-- user may), so the learner receives only the blobs within their limit, their sizes checked in
-- the same round trip: a blob over its limit never leaves Redis. The bytes one call returns stay
-- under the budget, except a first blob bigger than the budget alone (within its limit), so
-- every call makes progress; once one blob does not fit, none after it is returned (KEYS order
-- is the caller's order of need).
local budget = tonumber(ARGV[1])
if not budget or budget < 0 or #ARGV ~= #KEYS + 1 then
  return redis.error_reply('fetch: bad budget ' .. tostring(ARGV[1]) .. ' or ' .. (#ARGV - 1) ..
    ' limits for ' .. #KEYS .. ' keys')
end
local out, taken, full = {}, 0, false
for i = 1, #KEYS do
  local limit = tonumber(ARGV[i + 1])
  if not limit or limit < 0 then
    return redis.error_reply('fetch: bad limit ' .. tostring(ARGV[i + 1]) .. ' of KEYS[' .. i .. ']')
  end
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind == 'none' then
    out[i] = false
  elseif kind ~= 'string' then
    out[i] = -1
  else
    local size = redis.call('STRLEN', KEYS[i])
    if size > limit then
      out[i] = size
    elseif full or (taken > 0 and taken + size > budget) then
      full = true
      out[i] = -2
    else
      out[i] = redis.call('GET', KEYS[i])
      taken = taken + size
    end
  end
end
return out
