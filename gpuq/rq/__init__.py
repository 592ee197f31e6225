"""RQ interop (the optional ``gpuq[rq]`` extra): take an RQ producer's jobs into gpuq and write
their results back in RQ's format. docs/MIGRATING_FROM_RQ.md explains the flow.

- ``bridge``: ``gpuq rq-bridge`` moves jobs from RQ queues into gpuq tasks, reliably.
- ``handler``: the ``rq.job`` handler a worker runs them with (``gpuq worker --rq-allow``).
- ``unpickle``: the restricted pickle reader that keeps forged jobs from running code.
- ``context``: ``current_model()`` / ``current_context()`` for job functions.

Importing this package does not import rq; the modules that need it call ``support.require``.
"""

from gpuq.rq.context import RqContext, current_context, current_model

__all__ = ["RqContext", "current_context", "current_model"]
