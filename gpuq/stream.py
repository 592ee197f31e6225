"""Streamed results and progress: what a handler sends while it runs, read as it comes.

A handler calls ``ctx.emit(value)`` (any JSON value) and ``ctx.progress(fraction, message)``.
On a worker the task's ``Emitter`` sends each at once, fenced by the task's lease token
(emit.lua, progress.lua): a worker whose lease was lost appends nothing (StaleLease). The
chunks are the entries of one Redis Stream per task (``Keys.stream``), about
``stream_maxlen`` of them kept, closed by an end marker when the task ends, expiring with it.

A producer reads them with ``task.stream(timeout=...)`` (``gpuq.client`` and ``gpuq.aio``;
``Follow`` is the bookkeeping both share): from the first entry, blocking on XREAD until the
end marker, never reading the task's state (each read asks only whether the task is still
stored: one deleted under it raises TaskNotFound). Each run of a task (each claim: a new
fencing token) numbers its chunks from 0. What a reader sees (docs/PROTOCOL.md, "Streams"): every chunk
once, in order; the first chunk of a later run, after chunks of an earlier one were
delivered, comes with ``restart=True``: what the reader showed of the earlier run is void
(a chat UI clears it), as that run failed, yielded or lost its lease. A chunk sent again
(the same token and seq, after a lost reply) is skipped.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from gpuq.backoff import Backoff
from gpuq.config import Config
from gpuq.errors import EmitError, TaskNotFound
from gpuq.keys import Keys
from gpuq.producer import Waiting
from gpuq.replies import Code, raise_for
from gpuq.scripts import Call, Scripts
from gpuq.task import JSON, TERMINAL_STATES

MAX_PROGRESS_MESSAGE = 200  # characters of a progress message (progress.lua takes 1024 bytes)
_ENDED = {s.value for s in TERMINAL_STATES}


@dataclass(frozen=True)
class Chunk:
    """One chunk as a reader gets it: the handler's value, the run that sent it (its
    attempt and fencing token) and its number within that run."""

    data: Any
    attempt: int
    seq: int
    token: int
    restart: bool = False  # the first of a new run after an earlier run's chunks: drop those


def encode_chunk(value: Any, max_bytes: int, task_id: str | None = None) -> str:
    """A chunk's JSON text, as emit.lua takes it; EmitError for a value that is not JSON or
    whose text is larger than ``max_bytes``."""
    if isinstance(value, (bytes, bytearray)):
        raise EmitError("a chunk must be JSON-serializable data, not bytes", task_id)
    try:
        text = JSON.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EmitError(f"chunk is not JSON-serializable: {exc}", task_id) from None
    if len(text) > max_bytes:  # JSON escapes non-ASCII: one byte per character
        raise EmitError(f"chunk of {len(text)} bytes is larger than the {max_bytes} allowed "
                        f"(stream_chunk_max_bytes)", task_id)
    return text


def check_progress(fraction: Any, message: Any, task_id: str | None = None) -> tuple[float, str]:
    """A progress report checked: (fraction, message); EmitError when the fraction is not a
    number from 0 to 1 or the message not a string of at most MAX_PROGRESS_MESSAGE."""
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
            or not 0 <= fraction <= 1):  # nan fails both bounds
        raise EmitError(f"progress must be a number from 0 to 1, got {fraction!r}", task_id)
    if not isinstance(message, str) or len(message) > MAX_PROGRESS_MESSAGE:
        raise EmitError(f"a progress message must be a string of at most {MAX_PROGRESS_MESSAGE} "
                        f"characters, got {type(message).__name__} {str(message)[:40]!r}", task_id)
    return float(fraction), message


def _emit_error(task_id: str) -> Any:
    def parse(r: list[Any]) -> Any:
        if int(r[0]) == Code.INVALID:
            raise EmitError(str(r[2]), task_id)
        raise_for(r, task_id)
        return r[1] if len(r) > 1 else None
    return parse


def emit_call(task_id: str, token: int, seq: int, text: str, config: Config) -> Call[str]:
    """emit.lua: append a chunk (JSON text) to the task's stream; the entry id."""
    return Call("emit", [task_id, str(token), str(seq), text, str(config.stream_maxlen),
                         str(config.stream_chunk_max_bytes)], _emit_error(task_id))


