"""A scale step's backlog sample: within its budget of task reads, every queue's head read each
round and the queues read in full longest ago read in full, the others keeping their last
sample."""

from __future__ import annotations

from gpuq.reaper.backlog_sample import DEEP, SAMPLE, SAMPLE_REST, Samples
from gpuq.reaper.snapshot import Backlog


def queues(n: int, depth: int) -> list[tuple[int, str, int]]:
    return [(2, f"m{i}", depth) for i in range(n)]


def backlogs(qs: list[tuple[int, str, int]], reads: list[int], est_s: float) -> list[Backlog]:
    """What read_backlogs would make of `reads` tasks a queue, each task `est_s` long."""
    return [Backlog(p, m, depth, 0.0, ((1.0, est_s, 1),) * n) for (p, m, depth), n in zip(qs, reads)]


def test_within_the_budget_every_queue_is_read_in_full_every_round() -> None:
    qs = [*queues(3, 2), (1, "deep", 500), (0, "one", 1)]
    samples = Samples(budget=1000)
    for _ in range(2):
        assert samples.reads(qs) == [2, 2, 2, SAMPLE, 1]
        assert samples.full == set(range(5))


def test_only_the_deep_ones_are_read_past_the_rest_sample() -> None:
    qs = queues(DEEP + 10, 100)
    reads = Samples(budget=10**6).reads(qs)
    assert reads.count(SAMPLE) == DEEP and reads.count(SAMPLE_REST) == 10


def test_past_the_budget_heads_are_read_and_full_reads_rotate() -> None:
    qs = queues(100, 3)  # 300 task reads wanted
    samples = Samples(budget=150)
    seen: set[int] = set()
    for rnd in range(3):
        reads = samples.reads(qs)
        assert sum(reads) <= 150 and min(reads) == 1
        full = {i for i, n in enumerate(reads) if n == 3}
        assert full == samples.full and len(full) == 25  # 100 heads, then 25 x 2 more
        assert not full & seen  # the ones read in full longest ago (never, here) go first
        seen |= full
        samples.fill(backlogs(qs, reads, est_s=float(rnd)), now_ms=rnd)
    assert len(seen) == 75


def test_a_queue_not_read_in_full_keeps_its_last_full_sample() -> None:
    qs = queues(4, 3)
    samples = Samples(budget=6)  # 4 heads and one more queue in full
    first = samples.reads(qs)
    assert first == [3, 1, 1, 1]
    got = samples.fill(backlogs(qs, first, est_s=5.0), now_ms=1)
    assert [len(b.sample) for b in got] == [3, 1, 1, 1]  # never read in full: the head stands
    second = samples.reads(qs)
    assert second == [1, 3, 1, 1]  # m0 was read in full last round, m1..m3 never
    got = samples.fill(backlogs(qs, second, est_s=7.0), now_ms=2)
    assert got[0].sample == ((1.0, 5.0, 1),) * 3  # kept from round one, not the fresh head
    assert got[1].sample == ((1.0, 7.0, 1),) * 3
    assert [len(b.sample) for b in got[2:]] == [1, 1]


def test_queues_gone_from_the_index_are_forgotten() -> None:
    samples = Samples(budget=2)
    qs = queues(2, 2)
    samples.fill(backlogs(qs, samples.reads(qs), 1.0), now_ms=1)
    samples.fill(backlogs(qs[:1], samples.reads(qs[:1]), 1.0), now_ms=2)
    assert set(samples.kept) == {(2, "m0")}
