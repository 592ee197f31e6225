"""The reaper: one active per pool (the others stand by on a lock with expiry)."""

from gpuq.reaper.loop import Reaper

__all__ = ["Reaper"]
