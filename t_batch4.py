import time, json, gpuq, sys
q = gpuq.Queue.from_url("redis://127.0.0.1:6452/0", pool="b1")
def show(ts):
    for t in ts:
        f = q._fields(t.id)
        print("  ", t.id[-6:], f.get("state"), "att", f.get("attempt"), repr(f.get("error"))[:150], (f.get("result") or "")[:60])
def mk(n, **kw):
    blk = q.enqueue("one", {"sleep": 0.8}, model="bge", vram_gb=4, est_s=1, priority="P0")
    time.sleep(0.3)
    return [q.enqueue("emb", {"i": i, "sleep": 3}, model="bge", vram_gb=4, est_s=3, priority="P0", **(kw if i == 1 else {})) for i in range(n)]
print("cancel one mid-batch")
ts = mk(3); time.sleep(1.5)
print("  cancel ->", q.cancel(ts[1].id))
for t in ts: q.wait(t.id, timeout=30)
show(ts)
print("deadline one mid-batch")
ts = mk(3, deadline_s=2.0)
for t in ts: q.wait(t.id, timeout=30)
show(ts)
print("cancel all mid-batch")
ts = mk(3); time.sleep(1.5)
t0=time.time()
for t in ts: q.cancel(t.id)
time.sleep(1.0)
blk = q.enqueue("one", {"sleep": 0}, model="bge", vram_gb=4, est_s=0.1, priority="P0")
blk.result(timeout=10); print("  next task after cancel-all served in", round(time.time()-t0,2))
show(ts)
