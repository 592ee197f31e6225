"""The Lua scripts of gpuq: one loader for the typed calls ``gpuq.calls`` builds.

Each script in ``gpuq/lua/`` is a function of one library (``gpuq.functions``: bare FCALL, the
library loaded again when the server lacks it, EVALSHA where it cannot load it). ``Scripts``
runs calls on a sync client over ``gpuq.wire``, alone or several a round trip (``gpuq.aio``
on an asyncio client), loading the library when a server lacks it and checking the replicas
a call asks for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import redis

from gpuq.call import Call as Call
from gpuq.call import Replicas as Replicas

# re-exported: callers build calls and claims and read their answers through this module
from gpuq.calls import LEARN_MAX_RUNS as LEARN_MAX_RUNS
from gpuq.calls import Calls as Calls
from gpuq.calls import ReapResult as ReapResult
from gpuq.claims import Batch as Batch
from gpuq.claims import Claim as Claim
from gpuq.claims import ClaimRequest as ClaimRequest
from gpuq.errors import ReplicaTimeout
from gpuq.functions import Sender, missing
from gpuq.joined import carried, claim_start, joined_acks, split_replies, wrote
from gpuq.keys import Keys
from gpuq.wire import Tail, exchange

log = logging.getLogger(__name__)
T = TypeVar("T")
SCRIPT_NAMES = ("enqueue", "claim", "claim_batch", "began", "heartbeat", "ack", "fail", "requeue",
                "cancel", "reap", "lead", "expire", "park", "preempt", "retire", "learn", "tenant", "fire",
                "emit", "progress", "follow", "wait")  # emit, progress, follow: gpuq.stream's calls
RELOADS = 3  # loads of the scripts a call may need: each server flush meanwhile costs one


def wait_command(calls: Sequence[Call[Any]]) -> tuple[Any, ...] | None:
    """The WAIT sent after the calls on their connection (same round trip), if one asks for
    replicas: WAIT counts every write made on that connection before it."""
    asked = [c.replicas for c in calls if c.replicas is not None]
    if not asked:
        return None
    return ("WAIT", max(r.count for r in asked), max(r.timeout_ms for r in asked))


def check_replicas(calls: Sequence[Call[Any]], replies: Sequence[Any], acked: Any) -> None:
    """WAIT's reply against what each call asked: a call the script rejected wrote nothing;
    a strict one that wrote raises ReplicaTimeout, the others are logged."""
    if isinstance(acked, Exception):
        raise acked
    for call, reply in zip(calls, replies):
        asked = call.replicas
        if asked is None or int(acked) >= asked.count or not wrote(reply):
            continue
        if asked.strict:
            raise ReplicaTimeout(asked.what, int(acked), asked.count, asked.timeout_ms)
        log.warning("write.unreplicated what=%r acked=%d wanted=%d timeout_ms=%d", asked.what,
                    int(acked), asked.count, asked.timeout_ms)


class Resend:
    """A stream's replies (the calls first, the WAIT last): the calls that found their
    code missing (server restarted or flushed) are sent again, and the WAIT after them,
    once the caller has loaded it; then the first error is raised and WAIT's count
    checked. A plain command never finds a script missing. The sync and async clients do
    the I/O between these steps."""

    def __init__(self, replies: list[Any], calls: Sequence[Call[Any]],
                 wait: tuple[Any, ...] | None) -> None:
        self.calls, self.wait, self.replies = calls, wait, replies
        self.acked = replies.pop() if wait is not None else None
        self.missing = [i for i, r in enumerate(replies) if missing(r)]

    def commands(self, command: Callable[[Call[Any]], tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [command(self.calls[i]) for i in self.missing] + ([self.wait] if self.wait is not None else [])

    def merge(self, again: list[Any]) -> None:
        if self.wait is not None:
            self.acked = again.pop()
        for i, reply in zip(self.missing, again):
            self.replies[i] = reply
        # flushed again between the load and the resend: sent again (up to RELOADS times)
        self.missing = [i for i in self.missing if missing(self.replies[i])]

    def checked(self) -> list[Any]:
        raise_first_error(self.replies)
        if self.wait is not None:
            check_replicas(self.calls, self.replies, self.acked)
        return self.replies


def raise_first_error(replies: list[Any]) -> list[Any]:
    """The replies of a stream, once every one has been read; its first error raised."""
    for reply in replies:
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
    return replies


class Scripts:
    """Runs calls on a synchronous client, one at a time or many per round trip."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.sender = Sender(SCRIPT_NAMES, keys.base)
        self.tail = Tail()

    def run(self, call: Call[T]) -> T:
        return call.parse(self.run_raw(call))

    def command(self, call: Call[Any]) -> tuple[Any, ...]:
        """The bare FCALL (or EVALSHA) of a call; a claim's arguments packed once while a
        worker's claims repeat them (gpuq.wire.Packed)."""
        if (start := claim_start(call)) < 0:
            return self.sender.command(call)
        return self.tail.command(self.sender.head(call.script), call.args, start)

    def run_raw(self, call: Call[Any]) -> Any:
        """The script's reply, unparsed (its code loaded again where the server lacks it)."""
        return self.pipelined([call])[0]

    def pipelined(self, calls: Sequence[Call[Any]], extra: Sequence[tuple[Any, ...]] = (), *,
                  transport: Callable[[list[tuple[Any, ...]]], list[Any]] | None = None) -> list[Any]:
        """Run the calls, then the plain commands in ``extra`` (e.g. ``("LPOP", key)``), in
        one round trip; replies raw, in order, the first error raised once all are read.
        Consecutive acks go as one ack call of several tasks (``joined_acks``), and with a
        claim right after them as one call (``carried``). ``transport``: sends the commands
        and reads their replies instead of ``exchange`` (gpuq.worker.takeup)."""
        joined = carried(joined_acks(calls))
        sent = [call for call, _ in joined]
        commands = [*map(self.command, sent), *extra]
        wait = wait_command(sent)
        if wait is not None:
            commands.append(wait)
        raw = transport(commands) if transport else exchange(self.client, commands, retry=True)
        return split_replies(self._loaded(raw, sent, wait), joined)

    def streamed(self, calls: Iterable[Call[T]], seen: list[Any] | None = None) -> list[T]:
        """Run many calls on one connection, each built and sent just before the next (the
        server runs the first calls while the client builds and packs the later ones; a
        pipeline packs them all before it sends any), the replies read after the last, then
        parsed in order; the first error is raised once all are read. ``seen`` gets every
        call's raw reply first (none when the connection failed before all were read)."""
        sent: list[Call[T]] = []

        def commands() -> Iterator[tuple[Any, ...]]:
            for call in calls:
                sent.append(call)
                yield self.command(call)
            if (wait := wait_command(sent)) is not None:
                yield wait

        replies = self._loaded(exchange(self.client, commands()), sent, wait_command(sent), seen)
        return [c.parse(r) for c, r in zip(sent, replies)]

    def _loaded(self, replies: list[Any], calls: Sequence[Call[Any]],
                wait: tuple[Any, ...] | None = None, seen: list[Any] | None = None) -> list[Any]:
        """The replies, with the calls that found their code missing sent again once it is
        loaded (``Resend``); ``seen`` gets them before any is checked."""
        if wait is None and seen is None and not any(isinstance(r, Exception) for r in replies):
            return replies  # nothing to send again, raise or count: the usual case
        resend = Resend(replies, calls, wait)
        for _ in range(RELOADS):
            if not resend.missing:
                break
            self.load()
            resend.merge(exchange(self.client, resend.commands(self.command), retry=True))
        if seen is not None:
            seen.extend(resend.replies)
        return resend.checked()

    def load(self) -> None:
        """Load the library (every primary of a Cluster), else the scripts for EVALSHA."""
        if self.sender.fcall:
            try:
                self.client.function_load(self.sender.library.source)
                return
            except redis.ResponseError as exc:
                if not self.sender.library_refused(exc):
                    return
        for source in self.sender.sources.values():
            self.client.script_load(source)
        self.sender.scripts_loaded()
