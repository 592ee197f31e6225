"""The work index: which (priority, model) queues have work, in the order claims look.

One sorted set (``Keys.models_with_work``) holds every (level, model) with queued work:
member ``"<p>:<model>"``, score ``p * LEVEL_SPAN`` plus its queue's head score (the start-by
time in ms, or the fair order with tenants). The levels lie in order, so a claim's first
read of the index says which levels have work (lib/queue.lua; one read instead of one per
level), and a level's models in head-score order are a score range. The scripts write it;
readers here page through one level at a time.

Releases before this one kept one index per level (``models:<p>``, member the model, score
the head score). The reaper's reap.lua moves what an older client still writes there into
this index each round, so a rolling upgrade strands no queued task.
"""

from __future__ import annotations

from typing import Any

from gpuq.keys import Keys

# Lua has the same number (lib/queue.lua; tests/unit/test_work_index.py checks). Head scores
# are ms of the scripts' clock, far inside +-LEVEL_SPAN / 2, and p * LEVEL_SPAN plus one stays
# an integer a double holds exactly (below 2**53).
LEVEL_SPAN = 10**15
LEVELS = "0123"  # a member's first character


def member(priority: int, model: str) -> str:
    return f"{priority}:{model}"


def score(priority: int, head: float) -> float:
    return priority * LEVEL_SPAN + head


def split(entry: str | bytes) -> tuple[int, str] | None:
    """A member as (priority, model); None for one gpuq never writes (a foreign write must
    not break the views or the reaper)."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    return (int(text[0]), text[2:]) if text[:1] in LEVELS and text[1:2] == ":" and text[2:] else None


def read_level(pipe: Any, keys: Keys, priority: int, start: int = 0, num: int = -1) -> None:
    """Queue on ``pipe`` the read of a level's members (``num`` from ``start``; -1: all), in
    head-score order; ``models`` turns the reply into model names."""
    lo = priority * LEVEL_SPAN - LEVEL_SPAN // 2
    pipe.zrangebyscore(keys.models_with_work, lo, f"({lo + LEVEL_SPAN}", start=start, num=num)


def models(reply: list[Any]) -> list[str]:
    """The model names of ``read_level``'s reply."""
    return [got[1] for e in reply if (got := split(e)) is not None]
