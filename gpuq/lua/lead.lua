-- lead.lua: take, keep or give up the pool's reaper lock (one active reaper per pool).
--
-- KEYS[1]  pool key base (the lock is <base>reaper)
-- ARGV[1]  candidate's token (unique per reaper process)
-- ARGV[2]  lock TTL (ms); "0" releases the lock if the caller holds it
-- Returns  {0, 1} the caller holds the lock (taken or renewed) | {0, 0} another reaper does
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

if #ARGV ~= 2 then return {1, 0, 'expected 2 arguments'} end
local lock, token, ttl = K_REAPER_LOCK, ARGV[1], tonumber(ARGV[2])
-- checked inline: lead includes no helper group
if token == '' or not ttl or ttl < 0 or ttl > 1e12 or ttl ~= math.floor(ttl) then  -- nan fails the last
  return {1, 0, 'token must not be empty and ttl must be ms >= 0'}
end
local holder = redis.call('GET', lock)
if ttl == 0 then
  if holder == token then redis.call('DEL', lock) end
  return {0, 0}
end
if holder and holder ~= token then return {0, 0} end
redis.call('SET', lock, token, 'PX', ttl)
return {0, 1}
