"""Every Lua script called with hostile ARGV on the real server (hypothesis).

Each example copies a pool holding real state (queued tasks with deadlines, a running task
asked to yield for a waiting P0, a retry waiting out its backoff, a succeeded task, an idle
and a busy worker, a reservation, the reaper lock, catalog and fairness entries) into a fresh
pool, calls one script's function (FCALL of gpuq's library, with the pool's key base) as
gpuq.scripts does, and
checks that the reply is one the script's header promises: never a script error (a Lua
runtime error such as "attempt to compare", or a command's error), and on a coded error the
pool exactly as it was (every key's DUMP and expiry).

Two kinds of ARGV per script: arbitrary lists (wrong counts, huge and tiny numbers, nan,
inf, non-UTF-8 bytes, Lua pattern characters, texts past the limits), and a valid call with
one or two fields mutated, which gets past the first checks into the scripts' deeper paths.
The examples are derandomized, so CI runs the same cases every time; GPUQ_FUZZ_EXAMPLES=N
runs N of each kind per script instead (by hand, for long runs).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any

import pytest
import redis
from helpers import T0, claim, enqueue_specs, heartbeat, spec
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpuq import Config, Queue, worker_record
from gpuq.claims import BATCHED_FIELDS, TASK_FIELDS
from gpuq.embedded import EmbeddedServer
from gpuq.errors import GpuqError
from gpuq.functions import already_loaded, library
from gpuq.keys import Keys
from gpuq.replies import Code, raise_for
from gpuq.schedule import fire_call
from gpuq.scripts import SCRIPT_NAMES, Call, Calls, ClaimRequest
from gpuq.stream import emit_call, follow_call, progress_call
from gpuq.task import MAX_PAYLOAD_BYTES
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence

EXAMPLES = int(os.environ.get("GPUQ_FUZZ_EXAMPLES", "0"))
MUTATED = EXAMPLES or 60   # per script: a valid call with fields mutated
ARBITRARY = EXAMPLES or 20  # per script: arbitrary ARGV
NOW = T0 + 10_000
RAN: dict[str, int] = {}  # examples run per test kind (printed at the end with -s)

# ---------------------------------------------------------------- the pool's state


def register(client: redis.Redis, keys: Keys, worker_id: str, total_gb: float, concurrency: int,
             handover: tuple[int, int, int] | None = None) -> None:
    gpu = GpuInfo(f"gpu{total_gb:g}", f"uuid-{worker_id}", total_gb, None, "declared")
    fields = worker_record.identity(worker_id, gpu, 4.0, concurrency, "0123", "host", 1, handover)
    Presence(client, keys, worker_id).register(fields, 30_000)


def build_state(q: Queue) -> None:
    """The state every example starts from (virtual clock T0; ids and tokens fixed)."""
    r, k = q.redis, q.keys
    register(r, k, "w1", 80, 2)
    register(r, k, "w2", 24, 1, handover=(2000, 5, 30_000))
    for w in ("w1", "w2"):
        heartbeat(q, w, [], now_ms=T0)
    enqueue_specs(q, [spec(task_id="run1", model="A", vram_gb=10, priority=3, est_s=50)], T0)
    assert claim(q, "w1", 60, now_ms=T0 + 1) is not None  # token 1
    enqueue_specs(q, [spec(task_id="del1", model="B", vram_gb=5, priority=2)], T0 + 2)
    got = claim(q, "w2", 20, now_ms=T0 + 2)  # token 2
    assert got is not None and q.scripts.run(q.calls.fail("del1", 2, "boom", now_ms=T0 + 3)) == "delayed"
    enqueue_specs(q, [spec(task_id="done1", model="A", vram_gb=5)], T0 + 4)
    got = claim(q, "w2", 20, now_ms=T0 + 4)  # token 3
    assert got is not None
    q.scripts.run(q.calls.ack("done1", 3, '"ok"', now_ms=T0 + 5))
    enqueue_specs(q, [spec(task_id="run2", model="A", vram_gb=5, priority=2, est_s=9)], T0 + 5)
    assert claim(q, "w1", 60, loaded=[("A", 8.0)], now_ms=T0 + 5) is not None  # token 4
    assert q.scripts.run(q.calls.wait("run2")) == "running"  # a waiter: its end pushes done
    # held tasks: kid1 waits for run1 and run2 (its end settles kid1), kid2 for kid1; later is
    # due at T0 + 20 s; a schedule s1 every minute from T0
    enqueue_specs(q, [spec(task_id="kid1", model="A", after=["run1", "run2"]),
                      spec(task_id="kid2", model="B", after=["kid1"], after_any_outcome=True),
                      spec(task_id="later", model="A", delay_s=20, priority=0)], T0 + 5)
    r.hset(k.schedules, "s1", json.dumps({"every_ms": 60_000, "anchor_ms": T0, "task": {
        "handler": "h", "payload": "{}", "model": "A", "vram_gb": 2, "priority": 1,
        "preemptible": True, "tenant": "default", "max_attempts": 2}}))
    # tenancy on: the tenant of run1 and run2 capped (both charged), the tasks below ordered
    assert q.scripts.run(q.calls.tenant("set", "default", "2", "3", "-")) == ""
    enqueue_specs(q, [
        spec(task_id="q1", model="A", vram_gb=10, priority=2, deadline_s=60, est_s=5),
        spec(task_id="q2", model="B", vram_gb=70, priority=0, deadline_s=5, est_s=1),
        spec(task_id="q3", model="C", vram_gb=50, priority=1, est_s=2),
        spec(task_id="q4", model="A", vram_gb=2, priority=3, deadline_s=3600, tenant="t2"),
    ], T0 + 6)
    reply = q.scripts.run(q.calls.preempt("q2", "w1", "run1", 1, reserve_ms=5000, grace_ms=1000,
                                          now_ms=T0 + 7))
    assert reply == ("yield", "")
    assert claim(q, "w2", 0, now_ms=T0 + 8) is None  # idle, with no room
    r.hset(k.catalog_model("A"), mapping={"loads": 2, "total_load_s": 30})
    r.hset(k.fairness, mapping={"1": 5, "2": 3})
    # learned run times: "h A" as a worker's heartbeat sends them; a malformed one for model B
    assert q.scripts.run(q.calls.learn([("h", "A", 0.005)])) == 1
    r.hset(k.runtimes, "h B", "nan x 1")
    # tasks no live worker holds, parked (park.lua); p3 queued since: a call with a live
    # worker of 396 GB parks p3 and puts p2 back
    enqueue_specs(q, [spec(task_id="p1", model="D", vram_gb=500, deadline_s=600),
                      spec(task_id="p2", model="D", vram_gb=300)], T0 + 7)
    assert q.scripts.run(q.calls.park([(76.0, 1)], now_ms=T0 + 7)) == (2, 0, 0)
    enqueue_specs(q, [spec(task_id="p3", model="D", vram_gb=450)], T0 + 7)
    assert q.scripts.run(q.calls.lead("r1"))
    # the lock's TTL runs on the server's clock: a slow run must not see it lapse between the
    # snapshots a test compares (copies of this pool keep its absolute expiry)
    r.pexpire(k.reaper_lock, 3_600_000)


# ARGV that reach each script's main path in that state (several per script: its branches)
def valid_calls(c: Calls) -> dict[str, list[Call[Any]]]:
    t = NOW
    return {
        "enqueue": [c.enqueue([spec(task_id="n1", deadline_s=10)], now_ms=t),
                    c.enqueue([spec(task_id="n2", model="B"), spec(task_id="n3", priority=0)],
                              check_fit=True, now_ms=t),
                    # est_s "": the learned mean (model A), the fallback (B: malformed)
                    c.enqueue([spec(task_id="n4", est_s=None, deadline_s=10),
                               spec(task_id="n5", model="B", est_s=None)], now_ms=t),
                    c.enqueue([spec(task_id="n6", est_s=2.5)], now_ms=t)],
        "claim": [c.claim(ClaimRequest("w1", 50, 10, 2, (("A", 8.0), ("B", 4.0))), now_ms=t),
                  c.claim(ClaimRequest("w3", 100, 0, 1, (), "01"), now_ms=t),
                  c.claim(ClaimRequest("w2", 20, 0, 1), now_ms=T0 + 10_000_000)],
        # run2 runs on w1 (model A held): its batch takes q1 (same handler, model and level)
        "claim_batch": [c.claim_batch("w1", {"id": "run2", "token": "4"}, 50, 8, True, 4, now_ms=t),
                        c.claim_batch("w1", {"id": "run1", "token": "1"}, 0, 8, False, 2, now_ms=t)],
        # run1 was claimed cold (its SLA pending), run2 warm (decided at its claim)
        "began": [c.began("run1", 1, now_ms=t), c.began("run2", 4, now_ms=t),
                  c.began("q1", 9, now_ms=t)],
        "heartbeat": [c.heartbeat("w1", [("run1", 1), ("q1", 9), ("run2", 4)], now_ms=t)],
        "ack": [c.ack("run1", 1, '{"out":[1,2]}', now_ms=t), c.ack("run2", 4, "null", now_ms=t)],
        "fail": [c.fail("run1", 1, "boom", now_ms=t), c.fail("run1", 1, "bad", retry=False, now_ms=t)],
        "requeue": [c.requeue("run1", 1, "yielded", preempted="yielded", checkpoint='{"s":1}', now_ms=t),
                    c.requeue("run1", 1, "lost", consume=True, now_ms=t),
                    c.requeue("del1", None, "operator", now_ms=t),
                    c.requeue("done1", None, "operator", now_ms=t)],
        "cancel": [c.cancel("q2", now_ms=t), c.cancel("run1", now_ms=t), c.cancel("del1", now_ms=t)],
        "reap": [c.reap(now_ms=T0 + 10_000_000), c.reap(limit=1, now_ms=t)],
        "expire": [c.expire(horizon_ms=60_000, now_ms=T0 + 3_000_000),
                   c.expire(limit=2, offset=1, now_ms=t)],
        "park": [c.park([(76.0, 1), (396.0, 1)], now_ms=t), c.park([(396.0, 2)], limit=1, now_ms=t),
                 c.park([], now_ms=t)],
        "preempt": [c.preempt("q3", "w1", "run1", 1, reserve_ms=5000, grace_ms=None, now_ms=t),
                    c.preempt("q3", "w1", "run2", 4, reserve_ms=5000, grace_ms=500, now_ms=T0 + 8)],
        "retire": [c.retire("w2", now_ms=t), c.retire("w1", now_ms=T0)],
        "lead": [c.lead("r1"), c.lead("r2"), c.lead("r1", release=True)],
        "learn": [c.learn([("h", "A", 2.5), ("h", "B", 0.1), ("g", "C", 7)]), c.learn([("h", "A", 0)])],
        "tenant": [c.tenant("set", "default", "1", "-", "40"), c.tenant("set", "t2", "0.5", "1", "-"),
                   c.tenant("remove", "default"), c.tenant("require", "1")],
        "emit": [emit_call("run1", 1, 0, '{"t":"hi"}', c.config), emit_call("run2", 4, 7, '"x"', c.config)],
        "progress": [progress_call("run1", 1, 0.5, "half"), progress_call("run2", 4, 1.0, "")],
        "follow": [follow_call("run1"), follow_call("done1"), follow_call("q1")],
        "wait": [c.wait("run1"), c.wait("done1"), c.wait("q1")],
        "fire": [fire_call(c, "s1", T0 + 60_000, now_ms=T0 + 61_000),
                 fire_call(c, "s1", T0 + 60_000, skip=True, now_ms=T0 + 61_000),
                 fire_call(c, "s1", T0, now_ms=t)],
    }


# ---------------------------------------------------------------- hostile values

OVER = MAX_PAYLOAD_BYTES + 1
SPECIAL = [
    "", "0", "-0", "1", "-1", "2", "3", "4", "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e309",
    "-1e309", "1e308", "-1e308", "4.9e-324", "1e-320", "0x10", "0x", "0x7fffffffffffffff", "1e13",
    "1e15", "1e16", "9007199254740993", "-9223372036854775809", "18446744073709551616", "1.5",
    "0.5", "-0.5", " 1", "1 ", "+1", "1e", ".", "%", "%d", "%s", "%%", "[", "]", "(", ")", ".*",
    "%b()", "^", "$", "%z", "[%w_]", "(.-)", "%1", "\x00", "{", "}", ",", " ", "a b", "a,b", "{x}",
    "running", "queued", "delayed", "succeeded", "yield", "null", "{}", "[]", '""', '{"a":', "1e5",
    "q1", "q2", "q3", "q4", "run1", "del1", "done1", "nope", "w1", "w2", "w3", "r1", "A", "B", "P0",
    "0123", "01", "5", "9", "60000", str(T0), str(NOW), str(T0 + 10_000_000), "yielded", "stopped",
]
BIG = [
    b"x" * OVER,                                   # past the 1 MiB limit, not JSON
    b'"' + b"a" * (OVER - 1) + b'"',               # JSON, one byte past the limit
    b'"' + b"a" * (MAX_PAYLOAD_BYTES - 2) + b'"',  # JSON of exactly the limit
    b"[" * 5000 + b"]" * 5000,                     # deeper than cjson nests
    b"n" * 201,                                    # a name past 200 bytes
    b"%" * 300,
]
NON_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x00b", b"\x80abc"]


def as_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates: bytes that are not UTF-8


VALUE = st.one_of(
    st.sampled_from(SPECIAL).map(as_bytes),
    st.sampled_from(SPECIAL).map(as_bytes),  # twice: the hand-picked values are the likeliest bugs
    st.integers(-(2 ** 70), 2 ** 70).map(lambda n: str(n).encode()),
    st.floats().map(lambda x: repr(x).encode()),
    st.binary(max_size=24),
    st.text(max_size=24).map(as_bytes),
    st.sampled_from(NON_UTF8),
    st.sampled_from(BIG),
)


def arbitrary_argv() -> st.SearchStrategy[list[bytes]]:
    return st.lists(VALUE, max_size=24)


def mutations(base: Sequence[str]) -> st.SearchStrategy[list[bytes]]:
    """The valid ARGV with one or two edits: a field replaced, dropped or added, or the list
    cut short."""
    argv = [as_bytes(a) for a in base]

    @st.composite
    def mutate(draw: st.DrawFn) -> list[bytes]:
        out = list(argv)
        for _ in range(draw(st.integers(1, 2))):
            op = draw(st.sampled_from(["replace", "replace", "replace", "drop", "insert", "cut"]))
            i = draw(st.integers(0, max(0, len(out) - 1)))
            if op == "replace" and out:
                out[i] = draw(VALUE)
            elif op == "drop" and out:
                del out[i]
            elif op == "insert":
                out.insert(draw(st.integers(0, len(out))), draw(VALUE))
            else:
                out = out[:i]
        return out

    return mutate()


# ---------------------------------------------------------------- replies

def due(x: Any) -> bool:
    """A claim reply's due_at: epoch ms, or empty."""
    return x == b"" or (isinstance(x, bytes) and x.isdigit())