def progress_call(task_id: str, token: int, fraction: float, message: str) -> Call[None]:
    """progress.lua: the task's progress fields."""
    return Call("progress", [task_id, str(token), repr(fraction), message], _emit_error(task_id))


def follow_call(task_id: str) -> Call[str]:
    """follow.lua: the task's state; a task not ended is marked to end its stream."""
    def parse(r: list[Any]) -> str:
        raise_for(r, task_id)
        return str(r[1])
    return Call("follow", [task_id], parse)


class Sink(Protocol):
    """Where a Context's chunks and progress go."""

    def emit(self, value: Any) -> None: ...

    def progress(self, fraction: Any, message: Any) -> None: ...


class Emitter:
    """A running task's chunks and progress, sent by its worker at once (one round trip
    each), fenced by its token. Chunks are numbered in the order they are sent, one at a
    time (a handler may emit from several threads). A send rides out a Redis restart or
    failover of up to ``outage_s``, as the worker's own loops do: the handler's call waits,
    rather than fail the task (an attempt spent, or the task lost on its last)."""

    outage_s = 30.0

    def __init__(self, scripts: Scripts, config: Config, task_id: str, token: int) -> None:
        self.scripts = scripts
        self.config = config
        self.task_id = task_id
        self.token = token
        self.seq = 0  # the next chunk's number
        self.unanswered: str | None = None  # the chunk sent as seq whose reply was lost
        self._lock = threading.Lock()

    def _send(self, call: Call[Any]) -> Any:
        """The call's reply; sent again while the connection fails, up to ``outage_s`` (a
        chunk sent again keeps its seq: a repeat readers skip)."""
        until, backoff = time.monotonic() + self.outage_s, Backoff(cap=2.0)
        while True:
            try:
                return self.scripts.run(call)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if isinstance(exc, redis.AuthenticationError) or not backoff.pause_until(until):
                    raise

    def emit(self, value: Any) -> None:
        text = encode_chunk(value, self.config.stream_chunk_max_bytes, self.task_id)
        with self._lock:
            # a chunk whose reply was lost may be stored: sent again, it keeps its seq (readers
            # skip the repeat); another chunk after it takes the next one (a reader skipping it
            # as a repeat would lose it; a gap, if the lost one was never stored, loses nothing)
            if self.unanswered is not None and text != self.unanswered:
                self.seq += 1
            self.unanswered = text
            self._send(emit_call(self.task_id, self.token, self.seq, text, self.config))
            self.unanswered = None
            self.seq += 1

    def progress(self, fraction: Any, message: Any) -> None:
        f, m = check_progress(fraction, message, self.task_id)
        self._send(progress_call(self.task_id, self.token, f, m))


class Memory:
    """A Context's sink off a worker (``gpuq.testing``, a handler's own tests): the chunks
    kept as a reader would get their values, and the last progress report."""

    def __init__(self, max_bytes: int = Config.stream_chunk_max_bytes) -> None:
        self.max_bytes = max_bytes
        self.chunks: list[Any] = []
        self.last_progress: tuple[float, str] | None = None

    def emit(self, value: Any) -> None:
        self.chunks.append(json.loads(encode_chunk(value, self.max_bytes)))

    def progress(self, fraction: Any, message: Any) -> None:
        self.last_progress = check_progress(fraction, message)


