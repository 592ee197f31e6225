"""The worker record's reader: what the hash says, one default and bound per field, and a
hand-damaged hash that neither ``gpuq status`` nor the reaper's planners trip over."""

from __future__ import annotations

import threading

import fakeredis
import pytest

from gpuq import App, Config
from gpuq.clock import server_ms
from gpuq.errors import ConfigError
from gpuq.keys import Keys
from gpuq.reaper.preempt import Preemptor
from gpuq.reaper.scale import Scaler
from gpuq.scripts import Calls, Scripts
from gpuq.views.inspect import pool_view
from gpuq.views.render import render_status
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence
from gpuq.worker_record import (
    WorkerFields,
    WorkerRecord,
    identity,
    lane,
    lane_skips,
    status_fields,
    usable_gb,
)

GPU = GpuInfo("A100-80", "uuid-1", 80.0, 0, "nvml")


def written(**changed: object) -> dict[str, str]:
    """The hash as a worker writes it (as strings, as Redis returns it), fields changed."""
    fields = {**identity("w1", GPU, 5.0, 2, "01", "host", 7, handlers=["b", "a"]),
              **status_fields(60.5, 1, ["m1", "m2"], "busy", None), **changed}
    return {k: str(v) for k, v in fields.items()}


def test_a_written_hash_reads_back_whole() -> None:
    r = WorkerRecord.parse("w1", written())
    assert r == WorkerRecord("w1", "A100-80", 80.0, 5.0, 60.5, ("m1", "m2"), "busy", "01",
                             ("a", "b"), 2)
    assert r.usable_gb == usable_gb(80, 5) == 75.0


def test_no_field_at_all_is_no_record() -> None:
    assert WorkerRecord.parse("w1", {}) is None
    assert WorkerRecord.parse("w1", {"vram_total_gb": None, "levels": None}) is None


@pytest.mark.parametrize("bad", ["lots", "nan", "inf", "-3", ""])
def test_a_damaged_number_reads_as_zero(bad: str) -> None:
    r = WorkerRecord.parse("w1", written(vram_total_gb=bad, kv_reserve_gb=bad, vram_free_gb=bad,
                                         concurrency=bad))
    assert r is not None
    assert (r.vram_total_gb, r.kv_reserve_gb, r.vram_free_gb, r.concurrency) == (0.0, 0.0, 0.0, 1)


def test_missing_or_damaged_text_fields_take_the_defaults() -> None:
    r = WorkerRecord.parse("w1", {"vram_total_gb": "24", "levels": "x9", "models": ",a,,b,"})
    assert r == WorkerRecord("w1", "?", 24.0, 0.0, 0.0, ("a", "b"), "", "0123", (), 1)


def test_fields_are_read_on_the_callers_pipeline() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("p")
    client.hset(keys.worker("w1"), mapping=written())
    wanted = WorkerFields(("vram_total_gb", "kv_reserve_gb", "levels"))
    pipe = client.pipeline(transaction=False)
    wanted.read(pipe, keys, "w1")
    wanted.read(pipe, keys, "gone")
    one, gone = pipe.execute()
    r = wanted.record("w1", one)
    assert r is not None and (r.usable_gb, r.levels, r.gpu_name) == (75.0, "01", "?")
    assert wanted.record("gone", gone) is None


def test_a_hand_damaged_hash_breaks_neither_status_nor_the_planners() -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    config = Config(pool="p")
    keys = Keys("p")
    client.hset(keys.worker("w1"), mapping={"vram_total_gb": "80GB", "vram_free_gb": "{}",
                                            "levels": "all", "handlers": ",", "state": "busy"})
    client.zadd(keys.workers, {"w1": server_ms(client) + 30_000})
    client.sadd(keys.worker_tasks("w1"), "t1")

    (w,) = pool_view(client, keys).workers
    assert (w.alive, w.vram_total_gb, w.vram_free_gb, w.levels, w.handlers) == (
        True, 0.0, 0.0, "0123", [])
    signals = Scaler(client, keys, config).step().signals
    assert [(s.name, s.current) for s in signals if s.kind == "class"] == [("?", 1)]
    preemptor = Preemptor(client, keys, config, Scripts(client, keys), Calls(config))
    assert preemptor.step() == {}
    assert preemptor.workers.kept == {"w1": (0.0, "0123", 1, None)}


