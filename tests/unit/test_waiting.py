"""gpuq.producer.Waiting.pause: how a result wait rides out a Redis outage."""

from __future__ import annotations

import pytest

from gpuq import producer
from gpuq.errors import AuthenticationFailed, ConnectionFailed, NoMaster
from gpuq.producer import Waiting

LOST = ConnectionFailed("redis://h:1/0", "Connection closed by server.")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(producer.time, "monotonic", c.monotonic)
    return c


def test_pauses_double_to_two_seconds_then_the_outage_bound_raises(clock: Clock) -> None:
    w = Waiting("t", None)
    pauses = []
    with pytest.raises(ConnectionFailed):
        while True:
            pauses.append(w.pause(LOST))
            clock.now += pauses[-1]
    assert pauses[:6] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert sum(pauses) <= Waiting.OUTAGE_S < sum(pauses) + 2.0


def test_an_answer_starts_the_next_outage_afresh(clock: Clock) -> None:
    w = Waiting("t", None)
    for _ in range(5):
        clock.now += w.pause(LOST)
    w.answered()
    assert w.pause(LOST) == 0.1


def test_a_pause_never_runs_past_the_timeout(clock: Clock) -> None:
    w = Waiting("t", 0.5)
    clock.now += w.pause(LOST)  # 0.1
    clock.now += w.pause(LOST)  # 0.2: 0.3 s gone
    with pytest.raises(ConnectionFailed):
        w.pause(LOST)  # 0.4 more would end past 0.5


def test_only_a_lost_connection_or_a_missing_master_is_waited_out(clock: Clock) -> None:
    w = Waiting("t", None)
    assert w.pause(NoMaster("redis+sentinel://h:1/m", "no master yet")) == 0.1
    with pytest.raises(AuthenticationFailed):
        w.pause(AuthenticationFailed("redis://h:1/0", "WRONGPASS"))
