"""The worker: one process per GPU (loop, executor, heartbeat, GPU probe, model cache)."""

from gpuq.worker.loop import Worker

__all__ = ["Worker"]
