"""The discrete-event engine: simulated GPUs on a virtual clock, driving a scheduler.

Events are arrivals, run ends, claim retries and (for gpuq) the reaper's rounds. A simulated
GPU is a worker with one slot and the production model cache (``ModelCache``: the VRAM ledger,
LRU eviction of idle models); instead of sleeping it schedules its own end: a cold model
takes a load time drawn from the measured load trace, then the task runs for its service
time. An idle GPU claims when the scheduler woke it (for gpuq: a token on its own or the
pool's wake list, exactly what a real worker blocks on), when a run ends (the worker's
ack-then-claim), or when its last claim told it to look again (its shape's lookout, when a
deferred task's bound passes: lib/lookout.lua; as a real worker, only the last claim's time
stands). Unlike a real worker it does not look every idle_block_s. A yield request (the reaper's
preemption plan) is honoured at once while the task runs: the run stops, its progress goes
back as the checkpoint, and the next run resumes from there. One that comes while the task
loads its model is honoured when the load ends (the handler's first check), unless it was
withdrawn by then; if the grace passes first, the worker stops the task and the load is lost.
A task's handler starts when its model is loaded (the SLA's measure), noted when its run
stops; after a cold start the GPU reports that start (began.lua), as a worker does. When the
reaper's rounds and passes run is ``gpuq.sim.rounds``'s; its scale step runs every round
(``gpuq.sim.hints``), or with an autoscaler (``gpuq.sim.autoscale``: GPUs join and leave the
pool) at its cadence, and the GPUs take its warm hints as a worker does (``gpuq.sim.control``:
a preload loads while the GPU stays free to claim).

As a worker, a GPU holds a task's model from its load's start (a preload's once loaded) and
records the load in the catalog when it ends. Simplifications, stated: workers never die
(leases are long, so the reaper's recovery has nothing to do); one task at a time per GPU.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpuq.app import App
from gpuq.config import Config
from gpuq.scripts import ClaimRequest
from gpuq.sim.autoscale import Autoscale, Autoscaler
from gpuq.sim.control import Control
from gpuq.sim.hints import Steps
from gpuq.sim.model import SimResult, SimTask, TraceTask, devices_of
from gpuq.sim.policies import GpuqScheduler, Offer, Scheduler
from gpuq.sim.rounds import Rounds
from gpuq.worker.models import ModelCache, Reservation

EPOCH_MS = 1_800_000_000_000  # virtual time 0 (any fixed instant: scripts only compare times)
LoadTime = Callable[[str], float]  # model -> seconds to load it cold
# (time, when it was queued, seq, kind, key, generation): simultaneous events run in the
# order they were queued, as a queue of seq alone would run them; the time queued lets a
# round put back after a skip take the place it would have had
Event = tuple[float, float, int, str, str, int]


@dataclass
class Run:
    offer: Offer
    res: Reservation
    work_from: float  # when the task's own work starts (after a cold load)
    end: float
    claimed: float
    load: tuple[str, float, float] | None = None  # a cold load's model, footprint, seconds


@dataclass
class SimWorker:
    id: str
    total_gb: float
    cache: ModelCache
    levels: str = "0123"  # priorities it serves (a dedicated lane serves fewer)
    run: Run | None = None
    generation: int = 0  # bumps when a run ends early, so its stale end event is ignored
    busy: list[tuple[float, float]] = field(default_factory=list)
    loading_s: float = 0.0  # of the busy time, loading models (cut short by a yield)
    joined_s: float = 0.0  # when it joined the pool
    gone: bool = False  # it left the pool (autoscaler)
    devices: int = 1  # GPUs in its group
    lookout: bool = False  # its last claim said when to look again (lib/lookout.lua)
    retry_at: float | None = None  # when, if so: an earlier claim's retry no longer stands
    # model -> (when its preload ends, its load time, its reservation): the GPU claims meanwhile
    preloading: dict[str, tuple[float, float, Reservation]] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return self.run is None


class Engine:
    def __init__(self, scheduler: Scheduler, gpus: list[tuple[str, float]], tasks: list[TraceTask],
                 load_time: LoadTime, config: Config, autoscale: Autoscale | None = None) -> None:
        self.scheduler = scheduler
        self.config = config
        self.load_time = load_time
        self.now = 0.0
        self.app = App("sim")
        self.app.any_model()(lambda name: name)
        self.autoscaler: Autoscaler | None = Autoscaler(self, autoscale) if autoscale else None
        if self.autoscaler is not None:
            gpus = self.autoscaler.initial()
        self.workers = [self.new_worker(wid, gb) for wid, gb in gpus]
        self.fleet = list(self.workers)  # every GPU the replay had, those that left included
        self.busy = 0  # of the live GPUs, those running a task (the others idle)
        self.by_id = {w.id: w for w in self.workers}
        self.trace: dict[str, TraceTask] = {f"t{i:06d}": t for i, t in enumerate(tasks)}
        self.records = {tid: SimTask(tid, t.priority, t.model, t.vram_gb, t.arrival_s, t.est_s,
                                     t.service_s, tenant=t.tenant) for tid, t in self.trace.items()}
        self.events: list[Event] = []
        self.seq = 0
        self.loads = 0
        self.preemptions: dict[str, int] = {}
        self.arrivals_left = len(tasks)
        self.rounds = Rounds(self)
        self.control = Control(self)
        self.steps = Steps(self)  # after the trace, the pool and the rounds: it reads them
        self.longest_load = 0.0  # expiry looks this far ahead for cold loads
        self.claims: list[str] = []  # task ids in the order GPUs claimed them

    def new_worker(self, wid: str, gb: float) -> SimWorker:
        devices = devices_of(wid)  # a group keeps the KV reserve on each of its GPUs
        return SimWorker(wid, gb, ModelCache(self.app, gb, self.config.kv_reserve_gb * devices),
                         wid.partition("@")[2] or "0123", joined_s=self.now, devices=devices)

    # -- the clock -----------------------------------------------------------------------
    def at(self, t: float, kind: str, key: str = "", gen: int = 0, queued: float | None = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.now if queued is None else queued, self.seq, kind, key, gen))

    def stale(self, event: Event) -> bool:
        """A round's event superseded by a skip or by the cadence's return."""
        return event[3] == "tick" and event[2] != self.rounds.seq

    def stuck(self) -> bool:
        """After a round that changed nothing: whether the tasks still queued can never run
        (a tenant capped at 0, a priority no lane serves). Nothing runs, arrives, can expire
        or is due but the reaper's rounds, which keep coming while tasks are queued: the
        replay ends, those tasks starved, where it would otherwise never end."""
        return (self.arrivals_left == 0 and self.rounds.queued_deadlines == 0
                and next(self.running(), None) is None
                and all(e[3] in ("tick", "plan") for e in self.events if not self.stale(e)))

    def ms(self, t: float | None = None) -> int:
        return EPOCH_MS + int(round((self.now if t is None else t) * 1000))

    def seconds(self, ms: int) -> float:
        """The virtual time of a time the scripts wrote (``ms``'s inverse)."""
        return (ms - EPOCH_MS) / 1000

    def run(self) -> SimResult:
        started = time.perf_counter()
        self.scheduler.register([(w.id, w.total_gb, w.levels, w.devices) for w in self.workers],
                                self.ms(0.0))
        for w in self.workers:  # a real worker claims once on start, then blocks for wakes
            self.claim(w)
        for tid, t in self.trace.items():
            self.at(t.arrival_s, "arrive", tid)
        if self.autoscaler is not None:
            self.autoscaler.start()
        while self.events:
            event = heapq.heappop(self.events)
            if self.stale(event):
                continue
            if self.steps.before(event[0]):  # a step queued an event: take them in order
                heapq.heappush(self.events, event)
                continue
            self.now, queued, _, kind, key, gen = event
            self.steps.touch()
            if kind != "tick":  # it may change the pool: rounds may decide again
                self.rounds.resume(queued)
            if kind == "arrive":
                self.arrivals_left -= 1
                urgent = self.scheduler.submit(key, self.trace[key], self.ms())
                self.steps.arrived(self.trace[key])
                self.rounds.count_queued(self.trace[key], +1)
                self.rounds.ensure()
                if urgent:
                    self.rounds.urgent()
                while self.events and self.stale(self.events[0]):
                    heapq.heappop(self.events)
                if self.events and self.events[0][0] == self.now and self.events[0][3] == "arrive":
                    continue  # simultaneous arrivals are all queued before anyone claims
            elif kind == "end":
                self.end(self.by_id[key], gen)
                continue  # the ending worker claimed; no new wake tokens
            elif kind == "yield":
                self.deferred_yield(self.by_id[key], gen)
            elif kind == "began":
                self.control.began(self.by_id[key], gen)
            elif kind == "retry":
                worker = self.by_id[key]
                if worker.run is None and not worker.gone and worker.retry_at == self.now:
                    self.claim(worker)
                self.dispatch()
                continue
            elif kind == "tick":
                changed = self.rounds.tick()
                if not (self.dispatch() or changed):
                    if self.stuck():
                        break
                    self.rounds.skip()
                continue
            elif kind == "scale":
                assert self.autoscaler is not None
                self.autoscaler.tick()
            elif kind == "boot":
                assert self.autoscaler is not None
                self.autoscaler.boot(key)
            elif kind == "preloaded":
                wid, _, model = key.partition(" ")
                self.control.preloaded(self.by_id[wid], model)
            elif kind == "plan":
                assert isinstance(self.scheduler, GpuqScheduler)
                self.apply(self.scheduler.plan(self.ms()))
                self.rounds.plan_when_quiet_ends()
            self.dispatch()
        return self.result(time.perf_counter() - started)

    # -- workers -------------------------------------------------------------------------
    def dispatch(self) -> bool:
        """Idle GPUs that were woken claim, in a fixed order (the run is deterministic).
        Whether any was woken."""
        woken = self.scheduler.woken(len(self.workers) - self.busy,
                                     lambda: [w.id for w in self.workers if w.run is None])
        for wid, look in woken.items():
            worker = self.by_id[wid]
            if worker.run is None:
                worker.lookout = worker.lookout or look
                self.claim(worker)
        return bool(woken)

    def claim(self, w: SimWorker, finished: Offer | None = None) -> None:
        """The worker claims; a task left for a better-placed GPU is looked at again when
        its deferral ends. finished: the task the worker just ended, acked with this claim."""
        cache = w.cache
        free_gb, evictable_gb, loaded, in_use, loading = cache.ledger()  # one pass, not five
        req = ClaimRequest(w.id, free_gb, evictable_gb, 1, loaded, w.levels, w.devices, in_use,
                           lookout=w.lookout, loading=loading)
        got = self.scheduler.claim(w.id, req, self.ms(), finished)
        w.lookout = not isinstance(got, Offer) and got > 0
        w.retry_at = None  # a real worker's wait is timed from its last claim
        if not isinstance(got, Offer):
            if got > 0:  # a task was left for a better-placed GPU until then
                w.retry_at = self.now + got
                self.at(w.retry_at, "retry", w.id)
            return
        task = self.trace[got.task_id]
        res = cache.reserve(task.model, task.vram_gb)
        if res is None:
            raise RuntimeError(f"{self.scheduler.name} gave {w.id} task {got.task_id}, which does not fit")
        for old in res.evict:  # a simulated unload takes no time
            cache.unload(old)
        work_from = self.now
        if task.model in w.preloading:  # the handler waits for the preload's end
            work_from = w.preloading[task.model][0]
        else:
            cache.resident[task.model].ready.set()
        load = None
        if res.cold:
            seconds = self.load_time(task.model)
            self.longest_load = max(self.longest_load, seconds)
            work_from += seconds
            self.loads += 1
            load = (task.model, task.vram_gb, seconds)
        end = work_from + max(0.0, task.service_s - got.done_s)
        w.run = Run(got, res, work_from, end, self.now, load)
        if isinstance(self.scheduler, GpuqScheduler):
            if res.cold or res.evict:
                self.scheduler.hold(w.id, [r.spec.name for r in res.evict], task.model if res.cold else "")
            if got.cold or load:  # before a yield deferred to the load's end, as a worker reports
                self.at(work_from, "began", w.id, w.generation)
        self.busy += 1
        self.rounds.count_queued(task, -1)
        self.claims.append(got.task_id)
        record = self.records[got.task_id]
        if record.start_s is None:
            record.start_s = self.now
        record.worker = w.id
        self.at(end, "end", w.id, w.generation)
        self.rounds.ensure()  # a running lower-priority task may now be worth planning around

    def add_worker(self, wid: str, gb: float) -> None:
        """A GPU joins: it registers and claims once, as a worker process starts."""
        w = self.new_worker(wid, gb)
        self.workers.append(w)
        self.fleet.append(w)
        self.by_id[wid] = w
        self.scheduler.register([(wid, gb, w.levels, w.devices)], self.ms())
        self.claim(w)

    @property
    def live(self) -> list[SimWorker]:
        return self.workers

    def waiting(self) -> int:
        """Tasks queued (gpuq only: the reaper's rounds count them)."""
        return sum(self.rounds.queued)

    def retire(self, wid: str) -> None:
        """An idle GPU leaves, as a retiring worker does (gpuq only)."""
        w = self.by_id[wid]
        assert isinstance(self.scheduler, GpuqScheduler) and w.run is None
        self.scheduler.leave(w.id, w.cache.model_names())
        self.workers.remove(w)
        w.gone = True

    def running(self) -> Iterator[TraceTask]:
        return (self.trace[w.run.offer.task_id] for w in self.workers if w.run is not None)

    def stop_run(self, w: SimWorker) -> Run:
        run = w.run
        assert run is not None
        record = self.records[run.offer.task_id]
        if record.exec_s is None and self.now >= run.work_from:  # its handler started
            record.exec_s, record.load_wait_s = run.work_from, run.work_from - run.claimed
            record.cold_start = run.res.cold
        w.cache.release(run.res)
        w.busy.append((run.claimed, self.now))
        w.loading_s += min(self.now, run.work_from) - run.claimed
        w.run = None
        self.busy -= 1
        w.generation += 1
        return run

    def end(self, w: SimWorker, gen: int) -> None:
        if gen != w.generation or w.run is None:
            return  # it yielded before this end came
        run = self.stop_run(w)
        record = self.records[run.offer.task_id]
        record.end_s, record.outcome = self.now, "succeeded"
        self.claim(w, run.offer)  # the worker sends its ack and its next claim together

    # -- the reaper's decisions (gpuq only) ----------------------------------------------
    def apply(self, done: dict[str, int]) -> None:
        """Count a reaper pass's decisions and hand its yield requests to the workers."""
        assert isinstance(self.scheduler, GpuqScheduler)
        for kind, n in done.items():  # the planner's "reserved" and "yield" (asked to yield)
            if kind != "expired":
                name = "yield_requested" if kind == "yield" else kind
                self.preemptions[name] = self.preemptions.get(name, 0) + n
        if done.get("yield"):  # only the planner's yield requests reach workers here
            self.control.deliver(running_only=True)

    def deliver(self) -> None:
        self.control.deliver()

    def deferred_yield(self, w: SimWorker, gen: int) -> None:
        """A yield request that came during a load, at the load's end or at its grace."""
        assert isinstance(self.scheduler, GpuqScheduler)
        if gen != w.generation or w.run is None:
            return  # the run ended first
        if not self.scheduler.asked_to_yield(w.run.offer.task_id):
            return  # withdrawn: the task it was for started elsewhere or ended
        self.give_way(w, "yielded" if self.now >= w.run.work_from else "stopped")

    def give_way(self, w: SimWorker, how: str) -> None:
        """The run yields (its progress kept as its checkpoint) or is stopped mid-load (the
        worker's own enforcement of the grace; the load is lost); the GPU claims again."""
        assert isinstance(self.scheduler, GpuqScheduler)
        run = self.stop_run(w)
        if how == "yielded":
            done = run.offer.done_s + max(0.0, self.now - run.work_from)
            back = self.scheduler.yield_task(run.offer, done, self.ms())
        else:
            back = self.scheduler.stop_task(run.offer, self.ms())
        task = self.trace[run.offer.task_id]
        if back == "queued":
            self.rounds.count_queued(task, +1)
        elif back == "expired":  # its deadline can no longer be met: it ended
            self.rounds.take_off_expired(task)
        self.records[run.offer.task_id].preemptions += 1
        self.preemptions[how] = self.preemptions.get(how, 0) + 1
        self.claim(w)

    # -- the result ----------------------------------------------------------------------
    def result(self, wall_s: float) -> SimResult:
        if isinstance(self.scheduler, GpuqScheduler):
            self.read_outcomes(self.scheduler)
        ends = [r.end_s for r in self.records.values() if r.end_s is not None]
        first = min((t.arrival_s for t in self.trace.values()), default=0.0)
        c = self.config
        fleet = self.fleet
        return SimResult(
            policy=self.scheduler.name, speedup=1.0, gpus=[(w.id, w.total_gb) for w in fleet],
            sla_s=[c.sla_p0_s, c.sla_p1_s, c.sla_p2_s, None], tasks=list(self.records.values()),
            busy_s={w.id: sum(b - a for a, b in w.busy) for w in fleet},
            loading_s={w.id: w.loading_s for w in fleet},
            busy_intervals={w.id: w.busy for w in fleet}, model_loads=self.loads,
            preemptions=dict(self.preemptions), makespan_s=max(ends, default=first) - first,
            wall_s=wall_s, claims=list(self.claims), kv_reserve_gb=c.kv_reserve_gb,
            autoscale=None if self.autoscaler is None else self.autoscaler.figures(max(ends, default=first)))

    def read_outcomes(self, scheduler: GpuqScheduler) -> None:
        """Expired and never-run tasks, as the pool recorded them."""
        pipe = scheduler.redis.pipeline(transaction=False)
        ids = [tid for tid, r in self.records.items() if r.outcome == "unfinished"]
        for tid in ids:
            pipe.hmget(scheduler.keys.task(tid), "state", "finished_at")
        for tid, (state, finished) in zip(ids, pipe.execute()):
            record = self.records[tid]
            if state == "expired":
                record.outcome = "expired"
                record.end_s = (int(finished) - EPOCH_MS) / 1000