def is_count(x: Any) -> bool:
    return isinstance(x, int) and x >= 0


def ok_reply(name: str, r: list[Any], argv: Sequence[bytes]) -> bool:
    """Whether an OK reply has the shape the script's header promises."""
    tail = r[1:]
    if name == "enqueue":
        return tail == [(len(argv) - 3) // 16]
    if name == "claim":
        if tail[:1] == [b"none"]:
            return len(tail) == 2 and is_count(tail[1])
        return (tail[:1] == [b"task"] and len(tail) == 1 + len(TASK_FIELDS) and None not in tail
                and isinstance(tail[2], int)  # the token, the one number
                and tail[-2] in (b"met", b"missed", b"pending", b"") and due(tail[-1]))
    if name == "claim_batch":
        return (len(tail) >= 2 and isinstance(tail[0], int) and tail[1].isdigit() and all(
            isinstance(t, list) and len(t) == len(BATCHED_FIELDS) and None not in t  # in order
            and t[-2] in (b"met", b"missed", b"pending", b"") and due(t[-1]) for t in tail[2:]))
    if name == "began":
        return len(tail) == 2 and tail[0] in (b"met", b"missed", b"") and tail[1].isdigit()
    if name == "heartbeat":
        return len(tail) >= 1 and tail[0] in (0, 1) and all(isinstance(x, bytes) for x in tail[1:])
    if name == "ack":
        return tail == []
    if name == "tenant":
        return len(tail) == 1 and isinstance(tail[0], bytes)
    if name == "fail":
        return tail == [b"failed"] or (len(tail) == 2 and tail[0] == b"delayed" and tail[1].isdigit())
    if name == "requeue":
        return tail in ([b"queued"], [b"failed"])
    if name == "cancel":
        return len(tail) == 1 and tail[0] in (b"queued", b"delayed", b"waiting", b"running")
    if name == "reap":  # the counts, then {worker, id, state} per task recovered, {worker} per idle death
        return (len(tail) == 5 and all(is_count(x) for x in tail[:4]) and isinstance(tail[4], list)
                and all(isinstance(e, list) and len(e) in (1, 3) and all(isinstance(x, bytes) for x in e)
                        for e in tail[4]))
    if name == "expire":
        return (len(tail) == 3 and all(is_count(x) for x in tail)
                and tail[0] + tail[2] <= tail[1])  # expired and kept, of those looked at
    if name == "park":
        return len(tail) == 3 and all(is_count(x) for x in tail) and tail[1] <= tail[2]  # of those looked at
    if name == "preempt":
        return tail in ([b"reserved"], [b"yield"]) or (len(tail) == 2 and tail[0] == b"stale")
    if name == "retire":
        return len(tail) == 2 and tail[0] in (0, 1) and is_count(tail[1])
    if name == "lead":
        return tail in ([0], [1])
    if name == "learn":
        return len(tail) == 1 and tail[0] == len(argv) // 3
    if name == "emit":
        return len(tail) == 1 and re.fullmatch(rb"\d+-\d+", tail[0]) is not None
    if name == "progress":
        return tail == []
    if name in ("follow", "wait"):
        return len(tail) == 1 and isinstance(tail[0], bytes)
    if name == "fire":
        return tail in ([b"skipped"], [b"done"]) or (len(tail) == 2 and tail[0] == b"enqueued")
    raise AssertionError(name)


ERROR_SHAPES: dict[str, Callable[[list[Any]], bool]] = {
    "INVALID": lambda r: len(r) == 3 and is_count(r[1]) and isinstance(r[2], bytes) and r[2] != b"",
    "DUPLICATE": lambda r: len(r) == 3 and isinstance(r[1], int) and r[1] >= 1,
    "UNSCHEDULABLE": lambda r: len(r) == 6 and isinstance(r[1], int) and r[1] >= 1,
    "NOT_FOUND": lambda r: r == [4],
    "STALE_LEASE": lambda r: len(r) == 2 and isinstance(r[1], bytes),  # the state (as stored)
    "FINISHED": lambda r: len(r) == 2 and isinstance(r[1], bytes),
    "UNREGISTERED": lambda r: len(r) == 3 and isinstance(r[1], int) and r[1] >= 1,
}


def promised_codes(name: str) -> set[str]:
    """The codes a script's header names (every Code name written in it)."""
    lines = (resources.files("gpuq") / "lua" / f"{name}.lua").read_text().splitlines()
    text = "\n".join(itertools.takewhile(lambda line: line.startswith("--"), lines))
    return {c.name for c in Code if re.search(rf"\b{c.name}\b", text)}


def decoded(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", "surrogateescape")
    return [decoded(y) for y in x] if isinstance(x, list) else x


# ---------------------------------------------------------------- running one example


class Bench:
    """The template pool and the clients the examples run on."""

    def __init__(self, url: str, client_type: type[redis.Redis], prefix: str) -> None:
        self.prefix = prefix
        self.text = client_type.from_url(url, decode_responses=True)
        self.raw = client_type.from_url(url)  # bytes in, bytes out: ARGV need not be UTF-8
        self.library = library(SCRIPT_NAMES)
        try:
            self.raw.function_load(self.library.source)
        except redis.ResponseError as exc:
            assert already_loaded(exc), exc
        self.calls = Calls(Config(pool="fuzz", prefix=prefix))
        self.template = Keys(f"f{uuid.uuid4().hex[:10]}", prefix)
        build_state(Queue(self.text, Config(pool=self.template.pool, prefix=prefix)))
        self.state = self.dump(self.template)

    def close(self) -> None:
        self.raw.delete(*self.raw.scan_iter(match=self.template.pattern, count=1000))
        self.text.close()
        self.raw.close()

    def dump(self, keys: Keys) -> dict[bytes, tuple[bytes, int]]:
        """Every key of a pool by its suffix: its DUMP and absolute expiry (ms, -1: none)."""
        names = sorted(self.raw.scan_iter(match=keys.pattern, count=1000))
        pipe = self.raw.pipeline(transaction=False)
        for name in names:
            pipe.dump(name)
            pipe.execute_command("PEXPIRETIME", name)
        got = pipe.execute()
        base = len(keys.base.encode())
        return {n[base:]: (got[2 * i], got[2 * i + 1]) for i, n in enumerate(names)}

    def fresh_pool(self) -> Keys:
        """A copy of the template pool under a new name."""
        keys = Keys(f"f{uuid.uuid4().hex[:10]}", self.prefix)
        pipe = self.raw.pipeline(transaction=False)
        for suffix, (data, expires) in self.state.items():
            name = keys.base.encode() + suffix
            if expires > 0:
                pipe.restore(name, expires, data, absttl=True)
            else:
                pipe.restore(name, 0, data)
        pipe.execute()
        return keys

    def check(self, name: str, argv: Sequence[bytes],
              prepare: Callable[[Keys], None] | None = None) -> list[Any]:
        """One call of script `name` with argv on a fresh copy of the state (changed first by
        prepare, if given); returns the reply."""
        keys = self.fresh_pool()
        try:
            if prepare is not None:
                prepare(keys)
            before = self.dump(keys)
            try:
                reply = self.raw.fcall(self.library.functions[name], 1, keys.base, *argv)
            except redis.ResponseError as exc:
                raise AssertionError(f"{name}.lua raised {str(exc)[:300]!r} on {shown(argv)}") from None
            assert isinstance(reply, list) and reply and isinstance(reply[0], int), reply
            code = reply[0]
            if code == 0:
                assert ok_reply(name, reply, argv), f"{name}: bad OK reply {reply!r} on {shown(argv)}"
            else:
                code_name = Code(code).name if code in set(Code) else str(code)
                assert code_name in promised_codes(name), f"{name}: code {code} not in its header"
                assert ERROR_SHAPES[code_name](reply), f"{name}: bad {code_name} reply {reply!r}"
                assert self.dump(keys) == before, f"{name}: wrote on {code_name} {reply!r}"
            self.parse(name, decoded(reply))
            return reply
        finally:
            self.raw.delete(*self.raw.scan_iter(match=keys.pattern, count=1000))

    def parse(self, name: str, reply: list[Any]) -> None:
        """gpuq.scripts' parser of the script takes the reply, or raises a GpuqError."""
        call = valid_calls(self.calls)[name][0]
        try:
            if name == "enqueue" and reply[0] != 0:  # its parser looks up the call's own tasks
                raise_for(reply)
            else:
                call.parse(reply)
        except GpuqError:
            assert reply[0] != 0, reply


def shown(argv: Sequence[bytes]) -> str:
    return repr([a if len(a) <= 60 else a[:20] + b"...(%d bytes)" % len(a) for a in argv])


def open_bench(redis_server: EmbeddedServer, connect: Callable[[str], redis.Redis],
               prefix: str) -> Iterator[Bench]:
    """A bench on the test server (the real client's type: Redis or RedisCluster), closed
    when the module's tests are done (the body of this module's fixture and of others')."""
    b = Bench(redis_server.url, type(connect("real")), prefix)
    yield b
    b.close()


@pytest.fixture(scope="module")
def bench(redis_server: EmbeddedServer, connect: Callable[[str], redis.Redis],
          prefix: str) -> Iterator[Bench]:
    yield from open_bench(redis_server, connect, prefix)
    print(f"\nfuzzed script calls: {sum(RAN.values())} ({RAN})")


# Inputs that stopped a script with a Lua or command error before the fixes, each the
# smallest of its kind (several after part of the script's writes: marked "half-written"),
# or were taken when they should not be (noted), and the reply code each gets now.
N, TTL = str(NOW), "604800000"
TASK = ["h", "null", "A", "1", "2", "1", "", "1", "default", "3", "0", "1", "", "", "0"]  # after the id, P2
CLAIM = ["w1", N, "50", "10", "2", "30000 5 8 100 500 2000 2000 150000 300000", "0123", "1", "0", "0"]
JSON_OVER = '"' + "a" * MAX_PAYLOAD_BYTES + '"'  # a JSON text one byte past 1 MiB
REGRESSIONS: list[tuple[str, list[str], int]] = [
    # half-written: the first task was stored before the second's SLA (P1's, "x") stopped it
    ("enqueue", [N, "0", "200 x 300000 86400000", "n1", *TASK, "n2", *TASK[:4], "1",
                 *TASK[5:]], 1),
    ("enqueue", ["inf", "0", "200 1000 300000 86400000", "n1", *TASK], 1),  # stored "inf" times
    # est_s 1e300 with a deadline: its score and deadline watch became -inf
    ("enqueue", [N, "0", "200 1000 300000 86400000", "n1", *TASK[:5], "1e300", "5000",
                 *TASK[7:]], 1),
    ("enqueue", [N, "0", "200 1000 300000 86400000", "n1", *TASK[:10], "2", *TASK[11:]],
     1),  # report_end
    ("enqueue", [N, "0", "200 1000 300000 86400000", "n1", *TASK[:5], "", *TASK[6:]], 0),
    ("claim", [], 1),
    ("claim", CLAIM[:9], 1),
    ("claim", [CLAIM[0], CLAIM[1], "nan", *CLAIM[3:]], 1),
    ("claim", [*CLAIM[:5], "30000 5 x 100 500 2000 2000 150000 300000", *CLAIM[6:]], 1),
    ("claim", [*CLAIM[:5], "30000 5 8 100 500 2000 2000 150000", *CLAIM[6:]], 1),  # a holder wait short
    ("claim", [*CLAIM[:5], "30000 5 8 100 500 2000 20000000000000 150000 300000", *CLAIM[6:]], 1),
    ("claim", [*CLAIM[:5], "30000 0 8 100 500 2000 2000 150000 300000", *CLAIM[6:]], 1),  # fair_every 0
    ("began", ["run1", "1"], 1),
    ("began", ["run1", "1", "nan"], 1),
    ("began", ["run1", "4", N], 5),  # another attempt's token
    ("heartbeat", ["w1", N], 1),
    ("heartbeat", ["w1", N, "nan"], 1),
    ("ack", [], 1),
    ("ack", ["run1", "1", N, '"ok"', ""], 1),  # half-written: succeeded, then PEXPIRE failed
    ("ack", ["run1", "1", N, '"ok"', "0123"], 1),  # half-written: PEXPIRE refuses a leading zero
    ("ack", ["run1", "1", N, JSON_OVER, TTL], 1),  # a result past 1 MiB was stored
    ("fail", ["run1", "1", N, "boom", "1", "x", "300000", TTL], 1),  # half-written: lease dropped
    ("fail", ["run1", "1", N, "boom", "0", "1000", "300000", "x"], 1),  # half-written
    ("requeue", ["run1", "1", N, "r", "0", TTL, "x", ""], 1),  # stats field preempt:x
    ("cancel", ["q2", N, ""], 1),  # half-written: canceled, then PEXPIRE failed
    ("reap", [N, "", TTL], 1),
    ("reap", [N, "nan", TTL], 1),
    ("expire", [N, "", TTL, "0", "0"], 1),
    ("expire", [N, "100", TTL, "x", "0"], 1),
    ("park", [N, TTL, "0", "0"], 1),
    ("park", [N, "", "100", "0"], 1),
    ("park", [N, TTL, "100", "0", "80"], 1),  # a shape without its GPUs
    ("preempt", [N, "q3", "w1", "run2", "4", "5000", "x"], 1),  # half-written: reserved first
    ("preempt", [N, "q3", "w1", "run2", "4", "x", ""], 1),
    ("retire", ["w2", N, ""], 1),
    ("lead", ["r1", ""], 1),
    ("lead", ["r1", "-1"], 1),
]


SETTINGS: dict[str, Any] = dict(deadline=None, derandomize=True, database=None,
                                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                       HealthCheck.large_base_example])


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_arbitrary_argv(bench: Bench, name: str) -> None:
    @settings(max_examples=ARBITRARY, **SETTINGS)
    @given(argv=arbitrary_argv())
    def run(argv: list[bytes]) -> None:
        RAN["arbitrary"] = RAN.get("arbitrary", 0) + 1
        bench.check(name, argv)

    run()


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_mutated_argv(bench: Bench, name: str) -> None:
    templates = [call.args for call in valid_calls(bench.calls)[name]]

    @settings(max_examples=MUTATED, **SETTINGS)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        RAN["mutated"] = RAN.get("mutated", 0) + 1
        base = data.draw(st.sampled_from(templates))
        bench.check(name, data.draw(mutations(base)))

    run()


@pytest.mark.parametrize("name, argv, code", REGRESSIONS)
def test_regressions(bench: Bench, name: str, argv: list[str], code: int) -> None:
    assert bench.check(name, [as_bytes(a) for a in argv])[0] == code


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_valid_calls_pass(bench: Bench, name: str) -> None:
    """The templates themselves are valid calls (so the mutations start from the main path)."""
    for call in valid_calls(bench.calls)[name]:
        bench.check(name, [as_bytes(a) for a in call.args])
