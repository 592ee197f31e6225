"""How a run's outcome is put into words: a failure as the one line its task records (and the
traceback its log line carries), a result as the ack sends it."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuq.errors import TaskError
from gpuq.scripts import Call, Calls
from gpuq.task import JSON, MAX_RESULT_BYTES
from gpuq.worker.running import Running

log = logging.getLogger(__name__)


def where(exc: BaseException) -> BaseException | None:
    """What a failure's log line carries as its traceback: the task records one line, so the log
    is where an operator finds where an unexpected error was raised. A TaskError is the
    handler's own verdict, said in its message: no traceback."""
    return None if isinstance(exc, TaskError) else exc


def failure(exc: BaseException) -> tuple[str, bool]:
    """The error a run that raised ``exc`` records, on one line, and whether it may be retried.
    Never raises: a run whose failure could not be described would send no fail, and its
    lease, renewed until one is answered, would keep the task running for good."""
    try:
        text = str(exc)
    except Exception:  # an exception class whose __str__ itself raises
        text = "<exception str() failed>"
    text = " ".join(text.splitlines()).strip()
    if isinstance(exc, TaskError):
        return text or "TaskError", bool(exc.retry)
    name = type(exc).__name__
    return (f"{name}: {text}" if text else name), True


def encode(result: Any) -> str:
    """The handler's result as the ack sends it; one the ack would refuse fails the task."""
    try:
        text = JSON.encode(result)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise TaskError(f"handler returned a result that is not JSON: {exc}", False) from None
    return sized(text)


def sized(text: str) -> str:
    """A result's JSON text, or TaskError when the ack would refuse it for its size."""
    if len(text) > MAX_RESULT_BYTES:  # the ack would be refused and the lease run out
        raise TaskError(f"handler returned a result of {len(text)} bytes, more than the "
                        f"{MAX_RESULT_BYTES} allowed: store large outputs elsewhere and "
                        f"return a reference", False)
    return text


def batch_encode() -> Callable[[Any], str]:
    """``encode`` for the results of one batch: JSONEncoder.encode builds its C encoder (and
    a closure and a marks dict) for every call, much of a small result's cost; this one is
    built once per batch, used by one thread. A result it refuses goes to ``encode``, which
    says why, or encodes it (a refusal for marks an earlier failure left behind: the next
    result gets fresh ones)."""
    make = getattr(json.encoder, "c_make_encoder", None)  # CPython's _json: absent elsewhere
    if make is None or JSON.indent is not None:
        return encode
    built: list[Callable[[Any, int], Any]] = []

    def fast(result: Any) -> str:
        if isinstance(result, str):
            return encode(result)
        if not built:
            built.append(make({} if JSON.check_circular else None, JSON.default,
                              json.encoder.encode_basestring_ascii if JSON.ensure_ascii
                              else json.encoder.encode_basestring, JSON.indent, JSON.key_separator,
                              JSON.item_separator, JSON.sort_keys, JSON.skipkeys, JSON.allow_nan))
        try:
            chunks = built[0](result, 0)
        except (TypeError, ValueError, RecursionError):
            built.clear()
            return encode(result)
        text = "".join(chunks)
        return text if len(text) <= MAX_RESULT_BYTES else sized(text)  # sized's check, inline

    return fast


# json.loads' own scan of a value (in C where _json is there)
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode(text: str) -> Any:
    """``json.loads`` of a payload: one scan where nothing surrounds its value (enqueue
    stores compact JSON), without json.loads' Python layers and whitespace matches; any
    other text goes to json.loads (its whitespace, its errors)."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


_kept = threading.local()  # each runner thread's encoder, made at its first result


def kept_encode(result: Any) -> str:
    """``encode`` with an encoder its thread keeps (``batch_encode``'s): a runner encodes a
    result a task, and JSONEncoder.encode builds its C encoder for every call."""
    fast = getattr(_kept, "encode", None)
    if fast is None:
        fast = _kept.encode = batch_encode()
    return fast(result)


def late(calls: Calls, worker_id: str, running: Running) -> Call[Any] | None:
    """The fail of a handler call that returned past its ``timeout_s`` while control's fail
    of it was not sent (Redis away, the worker frozen; Running.timed_out): it fails as that
    would have, not acked. None when it returned in time."""
    if (error := running.timed_out()) is None:
        return None
    log.warning("task.timed_out task=%s worker=%s: %s", running.task_id, worker_id, error)
    return calls.fail(running.task_id, running.token, error)
