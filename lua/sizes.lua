-- KEYS[1..n] blob keys (obs:<digest> or obs:<payload id>) of one shard
-- ARGV none
-- returns n replies in KEYS order: the key's size in bytes (STRLEN), -1 when it holds no string,
-- nil when it does not exist
-- Runs as the learner, read-only: the first of the receiver's two round trips for blobs. An agent
-- writes blobs of any size with its own SETNX (its ACL user may), so the receiver learns every
-- size first and then reads (GETRANGE 0..size-1) only the blobs within their limit and its
-- read's byte budget: a blob over its limit never leaves Redis, and one replaced meanwhile
-- (collected and stored again) still comes back no bigger than the size read here. Nothing is
-- copied into Lua (a GET here would copy every byte once more).
local out = {}
for i = 1, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind == 'none' then
    out[i] = false
  elseif kind ~= 'string' then
    out[i] = -1
  else
    out[i] = redis.call('STRLEN', KEYS[i])
  end
end
return out
