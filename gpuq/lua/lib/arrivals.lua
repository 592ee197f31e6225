-- lib/arrivals.lua: new tasks counted per model and minute, the forecast's history.

--@include args

-- Count `arrived` (model -> tasks) in the minute of now: one HINCRBY per model (60 s
-- buckets, 8 days kept: gpuq/keys.py ARRIVAL_BUCKET_MS, ARRIVAL_TTL_S; the TTL is set when
-- a model's field is new, not on every call). Read by gpuq/reaper/forecast.py.
local function count_arrivals(now, arrived)
  local bucket = arrivals_key(ms(math.floor(now / 60000)))
  for model, c in pairs(arrived) do
    if redis.call('HINCRBY', bucket, model, ms(c)) == c then redis.call('EXPIRE', bucket, '691200') end
  end
end
