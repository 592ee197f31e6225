"""A warm hand-over's taking up, off its handler's path (docs/PROTOCOL.md, Hand-over).

``began`` takes a hand-over up and decides its SLA. For a hand-over to a worker holding its
model it is written on a connection of its own just before the handler starts, and not
waited for: the handler runs at once. Whoever comes first reads its reply: the take-up
thread, as soon as it comes (a long handler), or the runner with the run's ack, fail or
requeue, which it sends on the same connection, after began (a short one: the server runs
began first, and the waiter's result does not wait for began's reply). A stale token (the
hand-over was taken back at its pickup deadline: another worker may run it) makes the run
a lost run, told to the worker's control as a cancel is ("lost"): ``ctx.should_stop()``,
stopped past the grace, its ack fenced off, counted lost. A cold hand-over is taken up
before its load (Executor.take_up), where a round trip costs nothing next to the load.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from gpuq.clock import from_time_reply
from gpuq.errors import GpuqError, StaleLease, TaskNotFound
from gpuq.functions import missing
from gpuq.scripts import Call, Calls, Scripts
from gpuq.wire import check, pack, read_replies
from gpuq.worker.observer import Observer
from gpuq.worker.presence import Presence
from gpuq.worker.running import Running

log = logging.getLogger(__name__)


def handed_over(message: object) -> dict[str, str] | None:
    """The fields of a task handed over at enqueue, if a wake list entry is one (a JSON
    object; the other entries are plain tokens)."""
    text = str(message)
    if not text.startswith("{"):
        return None
    return {str(k): str(v) for k, v in json.loads(text).items()}


def pop(client: redis.Redis, keys: list[str], timeout: float) -> tuple[Any, tuple[float, int]]:
    """BLPOP of the wake lists, and what bounds the server's clock for a hand-over it pops
    (``start_by``): when it was sent, and the server's time read just after (TIME ahead of
    it, in the same round trip). redis-py's own commands, not gpuq.wire.exchange: a
    blocking wait would hold the client's kept connection for its whole timeout."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.blpop(keys, timeout=timeout)
    sent = time.monotonic()
    server_time, popped = pipe.execute()
    return popped, (sent, from_time_reply(server_time))


def start_by(fields: dict[str, str], sent: float, server_ms: int) -> float | None:
    """When (monotonic) a hand-over's handler stops starting before began is answered: half
    its pickup window (``pickup_by``) is left on the server's clock, bounded from the server
    time ``server_ms`` read just after ``sent`` (its pop's send): the server's clock reads at
    most server_ms + (now - sent) then, whatever the hosts' clock offset or how long this
    process was stopped or starved after the pop. The other half is for began's way to the
    server; later, began is waited for, so a hand-over taken back meanwhile never starts
    here. None (no ``pickup_by``): always waited for."""
    try:
        pickup, started = int(fields["pickup_by"]), int(fields["started_at"])
    except (KeyError, ValueError):
        return None
    return sent + (pickup - (pickup - started) / 2 - server_ms) / 1000


def in_time(running: Running, cold: bool) -> bool:
    """A warm hand-over whose handler may start before began is answered: one popped late
    (a loaded host, a stopped process) may be taken back before its began reaches the
    server, and its handler must then not have started here (``start_by``)."""
    if not running.handed or cold:
        return False
    if running.start_by is not None and time.monotonic() < running.start_by:
        return True
    log.info("task.take_up_late task=%s worker=%s: began waited for", running.task_id,
             running.ctx.worker_id)
    return False


def bounded(pool: Any) -> Any:
    """A connection of ``pool`` for take-ups, whose reads are bounded: it carries only short
    scripts (began, the run's ack, fail or requeue), never a blocking pop, so a reply not in
    by the pool's read timeout (its connect timeout where reads are unbounded for the pops:
    gpuq.connection) means a lost connection, and a silent partition cannot hold the take-up
    thread for good (a timeout is a connection error: began goes again)."""
    conn = pool.get_connection()
    options = pool.connection_kwargs
    conn.socket_timeout = options.get("socket_timeout") or options.get("socket_connect_timeout") or 5.0
    if settimeout := getattr(getattr(conn, "_sock", None), "settimeout", None):  # a fake has none
        settimeout(conn.socket_timeout)  # a reconnect sets it from socket_timeout
    return conn


class TakeUp:
    """One hand-over's began, written and not yet answered."""

    def __init__(self, conn: Any, call: Call[tuple[str, int]], fields: dict[str, str],
                 running: Running) -> None:
        self.conn = conn
        self.call = call
        self.fields = fields
        self.running = running
        self.lock = threading.Lock()  # held by whoever reads began's reply
        self.answered = False  # its reply was read (or will never be): the connection is free


