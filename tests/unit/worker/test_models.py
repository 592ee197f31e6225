"""The model cache and VRAM ledger of one GPU (gpuq.worker.models.ModelCache).

free = total - KV reserve - footprints of resident models - working memory of running tasks;
idle models are evicted least-recently-used first, never one a running task uses.
"""

from __future__ import annotations

import pytest

from gpuq.app import App
from gpuq.worker.models import ModelCache, Reservation

TOTAL, RESERVE = 80.0, 5.0


def make_app(loads: list[str] | None = None, unloads: list[str] | None = None) -> App:
    """Fixed-size models a (20 GB), b (30 GB), c (40 GB); any other name: the task's VRAM."""
    app = App("models-test")

    def loader(name: str) -> str:
        if loads is not None:
            loads.append(name)
        if name.startswith("broken"):
            raise RuntimeError("weights missing")
        return f"weights:{name}"

    def unloader(obj: str) -> None:
        if unloads is not None:
            unloads.append(obj)

    app.model("a", vram_gb=20, unload=unloader)(loader)
    app.model("b", vram_gb=30, unload=unloader)(loader)
    app.model("c", vram_gb=40, unload=unloader)(loader)
    app.any_model(unload=unloader)(loader)
    return app


def loaded(cache: ModelCache, model: str, need: float) -> Reservation:
    """Reserve a cold model and load it, as the executor does."""
    res = cache.reserve(model, need)
    assert res is not None and res.cold
    cache.load(cache.get(model))
    return res


@pytest.fixture
def cache() -> ModelCache:
    return ModelCache(make_app(), TOTAL, RESERVE)


def test_empty_ledger_is_total_minus_reserve(cache: ModelCache) -> None:
    assert cache.free_gb() == pytest.approx(75.0)
    assert cache.evictable_gb() == 0
    assert cache.loaded() == [] and cache.model_names() == []


def test_free_counts_footprints_and_working_memory(cache: ModelCache) -> None:
    res = loaded(cache, "a", 26.0)  # 20 GB of weights + 6 GB working memory
    assert res == Reservation("a", pytest.approx(6.0), True, ())
    assert cache.free_gb() == pytest.approx(80 - 5 - 20 - 6)
    assert cache.loaded() == [("a", 20.0)]
    assert cache.model_names() == ["a"]
    assert cache.evictable_gb() == 0  # in use
    cache.release(res)
    assert cache.free_gb() == pytest.approx(80 - 5 - 20)  # the model stays resident
    assert cache.evictable_gb() == pytest.approx(20.0)


def test_model_without_fixed_size_takes_the_tasks_vram(cache: ModelCache) -> None:
    res = loaded(cache, "sim-7b", 16.0)
    assert res.working_gb == 0
    assert cache.loaded() == [("sim-7b", 16.0)]
    assert cache.free_gb() == pytest.approx(75 - 16)


def test_loading_model_counts_before_it_is_ready(cache: ModelCache) -> None:
    res = cache.reserve("b", 30.0)
    assert res is not None and res.cold
    assert cache.free_gb() == pytest.approx(45.0)  # held for the load in progress
    assert cache.model_names() == []  # not reported as loaded until ready
    assert cache.loaded() == [("b", 30.0)]  # but the claim script knows it holds the room


def test_keeps_several_models_when_they_fit(cache: ModelCache) -> None:
    for model in ("a", "b"):
        cache.release(loaded(cache, model, {"a": 20.0, "b": 30.0}[model]))
    assert cache.model_names() == ["a", "b"]
    assert cache.free_gb() == pytest.approx(25.0)
    assert cache.evictable_gb() == pytest.approx(50.0)


def test_second_task_on_held_model_is_warm_and_adds_working_memory(cache: ModelCache) -> None:
    first = loaded(cache, "a", 22.0)
    second = cache.reserve("a", 30.0)
    assert second == Reservation("a", pytest.approx(10.0), False, ())
    assert cache.free_gb() == pytest.approx(75 - 20 - 2 - 10)
    cache.release(first)
    assert cache.evictable_gb() == 0  # still used by the second task
    cache.release(second)
    assert cache.free_gb() == pytest.approx(55.0)
    assert cache.evictable_gb() == pytest.approx(20.0)


