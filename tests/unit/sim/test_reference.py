"""The offline reference on request sequences small enough to work out by hand."""

from __future__ import annotations

from gpuq.sim.reference import NEVER, Request, belady, lru, next_uses, pool_usable_gb, ratio, references


def seq(models: str, gb: float = 10.0, priority: int = 0) -> list[Request]:
    return [Request(m, gb, priority) for m in models]


def test_next_uses_point_at_the_next_request_of_the_same_model() -> None:
    assert next_uses(seq("abab c")) == [2, 3, NEVER, NEVER, NEVER, NEVER]


def test_belady_evicts_the_model_wanted_furthest_away_and_lru_the_oldest() -> None:
    # room for two of three models, requested in a cycle: LRU always evicts the next one
    # wanted and misses every request; Belady keeps a at c (b is wanted after a), then
    # drops a (wanted no more) for b
    requests = seq("abcabc")
    assert (belady(requests, 20.0).loads, lru(requests, 20.0).loads) == (4, 6)


def test_everything_fits_one_load_per_model() -> None:
    requests = seq("abcabcab")
    assert belady(requests, 30.0).loads == lru(requests, 30.0).loads == 3


def test_a_large_model_evicts_as_many_as_it_needs() -> None:
    # a 20 GB model into a full 30 GB cache of three 10 GB ones: two go, the two wanted
    # furthest away (b: never, c: after a) under Belady, so a stays and only c loads again;
    # the two oldest (a, b) under LRU, then c for a and big for c: every request loads
    requests = seq("abc") + [Request("big", 20.0, 0)] + seq("ac")
    assert belady(requests, 30.0).loads == 5
    assert lru(requests, 30.0).loads == 6


def test_a_model_larger_than_the_pool_loads_every_time_and_evicts_nothing_it_cannot_use() -> None:
    requests = [Request("huge", 50.0, 0), Request("a", 10.0, 0), Request("huge", 50.0, 0),
                Request("a", 10.0, 0)]
    assert belady(requests, 40.0).loads == 3  # huge twice, a once (it stays)


def test_cold_starts_are_counted_per_priority() -> None:
    requests = [Request("a", 10.0, 0), Request("b", 10.0, 2), Request("a", 10.0, 1),
                Request("c", 10.0, 3), Request("b", 10.0, 0)]
    counts = belady(requests, 20.0)  # c evicts a (wanted no more): b stays warm
    assert (counts.loads, counts.cold_starts) == (3, [1, 0, 1, 1])
    assert lru(requests, 20.0).cold_starts == [2, 0, 1, 1]  # c evicted b, the oldest


def test_the_pool_is_one_cache_of_every_gpus_usable_vram() -> None:
    assert pool_usable_gb([(80.0, 1), (80.0, 1), (48.0, 1)], 5.0) == 193.0
    assert pool_usable_gb([(320.0, 4), (80.0, 1)], 5.0) == 375.0  # a group: a reserve per GPU
    # two 15 GB GPUs keep 10 GB each: three 10 GB models would not fit one, but fit the pool
    refs = references(seq("abcabc"), [(15.0, 1)] * 3, 5.0)
    assert refs["reference"] == {"rule": "belady", "usable_gb": 30.0, "loads": 3,
                                 "cold_starts": {"P0": 3, "P1": 0, "P2": 0, "P3": 0}}
    assert refs["reference_lru"]["loads"] == 3


def test_ratio_is_none_against_a_reference_of_zero() -> None:
    assert (ratio(7, 2), ratio(0, 0), ratio(3, 0)) == (3.5, None, None)