def parse_progress(values: Sequence[Any], task_id: str) -> tuple[float, str] | None:
    """(fraction, message) from HMGET state progress progress_msg; None before a report
    (or when the field is not a number); TaskNotFound when there is no task."""
    state, fraction, message = values
    if not state:
        raise_for([Code.NOT_FOUND], task_id)
    try:
        value = float(fraction) if fraction else math.nan
    except ValueError:
        value = math.nan
    return (value, str(message or "")) if 0 <= value <= 1 else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def entries_of(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The entries of an XREAD reply on one stream (redis-py's RESP2 list or RESP3 map;
    fields as a dict or a flat list), ids and fields as text."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [s[1] for s in reply]
    out = []
    for entries in streams:
        if entries and isinstance(entries[0], list) and entries[0] and isinstance(
                entries[0][0], (list, tuple)):
            entries = entries[0]  # RESP3 wraps a stream's entries once more
        for entry_id, fields in entries:
            if fields is None:  # none to read; its id still counts
                fields = {}
            if not isinstance(fields, dict):
                fields = dict(zip(fields[::2], fields[1::2]))
            out.append((_text(entry_id), {_text(k): _text(v) for k, v in fields.items()}))
    return out


class Follow:
    """The bookkeeping of one stream read, shared by the sync and asyncio clients: where it
    is, how long the next XREAD may block, and the attempt rule (the module's docstring)."""

    COUNT = 256  # entries per XREAD

    def __init__(self, keys: Keys, task_id: str, timeout: float | None, client: Any) -> None:
        self.task_id = task_id
        self.key = keys.stream(task_id)
        self.task_key = keys.task(task_id)
        self.waiting = Waiting(task_id, timeout, client)
        self.last_id = "0-0"
        self.live = True  # the task had not ended when the read began
        self.caught_up = False  # an XREAD came back short: the next one blocks
        self.done = False
        self.last: tuple[int, int] | None = None  # (token, seq) of the last chunk delivered

    def started(self, state: str) -> None:
        """follow.lua's reply: an ended task's stream is read to its end without blocking."""
        self.live = state not in _ENDED

    def block_ms(self) -> int | None:
        """None: read what is there without blocking; else how long to block (ms).
        ResultTimeout once the timeout has passed."""
        if not (self.live and self.caught_up):
            return None
        return max(1, math.ceil(self.waiting.block_s() * 1000))

    def commands(self) -> list[tuple[Any, ...]]:
        """One round trip of a read: XREAD (blocking when ``block_ms`` says so), then whether
        the task is still stored (a stream of a task deleted under the read gets no end
        marker: a flush, an eviction, a result TTL of 0)."""
        block = self.block_ms()
        xread = ("XREAD", "COUNT", self.COUNT, *(() if block is None else ("BLOCK", block)))
        return [(*xread, "STREAMS", self.key, self.last_id), ("EXISTS", self.task_key)]

    def take(self, reply: Any, stored: Any = 1) -> list[Chunk]:
        """The chunks of an XREAD reply a reader gets (the attempt rule applied); ``done``
        once the end marker is read, or an ended task's stream has no more. TaskNotFound when
        the reply is empty and the task no longer ``stored`` (EXISTS)."""
        entries = entries_of(reply)
        if not entries and not int(stored):
            raise TaskNotFound(self.task_id)
        if not entries and not self.live:
            self.done = True
        self.caught_up = len(entries) < self.COUNT
        out = []
        for entry_id, fields in entries:
            self.last_id = entry_id
            if "end" in fields:
                self.done = True
                break
            chunk = self._chunk(fields)
            if chunk is not None:
                out.append(chunk)
        return out

    def _chunk(self, fields: dict[str, str]) -> Chunk | None:
        try:
            token, seq = int(fields["token"]), int(fields["seq"])
            chunk = Chunk(json.loads(fields["data"]), int(fields.get("attempt") or 0), seq, token)
        except (KeyError, ValueError):
            return None  # not an entry emit.lua wrote
        restart = False
        if self.last is not None:
            if token == self.last[0] and seq <= self.last[1]:
                return None  # the same chunk sent again
            restart = token != self.last[0]
        self.last = (token, seq)
        return Chunk(chunk.data, chunk.attempt, seq, token, restart) if restart else chunk