def test_concurrent_tasks_of_one_model_hold_its_weights_once(cache: ModelCache) -> None:
    """N tasks sharing a model (an async engine, say): footprint + N x working memory, in
    the free VRAM the claim is told and in the footprint listed for it."""
    first = cache.reserve("a", 24.0)  # cold: 20 GB of weights + 4 working
    assert first is not None and first.cold
    more = [cache.reserve("a", 24.0) for _ in range(7)]  # the load still under way
    assert all(r is not None and not r.cold and r.working_gb == pytest.approx(4.0) for r in more)
    assert cache.free_gb() == pytest.approx(75 - 20 - 8 * 4)
    assert cache.loaded() == [("a", 20.0)]
    cache.load(cache.get("a"))
    for r in [first, *more]:
        assert r is not None
        cache.release(r)
    assert cache.free_gb() == pytest.approx(55.0) and cache.working_gb == pytest.approx(0.0)


def test_held_model_without_room_for_working_memory_is_refused(cache: ModelCache) -> None:
    loaded(cache, "a", 20.0)
    loaded(cache, "c", 40.0)  # 15 GB left
    assert cache.reserve("a", 36.0) is None  # 16 GB working memory > 15 free
    assert cache.free_gb() == pytest.approx(15.0)  # a refusal holds nothing


def test_held_models_task_evicts_other_idle_models_for_its_working_memory() -> None:
    unloads: list[str] = []
    cache = ModelCache(make_app(unloads=unloads), TOTAL, RESERVE)
    cache.release(loaded(cache, "a", 20.0))
    cache.release(loaded(cache, "b", 30.0))  # 25 GB free, 50 evictable
    res = cache.reserve("a", 60.0)  # 40 GB working memory: b makes room, a stays (warm)
    assert res is not None and not res.cold and res.working_gb == pytest.approx(40.0)
    assert [r.spec.name for r in res.evict] == ["b"]
    assert [name for name, _ in cache.loaded()] == ["a"]
    assert cache.free_gb() == pytest.approx(75 - 20 - 40 - 30)  # b is not unloaded yet
    assert cache.reserve("a", 36.0) is None  # 16 GB more: nothing idle left to evict
    for old in res.evict:
        cache.unload(old)
    assert unloads == ["weights:b"]
    assert cache.free_gb() == pytest.approx(75 - 20 - 40)


def test_lru_eviction_of_idle_models_only(cache: ModelCache) -> None:
    unloads: list[str] = []
    cache = ModelCache(make_app(unloads=unloads), TOTAL, RESERVE)
    ra = loaded(cache, "a", 20.0)
    rb = loaded(cache, "b", 30.0)
    cache.release(ra)
    cache.release(rb)
    # touch "a": it becomes the most recently used, so "b" is the LRU one
    touch = cache.reserve("a", 20.0)
    assert touch is not None and not touch.cold
    cache.release(touch)
    res = cache.reserve("c", 40.0)  # free 25: needs 15 more; evicting b (30) is enough
    assert res is not None and res.cold
    assert [r.spec.name for r in res.evict] == ["b"]
    assert [name for name, _ in cache.loaded()] == ["a", "c"]
    assert cache.free_gb() == pytest.approx(75 - 20 - 40 - 30)  # b's memory until its unload
    for old in res.evict:  # the executor unloads what the ledger evicted
        cache.unload(old)
    assert unloads == ["weights:b"]
    assert cache.free_gb() == pytest.approx(75 - 20 - 40)


def test_eviction_takes_lru_first_and_as_many_as_needed(cache: ModelCache) -> None:
    for model, need in (("a", 20.0), ("b", 30.0), ("sim-x", 10.0)):
        cache.release(loaded(cache, model, need))
    # free 15; a 70 GB model needs 55 more: a (20, oldest) + b (30) + sim-x (10)
    res = cache.reserve("huge", 70.0)
    assert res is not None
    assert [r.spec.name for r in res.evict] == ["a", "b", "sim-x"]
    assert cache.loaded() == [("huge", 70.0)]


