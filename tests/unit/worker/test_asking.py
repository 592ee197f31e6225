"""A worker's claim call (gpuq/worker/asking.py): kept while what it says is unchanged, and
always saying what a claim built afresh from the worker's state would say."""

from __future__ import annotations

import fakeredis
import pytest

from gpuq import Config, Queue
from gpuq.app import App
from gpuq.claims import ClaimRequest
from gpuq.scripts import Calls
from gpuq.worker.asking import Asking
from gpuq.worker.broken import Broken
from gpuq.worker.models import ModelCache
from gpuq.worker.passing import Elsewhere
from gpuq.worker.presence import Presence

BATCHES = (("embed", 7),)
Parts = tuple[ModelCache, Broken, Calls, "Clock"]


def make_app() -> App:
    """Models a (20 GB), b (30 GB) and c (40 GB) on an 80 GB GPU with 5 GB reserved."""
    app = App("asking-test")
    for name, gb in (("a", 20), ("b", 30), ("c", 40)):
        app.model(name, vram_gb=gb)(lambda name: f"weights:{name}")
    return app


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts() -> Parts:
    client = fakeredis.FakeRedis(decode_responses=True)
    clock = Clock()
    broken = Broken(Elsewhere(Presence(client, Queue(client, Config(pool="p")).keys, "w")), 30, 600, clock)
    return ModelCache(make_app(), 80.0, 5.0), broken, Calls(Config(pool="p")), clock


def afresh(cache: ModelCache, broken: Broken, calls: Calls, slots: int, lookout: bool,
           unlisted: bool) -> list[str]:
    """The arguments of the claim the worker built before each claim, from its state now."""
    req = ClaimRequest("w", cache.free_gb(), cache.evictable_gb(), slots, cache.loaded(), "0123", 2,
                       cache.in_use(), BATCHES, lookout, unlisted, broken.skipped(), cache.loading())
    return calls.claim(req).args


def test_the_ledger_is_the_five_figures_a_claim_reports(parts: Parts) -> None:
    cache = parts[0]

    def check() -> tuple[float, float, list[tuple[str, float]], frozenset[str], frozenset[str]]:
        got = cache.ledger()
        assert got == (cache.free_gb(), cache.evictable_gb(), cache.loaded(), cache.in_use(),
                       cache.loading())
        return got

    check()
    a = cache.reserve("a", 26.0)  # cold: 20 GB of weights, 6 GB working memory
    assert a is not None
    assert check()[3:] == (frozenset({"a"}), frozenset({"a"}))  # loading: in use, and said so
    cache.load(cache.get("a"))
    assert check()[3] == frozenset({"a"})
    b = cache.reserve("b", 30.0)
    assert b is not None
    cache.load(cache.get("b"))
    cache.release(b)
    assert check() == (pytest.approx(75.0 - 20 - 6 - 30), 30.0, [("a", 20.0), ("b", 30.0)], frozenset({"a"}),
                       frozenset())
    cache.release(a)
    assert cache.reserve("c", 40.0) is not None  # evicts the idle a, counted while it unloads
    assert cache.unloading and check()[3] == frozenset({"c"})


def test_the_kept_call_says_what_a_fresh_one_would(parts: Parts) -> None:
    cache, broken, calls, clock = parts
    asking = Asking("w", "0123", 2, BATCHES, cache, broken, calls)
    first = asking.call(1, False, False)
    assert first.args == afresh(cache, broken, calls, 1, False, False)
    assert asking.call(1, False, False) is first  # nothing changed: the same call again
    res = cache.reserve("a", 26.0)
    assert res is not None
    # a model held and in use; then the slots and each flag, one at a time
    for state in [(1, False, False), (2, False, False), (1, False, False), (1, True, False),
                  (1, False, False), (1, False, True)]:
        assert asking.call(*state).args == afresh(cache, broken, calls, *state)
    cache.load(cache.get("a"))
    asking.call(2, False, False)
    more = cache.reserve("a", 30.0)  # a second task of a: only its working memory changes
    assert more is not None
    assert asking.call(2, False, False).args == afresh(cache, broken, calls, 2, False, False)
    cache.release(more)
    cache.release(res)  # held and idle: evictable now, not in use
    assert asking.call(2, False, False).args == afresh(cache, broken, calls, 2, False, False)
    broken.failed("b")  # its claims skip b for a while
    skipping = asking.call(2, False, False)
    assert skipping.args == afresh(cache, broken, calls, 2, False, False) and "skip:30000" in skipping.args
    clock.now += 3600  # the skip ended
    assert asking.call(2, False, False).args == afresh(cache, broken, calls, 2, False, False)
    assert not any(a.startswith("skip") for a in asking.call(2, False, False).args)
