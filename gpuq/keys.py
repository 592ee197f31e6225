"""Every Redis key name of a pool, built in one place.

All keys of a pool share the hash tag ``{pool}`` so every Lua script touches a single
Redis Cluster slot. ``SUFFIXES`` names each key after the pool's base (``gpuq:{pool}:``):
``Keys`` builds the names from it, and so do the Lua scripts, which receive the base as
their one key and get their key names generated from the same table (gpuq/lua_source.py);
docs/PROTOCOL.md tables them. No other module holds a key literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from string import Formatter

DEFAULT_PREFIX = "gpuq"


def live_reservation(value: str | bytes | None, now_ms: int) -> tuple[str, int] | None:
    """A reservation's task and expiry (ms), or None when there is none or it has expired.
    The expiry is in the value, not the key's TTL, so that a replay on a virtual clock sees
    it end at the same virtual time however fast it runs."""
    if not value:
        return None
    task, _, expires = (value.decode() if isinstance(value, bytes) else value).partition(" ")
    return (task, int(expires)) if expires.isdigit() and int(expires) > now_ms else None


# Each key's name after the pool's base; "{arg}" stands for an argument of its builder.
SUFFIXES: dict[str, str] = {
    "task": "task:{task_id}",
    "queue": "q:{priority}:{model}",
    "models_with_work": "models",
    "legacy_models_with_work": "models:{priority}",
    "done": "done:{task_id}",
    "stream": "stream:{task_id}",
    "worker": "worker:{worker_id}",
    "worker_tasks": "worker:{worker_id}:tasks",
    "wake": "wake:{worker_id}",
    "control": "ctl:{worker_id}",
    "reservation": "reserve:{worker_id}",
    "holders": "holders:{model}",
    "catalog_model": "model:{model}",
    "rq_taken": "rq:taken:{rq_queue}",
    "running": "running",
    "handed": "handed",
    "delayed": "delayed",
    "need": "need",
    "parked": "parked",
    "sla_misses": "misses",
    "failures": "failures",
    "lanes": "lanes",
    "serving": "serving:{level}",
    "capacities": "capacities",
    "deadlines": "deadlines",
    "scale": "scale",
    "settings": "settings",
    "workers": "workers",
    "registrations": "registrations",
    "idle": "idle",
    "pool_wake": "wake",
    "lookouts": "lookouts",
    "classes": "classes",
    "class_gpus": "classes:gpus",
    "handlers": "handlers",
    "catalog": "catalog",
    "fairness": "fair",
    "token": "token",
    "stats": "stats",
    "urgent": "urgent",
    "ended": "ended",
    "runtimes": "runtimes",
    "arrivals": "arrivals:{bucket}",
    "tenants": "tenants",
    "tenant_queued": "tenant:queued",
    "tenant_clock": "tenant:clock",
    "tenant_use": "tenant:use",
    "tenant_work": "tenant:work",
    "reaper_lock": "reaper",
    "children": "children:{task_id}",
    "waiting": "waiting",
    "schedules": "schedules",
    "schedule_fired": "schedules:fired",
}

# Arrival history (enqueue.lua writes, the reaper's forecast reads): one hash per bucket of
# this many ms of the scripts' clock, model -> tasks enqueued; each bucket expires this many
# seconds after its first write (a week of history for the weekly season, plus a day). The
# Lua side has the same two numbers (tests/unit/reaper/test_forecast.py checks).
ARRIVAL_BUCKET_MS = 60_000
ARRIVAL_TTL_S = 8 * 86400
# Tasks kept in `failures`, the newest (lib/failures.lua trims it to this many; a test checks).
FAILURES_KEPT = 100
# SLA misses kept in `misses`, the newest (lib/start.lua trims it to this many; a test checks).
MISSES_KEPT = 100
REQUIRED = " required"  # the policy field of the tenants hash: no tenant name holds a space
SLOTS = "slots"  # the tenant:clock field of the slots per live worker (no tenant field lacks a colon)


def suffix_parts(name: str) -> list[tuple[str, str | None]]:
    """A suffix as (literal text, argument name or None) pieces, in order."""
    return [(text, arg) for text, arg, _, _ in Formatter().parse(SUFFIXES[name])]


# the suffixes with their arguments by position, as Keys fills them in
_FORMATS = {name: "".join(text + ("{}" if arg else "") for text, arg in suffix_parts(name))
            for name in SUFFIXES}


@dataclass(frozen=True)
class Keys:
    pool: str
    prefix: str = DEFAULT_PREFIX

    @cached_property
    def base(self) -> str:
        """The pool's key base; every key is it plus a suffix of ``SUFFIXES``."""
        return f"{self.prefix}:{{{self.pool}}}:"

    def _key(self, name: str, *args: object) -> str:
        return self.base + _FORMATS[name].format(*args)

    def task(self, task_id: str) -> str:
        return self._key("task", task_id)

    def queue(self, priority: int, model: str) -> str:
        """Queued task ids of one (priority, model), scored by start-by time in ms."""
        return self._key("queue", priority, model)

    @property
    def models_with_work(self) -> str:
        """Index: (priority, model) pairs with queued work, ordered by priority, then by their
        queue's head score (gpuq/work_index.py)."""
        return self._key("models_with_work")

    def legacy_models_with_work(self, priority: int) -> str:
        """The per-priority index of releases before the one above; the reaper folds what an
        older client still writes there into it (gpuq/work_index.py)."""
        return self._key("legacy_models_with_work", priority)

    def done(self, task_id: str) -> str:
        """List a result waiter blocks on; pushed when a task a waiter registered for
        (wait.lua) ends, or by the registration after the end."""
        return self._key("done", task_id)

    def stream(self, task_id: str) -> str:
        """A task's stream of chunks (XADD by emit.lua; the end marker by whatever ends the
        task), read from the start by any number of readers (docs/PROTOCOL.md, Streams)."""
        return self._key("stream", task_id)

    def worker(self, worker_id: str) -> str:
        return self._key("worker", worker_id)

    def worker_tasks(self, worker_id: str) -> str:
        return self._key("worker_tasks", worker_id)

    def wake(self, worker_id: str) -> str:
        return self._key("wake", worker_id)

    def control(self, worker_id: str) -> str:
        """Messages to a worker's heartbeat thread: "yield <task>", "preload <model> <gb>", "drain"."""
        return self._key("control", worker_id)

    def reservation(self, worker_id: str) -> str:
        """The queued task the preemption planner reserved this worker for, and until when:
        "<task> <expires ms>" (read with ``live_reservation``)."""
        return self._key("reservation", worker_id)

    def holders(self, model: str) -> str:
        """Workers that hold a model loaded."""
        return self._key("holders", model)

    def catalog_model(self, model: str) -> str:
        return self._key("catalog_model", model)

    def rq_taken(self, rq_queue: str) -> str:
        """RQ job ids an rq bridge took from an RQ queue and has not yet handed to gpuq. It
        lives on RQ's Redis (LMOVE needs both lists on one server), never in a script."""
        return self._key("rq_taken", rq_queue)

    @property
    def running(self) -> str:
        """Running task ids scored by lease expiry (ms)."""
        return self._key("running")

    @property
    def handed(self) -> str:
        """Tasks handed over at enqueue, scored by their pickup deadline (ms), until their worker
        takes them up (began, or a beat before a cold load) or a claim or the reaper takes
        them back past that deadline."""
        return self._key("handed")

    @property
    def delayed(self) -> str:
        """Tasks due later, scored by due time (ms): retries waiting out their backoff, tasks
        enqueued with a delay, children their parents just released (state delayed)."""
        return self._key("delayed")

    @property
    def need(self) -> str:
        """Queued task ids scored by their shape (``gpuq.shapes``: VRAM need in GB, plus GPUs
        x 2**40 for a task across several): finds tasks no GPU or group can hold."""
        return self._key("need")

    @property
    def parked(self) -> str:
        """Queued task ids no live worker can hold, out of their queues, scored as in
        ``need``: its share of them (lua/park.lua)."""
        return self._key("parked")

    @property
    def sla_misses(self) -> str:
        """The latest SLA misses, newest first (MISSES_KEPT): JSON {id, priority, model, wait_s,
        at, kind: "late" (claimed, or a warm hand-over taken up, after its start-by time) | "cold"
        (claimed in time, its handler started after it: a model load between) | "expired"}."""
        return self._key("sla_misses")

    @property
    def failures(self) -> str:
        """The latest tasks that ended failed, newest first (FAILURES_KEPT): JSON {id,
        handler, model, priority, tenant, attempt, error (its first 200 bytes), at}."""
        return self._key("failures")

    @property
    def lanes(self) -> str:
        """Workers not offered every task: id -> levels (a dedicated lane, e.g. "01"), then the
        models its claims skip with their ends (lib/lanes.lua)."""
        return self._key("lanes")

    def serving(self, level: int | str) -> str:
        """Live workers serving priority level 0..3 (a set; read by the wake rule while lanes exist)."""
        return self._key("serving", level)

    @property
    def capacities(self) -> str:
        """Live workers' fixed capacity: id -> "<usable GB> <gpus> <levels>" (lib/holders.lua
        reads a model's busy holders' in one HMGET)."""
        return self._key("capacities")

    @property
    def deadlines(self) -> str:
        """Queued task ids that have a deadline, scored by their latest start (deadline - est, ms)."""
        return self._key("deadlines")

    @property
    def scale(self) -> str:
        """Scale signals: "class:<gpu>" / "model:<name>" -> JSON {current, desired, reason}."""
        return self._key("scale")

    @property
    def settings(self) -> str:
        """Pool-wide settings the reaper publishes for workers (min_workers)."""
        return self._key("settings")

    @property
    def workers(self) -> str:
        """Live workers scored by heartbeat expiry (ms)."""
        return self._key("workers")

    @property
    def registrations(self) -> str:
        """Worker registrations so far (INCR on each): a reader that keeps workers' fixed
        fields reads them again once it moves (a worker may start again under its id)."""
        return self._key("registrations")

    @property
    def idle(self) -> str:
        """Workers with a free slot, scored by claimable VRAM (GB)."""
        return self._key("idle")

    @property
    def pool_wake(self) -> str:
        return self._key("pool_wake")

    @property
    def lookouts(self) -> str:
        """Per worker shape, the idle worker that looks again when a deferral ends:
        "<claimable GB> <levels> <gpus>" -> "<due ms> <worker>" (lib/lookout.lua)."""
        return self._key("lookouts")

    @property
    def classes(self) -> str:
        """GPU classes ever registered: name -> usable VRAM (GB)."""
        return self._key("classes")

    @property
    def class_gpus(self) -> str:
        """GPU classes of multi-GPU workers: name -> GPUs in each worker's group (a class
        not listed is of one-GPU workers)."""
        return self._key("class_gpus")

    @property
    def handlers(self) -> str:
        """Handler names ever registered by a worker of the pool (a set; enqueue's check_fit)."""
        return self._key("handlers")

    @property
    def catalog(self) -> str:
        """Set of model names the catalog knows."""
        return self._key("catalog")

    @property
    def fairness(self) -> str:
        return self._key("fairness")

    @property
    def token(self) -> str:
        return self._key("token")

    @property
    def stats(self) -> str:
        return self._key("stats")

    @property
    def urgent(self) -> str:
        """One token while online or nearline work waits that no idle worker was woken for:
        the active reaper blocks on it between rounds and plans preemption at once."""
        return self._key("urgent")

    @property
    def ended(self) -> str:
        """Tasks enqueued with report_end that ended other than succeeded (LPUSH by the
        scripts' finish), or went back to their queue from a dead worker or a lost lease
        (reap), newest first: their producer (the rq bridge) reports it."""
        return self._key("ended")

    @property
    def runtimes(self) -> str:
        """Learned run times: "<handler> <model>" -> "<mean_s> <p90_s> <samples>", decayed over
        successful runs whose handler times workers measured and sent with their heartbeat
        (learn.lua; read by enqueue.lua and ``gpuq.views.inspect.parse_runtime``)."""
        return self._key("runtimes")

    def arrivals(self, bucket: int) -> str:
        """Tasks enqueued per model in bucket ``bucket`` (now_ms // ARRIVAL_BUCKET_MS):
        model -> count (enqueue.lua, HINCRBY once per model per call; read by the scaler)."""
        return self._key("arrivals", bucket)

    @property
    def tenants(self) -> str:
        """Registered tenants: name -> "<weight> <max_gpus> <max_vram_gb>" ("-": no cap), and
        the field " required" ("1": enqueue refuses unregistered tenants; no name has a space).
        Tenancy is on while it exists (lua/lib/tenancy.lua; ``gpuq.tenants``)."""
        return self._key("tenants")

    @property
    def tenant_queued(self) -> str:
        """"<p>:<tenant>" -> that tenant's tasks queued at level p since tenancy was on (each
        carries `fair` = the field, and leaves the count with its queue)."""
        return self._key("tenant_queued")

    @property
    def tenant_clock(self) -> str:
        """While tenancy is on: "<p>" -> the level's lag (ms); "<p>:<tenant>" -> the finish
        tag (epoch ms) of that tenant's last task queued at level p: where its next task goes
        while it has a backlog; "slots" -> the slots per live worker (the reaper's)."""
        return self._key("tenant_clock")

    @property
    def tenant_use(self) -> str:
        """Limited tenants' running use: "tasks:<tenant>", "gpus:<tenant>" (the GPUs they run
        across), "vram:<tenant>" (GB); and
        "bound:<tenant>" -> the running tasks the reaper lets it have (lib/quota.lua)."""
        return self._key("tenant_use")

    @property
    def tenant_work(self) -> str:
        """While tenancy is on: tenant -> the est_s of every task it enqueued (a running
        total, HINCRBYFLOAT), the reaper's measure of its demand (gpuq.reaper.tenant_room)."""
        return self._key("tenant_work")

    @property
    def reaper_lock(self) -> str:
        return self._key("reaper_lock")

    def children(self, task_id: str) -> str:
        """Tasks enqueued with ``after`` naming this one while it had not ended (a set;
        ended with the parent's TTL): released or canceled when it ends (lua/lib/deps.lua)."""
        return self._key("children", task_id)

    @property
    def waiting(self) -> str:
        """Tasks waiting for their parents (state waiting), scored by enqueue time (ms)."""
        return self._key("waiting")

    @property
    def schedules(self) -> str:
        """Periodic tasks: name -> JSON {every_ms | cron, skip_missed, anchor_ms, task}
        (``gpuq.schedule``; fire.lua enqueues their runs)."""
        return self._key("schedules")

    @property
    def schedule_fired(self) -> str:
        """name -> the period (epoch ms) of a schedule's last run enqueued or skipped."""
        return self._key("schedule_fired")

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of the pool (inspection and tests only)."""
        return self.base + "*"