def test_model_in_use_is_never_evicted(cache: ModelCache) -> None:
    busy = loaded(cache, "c", 40.0)  # running
    cache.release(loaded(cache, "b", 30.0))  # idle; free is 5
    assert cache.reserve("big", 70.0) is None  # would need c's 40 GB: c is in use
    assert [name for name, _ in cache.loaded()] == ["c", "b"]  # nothing was evicted
    assert cache.free_gb() == pytest.approx(5.0)
    res = cache.reserve("a", 20.0)  # evicting idle b is enough
    assert res is not None and [r.spec.name for r in res.evict] == ["b"]
    assert "c" in dict(cache.loaded())
    cache.release(busy)


def test_model_still_loading_is_not_evicted(cache: ModelCache) -> None:
    loading = cache.reserve("c", 40.0)  # reserved, its task is loading it
    assert loading is not None
    assert cache.reserve("other", 60.0) is None
    assert [name for name, _ in cache.loaded()] == ["c"]
    cache.load(cache.get("c"))
    cache.release(loading)
    assert cache.reserve("other", 60.0) is not None  # loaded and idle: evictable now


def test_task_larger_than_the_gpu_is_refused(cache: ModelCache) -> None:
    assert cache.reserve("sim-huge", 76.0) is None
    assert cache.loaded() == [] and cache.free_gb() == pytest.approx(75.0)


def test_model_without_loader_is_refused() -> None:
    app = App("no-fallback")
    app.model("a", vram_gb=10)(lambda name: name)
    cache = ModelCache(app, TOTAL, RESERVE)
    assert cache.reserve("unknown", 1.0) is None
    assert cache.loaded() == []


def test_release_gives_back_working_memory(cache: ModelCache) -> None:
    res = loaded(cache, "a", 35.0)
    assert cache.free_gb() == pytest.approx(40.0)
    cache.release(res)
    assert cache.working_gb == pytest.approx(0.0)
    assert cache.free_gb() == pytest.approx(55.0)
    assert cache.get("a").in_use == 0


def test_failed_load_frees_the_slot() -> None:
    loads: list[str] = []
    cache = ModelCache(make_app(loads=loads), TOTAL, RESERVE)
    res = cache.reserve("broken-7b", 30.0)
    assert res is not None and res.cold
    resident = cache.get("broken-7b")
    with pytest.raises(RuntimeError, match="weights missing"):
        cache.load(resident)
    assert resident.ready.is_set()  # waiters are released, and see the error
    assert resident.error is not None
    assert cache.model_names() == []  # never reported as loaded
    cache.release(res)
    assert cache.loaded() == []
    assert cache.free_gb() == pytest.approx(75.0)
    # the next task for that model tries a fresh load
    again = cache.reserve("broken-7b", 30.0)
    assert again is not None and again.cold
    assert loads == ["broken-7b"]


def test_failed_load_shared_by_two_tasks_frees_after_both(cache: ModelCache) -> None:
    first = cache.reserve("broken-x", 10.0)
    second = cache.reserve("broken-x", 10.0)  # claimed while loading: warm reservation
    assert first is not None and second is not None and not second.cold
    with pytest.raises(RuntimeError):
        cache.load(cache.get("broken-x"))
    cache.release(first)
    assert [name for name, _ in cache.loaded()] == ["broken-x"]  # second still holds it
    cache.release(second)
    assert cache.loaded() == []
    assert cache.free_gb() == pytest.approx(75.0)


def test_load_reports_seconds_and_object(cache: ModelCache) -> None:
    cache.reserve("a", 20.0)
    seconds = cache.load(cache.get("a"))
    assert seconds >= 0
    assert cache.get("a").obj == "weights:a"


def test_evict_idle_drops_idle_models_only(cache: ModelCache) -> None:
    busy = loaded(cache, "a", 20.0)
    cache.release(loaded(cache, "b", 30.0))
    idle = cache.evict_idle()
    assert [r.spec.name for r in idle] == ["b"]
    assert [name for name, _ in cache.loaded()] == ["a"]
    cache.release(busy)