def test_a_handlers_timeout_reaches_status_from_the_registration() -> None:
    app = App("a")

    @app.handler("llm.generate", timeout_s=30)
    @app.handler("embed", timeout_s=0.5)
    @app.handler("free")
    def run(model: str, payload: object, ctx: object) -> None:
        return None

    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    keys = Keys("p")
    Presence(client, keys, "w1").register(identity("w1", GPU, 5.0, 1, "0123", "host", 7,
                                                   handlers=app.handlers), 30_000)
    (w,) = pool_view(client, keys).workers
    assert w.handlers == ["embed", "free", "llm.generate"]
    assert w.timeouts == {"embed": 0.5, "llm.generate": 30.0}  # "free" has no bound
    lines = render_status(pool_view(client, keys)).splitlines()
    assert "  embed" + " " * 35 + "0.5s" in lines and "  llm.generate" + " " * 28 + "30s" in lines
    assert not any(line.startswith("  free") for line in lines)


@pytest.mark.parametrize("beats_again", [False, True])
def test_a_fresh_beat_under_the_name_is_waited_out_then_replaced_or_refused(beats_again: bool) -> None:
    """Found by an online service's owner: a restart under a worker's --name right after
    the run was killed (as a supervisor restarts it) was refused "already running" (exit 2,
    bad configuration). It waits until the last beat is ``fresh_ms`` old: a run that beat
    meanwhile is another process, refused; one that did not is replaced."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    keys = Keys("p")
    Presence(client, keys, "w1").register(identity("w1", GPU, 5.0, 1, "0123", "host", 7), 30_000)
    client.hset(keys.worker("w1"), "seen_at", server_ms(client))  # it beat just now
    beat = threading.Timer(0.2, lambda: client.hset(keys.worker("w1"), "seen_at", server_ms(client)))
    if beats_again:
        beat.start()
    again = Presence(client, keys, "w1")
    if beats_again:
        with pytest.raises(ConfigError, match="worker w1 is already running"):
            again.register(identity("w1", GPU, 5.0, 1, "0123", "host", 8), 30_000, fresh_ms=600)
        assert client.hget(keys.worker("w1"), "pid") == "7"
    else:
        again.register(identity("w1", GPU, 5.0, 1, "0123", "host", 8), 30_000, fresh_ms=600)
        assert client.hget(keys.worker("w1"), "pid") == "8"
    if beats_again:
        beat.join()


def test_a_run_beating_slower_than_the_restart_is_waited_for_by_its_own_period() -> None:
    """Found by a review: the wait was 1.5 of the new process's heartbeats, so a live run of
    the id beating every 20 s looked dead 7.5 s after a beat and was replaced (its running
    tasks recovered, run twice). Its own period (heartbeat_ms) counts."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    keys = Keys("p")
    Presence(client, keys, "w1").register(identity("w1", GPU, 5.0, 1, "0123", "host", 7), 30_000)
    client.hset(keys.worker("w1"), mapping={"seen_at": server_ms(client), "heartbeat_ms": 800})
    beat = threading.Timer(0.7, lambda: client.hset(keys.worker("w1"), "seen_at", server_ms(client)))
    beat.start()  # beats after 0.7 s: past 1.5 x 0.3 s, within 1.5 x 0.8 s
    with pytest.raises(ConfigError, match="already running"):
        Presence(client, keys, "w1").register(identity("w1", GPU, 5.0, 1, "0123", "host", 8), 30_000,
                                              fresh_ms=300)
    beat.join()
    assert client.hget(keys.worker("w1"), "pid") == "7"


def test_damaged_timeout_pairs_are_left_out() -> None:
    r = WorkerRecord.parse("w1", written(timeouts="a=30,b=,=5,c=lots,d=-1,e=inf,f=a=2"))
    assert r is not None and r.timeouts == (("a", 30.0), ("f=a", 2.0))


def test_a_lane_lists_skips_with_their_ends_and_reads_back_the_live_ones() -> None:
    entry = lane("0123", [("m", 30_000), ("n", 5)], now_ms=1_000)
    assert entry == "0123 m 31000 n 1005"  # as claim.lua writes it (lib/lanes.lua)
    assert lane_skips(entry, 1_004) == {"m": 31_000, "n": 1_005}
    assert lane_skips(entry, 1_005) == {"m": 31_000}  # an end passed is stale
    assert lane("01") == "01"
    assert lane_skips("01", 0) == {} == lane_skips(None, 0)
    assert lane_skips("0123 m x n", 0) == {}  # damaged: nothing read
