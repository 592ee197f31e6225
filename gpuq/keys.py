"""Every Redis key name of a pool, built in one place.

All keys of a pool share the hash tag ``{pool}`` so every Lua script touches a single
Redis Cluster slot. Scripts receive the pool's base (``gpuq:{pool}:``) as a key and build
per-task and per-queue names from it with the same suffixes as below; docs/PROTOCOL.md
tables them. No other module holds a key literal.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "gpuq"


def live_reservation(value: str | bytes | None, now_ms: int) -> tuple[str, int] | None:
    """A reservation's task and expiry (ms), or None when there is none or it has expired.
    The expiry is in the value, not the key's TTL, so that a replay on a virtual clock sees
    it end at the same virtual time however fast it runs."""
    if not value:
        return None
    task, _, expires = (value.decode() if isinstance(value, bytes) else value).partition(" ")
    return (task, int(expires)) if expires.isdigit() and int(expires) > now_ms else None


@dataclass(frozen=True)
class Keys:
    pool: str
    prefix: str = DEFAULT_PREFIX

    @property
    def base(self) -> str:
        """The pool's key base; scripts append the suffixes below to it."""
        return f"{self.prefix}:{{{self.pool}}}:"

    def task(self, task_id: str) -> str:
        return f"{self.base}task:{task_id}"

    def queue(self, priority: int, model: str) -> str:
        """Queued task ids of one (priority, model), scored by start-by time in ms."""
        return f"{self.base}q:{priority}:{model}"

    def models_with_work(self, priority: int) -> str:
        """Index: models with queued work at a priority, scored by their queue's head score."""
        return f"{self.base}models:{priority}"

    def done(self, task_id: str) -> str:
        """List a result waiter blocks on; pushed once when the task ends."""
        return f"{self.base}done:{task_id}"

    def worker(self, worker_id: str) -> str:
        return f"{self.base}worker:{worker_id}"

    def worker_tasks(self, worker_id: str) -> str:
        return f"{self.base}worker:{worker_id}:tasks"

    def wake(self, worker_id: str) -> str:
        return f"{self.base}wake:{worker_id}"

    def control(self, worker_id: str) -> str:
        """Control messages to a worker, read by its heartbeat thread: "yield <task>",
        "preload <model> <vram_gb>", "drain"."""
        return f"{self.base}ctl:{worker_id}"

    def reservation(self, worker_id: str) -> str:
        """The queued task the preemption planner reserved this worker for, and until when:
        "<task> <expires ms>" (read with ``live_reservation``)."""
        return f"{self.base}reserve:{worker_id}"

    def holders(self, model: str) -> str:
        """Workers that hold a model loaded."""
        return f"{self.base}holders:{model}"

    def catalog_model(self, model: str) -> str:
        return f"{self.base}model:{model}"

    @property
    def running(self) -> str:
        """Running task ids scored by lease expiry (ms)."""
        return f"{self.base}running"

    @property
    def handed(self) -> str:
        """Tasks handed over at enqueue, scored by their pickup deadline (ms), until a claim or
        the reaper finds them picked up (popped off the worker's wake list) or ended."""
        return f"{self.base}handed"

    @property
    def delayed(self) -> str:
        """Tasks waiting out a retry backoff, scored by ready time (ms)."""
        return f"{self.base}delayed"

    @property
    def need(self) -> str:
        """Queued task ids scored by VRAM need (GB): finds tasks no GPU can fit."""
        return f"{self.base}need"

    @property
    def sla_misses(self) -> str:
        """The latest SLA misses, newest first (capped): JSON {id, priority, model, wait_s,
        at, kind: "late" (started after its start-by time) | "expired"}."""
        return f"{self.base}misses"

    @property
    def lanes(self) -> str:
        """Workers serving only some priorities (dedicated lanes): id -> levels, e.g. "01"."""
        return f"{self.base}lanes"

    @property
    def deadlines(self) -> str:
        """Queued task ids that have a deadline, scored by their latest start (deadline - est, ms)."""
        return f"{self.base}deadlines"

    @property
    def scale(self) -> str:
        """Scale signals: "class:<gpu>" / "model:<name>" -> JSON {current, desired, reason}."""
        return f"{self.base}scale"

    @property
    def settings(self) -> str:
        """Pool-wide settings the reaper publishes for workers (min_workers)."""
        return f"{self.base}settings"

    @property
    def workers(self) -> str:
        """Live workers scored by heartbeat expiry (ms)."""
        return f"{self.base}workers"

    @property
    def idle(self) -> str:
        """Workers with a free slot, scored by claimable VRAM (GB)."""
        return f"{self.base}idle"

    @property
    def pool_wake(self) -> str:
        return f"{self.base}wake"

    @property
    def classes(self) -> str:
        """GPU classes ever registered: name -> usable VRAM (GB)."""
        return f"{self.base}classes"

    @property
    def handlers(self) -> str:
        """Handler names ever registered by a worker of the pool (a set; enqueue's check_fit)."""
        return f"{self.base}handlers"

    @property
    def catalog(self) -> str:
        """Set of model names the catalog knows."""
        return f"{self.base}catalog"

    @property
    def fairness(self) -> str:
        return f"{self.base}fair"

    @property
    def token(self) -> str:
        return f"{self.base}token"

    @property
    def stats(self) -> str:
        return f"{self.base}stats"

    def rq_taken(self, rq_queue: str) -> str:
        """RQ job ids an rq bridge took from an RQ queue and has not yet handed to gpuq. It
        lives on RQ's Redis (LMOVE needs both lists on one server), never in a script."""
        return f"{self.base}rq:taken:{rq_queue}"

    @property
    def urgent(self) -> str:
        """One token while online or nearline work waits that no idle worker was woken for:
        the active reaper blocks on it between rounds and plans preemption at once."""
        return f"{self.base}urgent"

    @property
    def rq_ended(self) -> str:
        """Tasks made from RQ jobs that ended other than succeeded, newest first (LPUSH by the
        scripts' finish), for the rq bridge to write the outcome back to RQ."""
        return f"{self.base}rq:ended"

    @property
    def reaper_lock(self) -> str:
        return f"{self.base}reaper"

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of the pool (inspection and tests only)."""
        return f"{self.prefix}:{{{self.pool}}}:*"