def test_a_cold_reservation_released_before_its_load_frees_the_ledger(cache: ModelCache) -> None:
    """Regression: a task that reserved a model to load, then ended before loading it, left
    a placeholder that never became ready, so it was never evicted and the GPU's free VRAM
    stayed lower until the worker restarted. A task that waited on it sees the load fail."""
    first = cache.reserve("d", 10.0)
    waiter = cache.reserve("d", 10.0)  # claimed while the first was to load it
    assert first is not None and first.cold and waiter is not None and not waiter.cold
    cache.release(first)
    resident = cache.get("d")
    assert resident.ready.is_set() and resident.error is not None  # the waiter does not hang
    cache.release(waiter)
    assert cache.loaded() == [] and cache.free_gb() == pytest.approx(75.0)
    again = cache.reserve("d", 10.0)
    assert again is not None and again.cold  # a later task loads it afresh


def test_an_evicted_model_holds_its_memory_until_its_unload_ends(cache: ModelCache) -> None:
    """Regression: eviction took a model off the ledger before its unload (outside the lock)
    ended, so another runner's claim could load into memory the GPU still held."""
    cache.release(loaded(cache, "a", 20.0))
    cache.release(loaded(cache, "b", 30.0))  # 25 GB free
    res = cache.reserve("c", 40.0)  # evicts a (the LRU one)
    assert res is not None and [r.spec.name for r in res.evict] == ["a"]
    assert cache.free_gb() == pytest.approx(75 - 30 - 40 - 20)  # a is still being unloaded
    assert cache.reserve("sim-d", 20.0) is None  # evicting b too would leave 15 GB
    cache.unload(res.evict[0])
    assert cache.free_gb() == pytest.approx(75 - 30 - 40)
    idle = cache.evict_idle()  # the idle timeout: b counts until its caller unloads it
    assert [r.spec.name for r in idle] == ["b"] and cache.free_gb() == pytest.approx(75 - 30 - 40)
    cache.unload(idle[0])
    assert cache.free_gb() == pytest.approx(75 - 40)


def test_a_held_models_task_within_its_weights_fits_while_another_unloads(cache: ModelCache) -> None:
    """The defect: claim.lua took a task of a held model needing no more than the weights
    (its fit: need - footprint <= room, below zero) while an evicted model still unloaded
    and free was below zero; the ledger refused it and the task failed, an attempt used."""
    cache.release(loaded(cache, "a", 20.0))
    cache.release(loaded(cache, "b", 30.0))
    res = cache.reserve("c", 40.0)  # evicts a; it unloads outside the lock
    assert res is not None and [r.spec.name for r in res.evict] == ["a"]
    cache.load(cache.get("c"))
    assert cache.free_gb() == pytest.approx(75 - 30 - 40 - 20)  # a still counts
    assert cache.reserve("c", 40.0) == Reservation("c", 0.0, False, ())  # c's weights serve it
    more = cache.reserve("c", 46.0)  # 6 GB of working memory still needs room: b goes
    assert more is not None and [r.spec.name for r in more.evict] == ["b"]


def test_an_unloader_that_raises_is_reported_and_frees_the_ledger() -> None:
    """Regression: the first unloader that raised stopped the executor's unloads, leaving the
    later evicted models loaded and their holders in Redis, and failed the task; an unload at
    the idle timeout that raised stopped the worker's main loop."""
    app = make_app()

    def broken(obj: str) -> None:
        raise RuntimeError("driver error")

    app.model("x", vram_gb=30, unload=broken)(lambda name: name)
    cache = ModelCache(app, TOTAL, RESERVE)
    cache.release(loaded(cache, "x", 30.0))
    idle = cache.evict_idle()
    assert cache.unload(idle[0]) is False  # logged (model.unload_failed), not raised
    assert cache.free_gb() == pytest.approx(75.0) and cache.unloading == []


def test_tasks_within_a_held_model_s_weights_share_one_reservation() -> None:
    cache = ModelCache(make_app(), TOTAL, RESERVE)
    first = loaded(cache, "a", 20)
    free = cache.free_gb()
    one, two = cache.reserve("a", 12), cache.reserve("a", 20)
    assert one is two and one == Reservation("a", 0.0, False, ())
    above = cache.reserve("a", 23)
    assert above is not None and above.working_gb == 3 and cache.free_gb() == free - 3
    assert cache.get("a").in_use == 4
    for res in (one, two, above, first):
        assert res is not None
        cache.release(res)
    assert cache.get("a").in_use == 0 and cache.working_gb == 0 and cache.free_gb() == free + 0
