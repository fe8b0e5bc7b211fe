-- KEYS[1] parameter meta hash (sr:{run.p}:meta)
-- KEYS[2] production quota hash (sr:{run.p}:quota): version, left
-- ARGV[1] the parameter version the agent acts with
-- ARGV[2] env steps the agent is about to produce (one flush: flush_steps x its envs), >= 1
-- returns {status, granted steps, live version}: "OK" (produce ARGV[2] steps: the quota of the
-- live version had steps left; it may go below zero by less than one claim), "STALE" (a newer
-- version is live: load it, then claim again), "WAIT" (no steps left for the live version, or the
-- learner has not granted any yet: wait for the next version). Two reads and at most one write.
local version = tonumber(ARGV[1])
local steps = tonumber(ARGV[2])
if not version or not steps or steps < 1 or steps % 1 ~= 0 then
  return redis.error_reply('ARGS claim needs a version and a positive integer step count')
end
local live = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') or 0
if version ~= live then
  return {'STALE', 0, live}
end
local quota = redis.call('HMGET', KEYS[2], 'version', 'left')
if tonumber(quota[1] or '-1') ~= live or (tonumber(quota[2] or '0') or 0) <= 0 then
  return {'WAIT', 0, live}
end
redis.call('HINCRBY', KEYS[2], 'left', -steps)
return {'OK', steps, live}
