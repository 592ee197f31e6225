-- lib/arrivals.lua: new tasks counted per model and minute, the forecast's history.

--@include args

-- Count `arrived` in the minute of now (its models listed in order, each also a key to its
-- tasks: a numeric loop, not pairs' C calls): one HINCRBY per model (60 s buckets, 8 days
-- kept: gpuq/keys.py ARRIVAL_BUCKET_MS, ARRIVAL_TTL_S; the TTL is set when a model's field is
-- new, not on every call). Read by gpuq/reaper/forecast.py. now: whole ms.
local function count_arrivals(now, arrived)
  local bucket = arrivals_key(ms((now - now % 60000) / 60000))
  for k = 1, #arrived do
    local model = arrived[k]
    local c = arrived[model]
    if redis.call('HINCRBY', bucket, model, ms(c)) == c then redis.call('EXPIRE', bucket, '691200') end
  end
end