class TakeUps:
    def __init__(self, scripts: Scripts, calls: Calls, observer: Observer, presence: Presence) -> None:
        self.scripts = scripts
        self.calls = calls
        self.observer = observer
        self.presence = presence
        self.id = presence.worker_id
        self._sent: dict[tuple[str, str], TakeUp] = {}  # (task id, token) -> its take-up
        self._idle: list[Any] = []  # connections with nothing in flight
        self._queue: queue.SimpleQueue[TakeUp | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None

    def send(self, fields: dict[str, str], running: Running) -> bool:
        """Write the run's began; False when it could not be sent (the caller sends it and
        waits for its reply)."""
        call = self.calls.began(running.task_id, running.token, warm=True)
        try:
            conn = self._idle.pop()
            check(conn)  # closed while idle (a restart, a failover): began would be lost on it
        except IndexError:
            conn = bounded(self.scripts.client.connection_pool)
        try:
            conn.send_packed_command(pack(conn, [self.scripts.command(call)]), check_health=True)
        except (redis.RedisError, OSError) as exc:
            conn.disconnect()  # reconnected on its next send
            self._idle.append(conn)
            log.debug("task.take_up_unsent task=%s worker=%s error=%s", running.task_id, self.id, exc)
            return False
        up = TakeUp(conn, call, fields, running)
        self._sent[(running.task_id, str(running.token))] = up
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name=f"takeup-{self.id}", daemon=True)
            self._reader.start()
        self._queue.put(up)
        return True

    def settle(self, calls: Sequence[Call[Any]]) -> list[Any] | None:
        """The replies of a run's settle calls, sent after its began on that connection when
        its reply is not read yet; None when no take-up of theirs is in flight (began has
        run: any connection will do)."""
        up = next((u for c in calls if (u := self._sent.pop((c.args[0], c.args[1]), None))), None)
        if up is None:
            return None
        with up.lock:
            if up.answered:
                return None
            up.answered = True
            return self.scripts.pipelined(calls, transport=lambda commands: self._after(up, commands))

    def _after(self, up: TakeUp, commands: list[tuple[Any, ...]]) -> list[Any]:
        conn = up.conn
        try:
            conn.send_packed_command(pack(conn, commands), check_health=False)
            began, *replies = read_replies(conn, 1 + len(commands))
        except BaseException as exc:
            conn.disconnect()
            self._idle.append(conn)
            if isinstance(exc, (redis.RedisError, OSError)):
                self.answer(up, exc, ended=True)  # began goes again, ahead of the settle calls'
            raise  # the settle calls go again (the runner's retry)
        self._idle.append(conn)
        self.answer(up, began, ended=True)
        return replies

    def _read(self) -> None:
        while (up := self._queue.get()) is not None:
            with up.lock:
                if up.answered:  # read with the run's settle calls
                    continue
                up.answered = True
                try:
                    began = read_replies(up.conn, 1)[0]
                except (redis.RedisError, OSError) as exc:
                    up.conn.disconnect()
                    began = exc
                self._idle.append(up.conn)
                self._sent.pop((up.running.task_id, str(up.running.token)), None)
                self.answer(up, began, ended=False)

    def answer(self, up: TakeUp, reply: Any, *, ended: bool) -> None:
        """began's reply: its SLA counted, or the run lost (``ended``: its handler returned,
        and its settle calls, fenced off, count it)."""
        task_id, resent = up.running.task_id, False
        try:
            if isinstance(reply, (redis.ConnectionError, redis.TimeoutError, OSError)):
                resent = True
                # cut off unanswered (a restart, a failover, a kill): began may not have run;
                # fenced and counted once, it goes again on one of the client's connections
                reply = self.scripts.run_raw(up.call)
            if missing(reply):  # the server lost its scripts: load them, take it up again
                self.scripts.load()
                reply = self.scripts.run_raw(up.call)
            if isinstance(reply, Exception):
                raise reply
            decided, now_ms = up.call.parse(reply)
        except (StaleLease, TaskNotFound):
            if resent and ended:  # its settle calls may have run first: their replies tell
                log.info("task.take_up_after_end task=%s worker=%s: began, sent again, found the "
                         "task ended or taken back", task_id, self.id)
                return
            log.warning("lease.lost task=%s worker=%s: taken back before it was taken up",
                        task_id, self.id)
            if not ended:
                self.tell_lost(up.running)
            return
        except (redis.RedisError, GpuqError, OSError) as exc:
            # not taken up: at its pickup deadline it is taken back, and the beat finds it lost
            log.warning("sla.unreported task=%s worker=%s error=%s", task_id, self.id, exc)
            return
        if decided:
            self.observer.began(up.fields, now_ms)

    def tell_lost(self, running: Running) -> None:
        """Tell the worker's control the run is lost, as a cancel does (gpuq.worker.control)."""
        try:
            self.presence.redis.lpush(self.presence.keys.control(self.id),
                                      f"lost {running.task_id} {running.token}")
        except redis.RedisError as exc:
            log.warning("lease.untold task=%s worker=%s error=%s: the next beat finds it lost",
                        running.task_id, self.id, exc)

    def close(self) -> None:
        """End the take-up thread once it has read what is in flight."""
        if self._reader is not None:
            self._queue.put(None)
            self._reader.join(1.0)
