"""``gpuq top``: a live terminal view of one pool, redrawn in place.

A frame is plain text that fits the terminal width: totals, queues by priority with their SLA
attainment (handlers started, model loaded, within the SLA of enqueue), preemption and scale
signals, the handlers' timeouts, recent SLA misses (late, cold or expired), then workers (last, as in top(1),
since that list grows with the pool and is what gets cut when the screen is short). On a
terminal it redraws with ANSI cursor codes (no curses: it must also run without a terminal);
otherwise, or with ``once``, it prints one frame without escape codes.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import redis

from gpuq.clock import server_ms
from gpuq.keys import Keys
from gpuq.redact import one_line
from gpuq.task import Priority
from gpuq.views.inspect import PoolView, QueueView, WorkerView, number, pool_view, recent_misses, scale_stale
from gpuq.views.render import attainment, handler_timeouts, levels_label, timeouts_text

MIN_WIDTH = 60
MISS_LINES = 8
MODELS_PER_PRIORITY = 3
TIMEOUT_LINES = 3  # at most, for the handler timeouts (the last ends in "+N" for the rest)
# home, each line cleared to its end, the rest of the screen cleared: no blank flash per frame
CLEAR, HOME, EOL, EOS = "\x1b[2J", "\x1b[H", "\x1b[K", "\x1b[J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def render_top(view: PoolView, misses: list[dict[str, Any]], width: int = 80, *,
               now: float) -> str:
    """One frame; no line is longer than ``width``. now: the frame's time (epoch seconds)
    on the server's clock, which stamped the misses."""
    lines = (_header(view, now) + _queues(view, width) + _signals(view) + _progress(view)
             + _tenants(view) + _timeouts(view, width) + _misses(misses, now)
             + _workers(view.workers, width))
    # names are users' text: escaped before the width is counted (gpuq.redact.one_line)
    return "\n".join(clip(one_line(line), width) for line in lines)


def run_top(client: redis.Redis, keys: Keys, *, interval_s: float = 1.0, once: bool = False,
            out: TextIO | None = None, iterations: int | None = None) -> int:
    """Redraw a frame every ``interval_s`` on a terminal until Ctrl-C (or ``iterations``
    frames); print one plain frame when ``out`` is not a terminal or ``once``. Redis errors
    propagate to the caller. ``out``: default the sys.stdout of the call (not of the import:
    a caller may have replaced it since)."""
    out = out or sys.stdout
    live = not once and out.isatty()
    frames = 0
    try:
        if live:
            out.write(HIDE_CURSOR + CLEAR)
        while True:
            size = shutil.get_terminal_size()
            text = render_top(pool_view(client, keys), recent_misses(client, keys),
                              width=max(MIN_WIDTH, size.columns), now=server_ms(client) / 1000)
            if not live:
                out.write(text + "\n")
                return 0
            rows = _fit_rows(text.split("\n"), max(2, size.lines - 1))
            # clear each line before writing it: after a full-width row the cursor waits on
            # the last column, where an erase would take that row's last character
            out.write(HOME + "".join(EOL + row + "\n" for row in rows) + EOS)
            out.flush()
            frames += 1
            if iterations is not None and frames >= iterations:
                return 0
            time.sleep(max(0.0, interval_s))
    except KeyboardInterrupt:
        return 0
    finally:
        if live:
            out.write(SHOW_CURSOR)
            out.flush()


def _fit_rows(rows: list[str], limit: int) -> list[str]:
    """The rows a screen of ``limit`` lines shows without scrolling (which would break HOME);
    the workers, last, are what gets cut."""
    if len(rows) <= limit:
        return rows
    keep = max(0, limit - 1)
    return rows[:keep] + [f"... {len(rows) - keep} more lines"]


# -- sections ------------------------------------------------------------------------------

def _header(view: PoolView, now: float) -> list[str]:
    queued = sum(q.depth for q in view.queues)
    alive = [w for w in view.workers if w.alive]
    states = {s: sum(w.state == s for w in alive) for s in ("busy", "idle", "draining", "silent")}
    workers = f"workers: {states['busy']} busy, {states['idle']} idle"
    workers += "".join(f", {states[s]} {s}" for s in ("draining", "silent") if states[s])
    if len(alive) < len(view.workers):
        workers += f", {len(view.workers) - len(alive)} not responding"
    workers += "; a reaper active" if view.reaper_active else "; no reaper"
    return [f"gpuq top - pool {view.pool} - {time.strftime('%H:%M:%S', time.localtime(now))}",
            f"tasks: {queued} queued, {view.running} running, {view.delayed} delayed, "
            f"{view.waiting} waiting, {view.parked} parked, {view.unschedulable} unschedulable",
            workers]


def _queues(view: PoolView, width: int) -> list[str]:
    # met and missed: each task once, when its handler first started (its model loaded)
    lines = ["", f"{'PRI':<4}{'DEPTH':>7}{'OLDEST':>8}{'SLA@START':>10}{'MISSED':>7}  BUSIEST MODELS"]
    for p in Priority:
        qs = sorted((q for q in view.queues if q.priority == p.label), key=lambda q: -q.depth)
        met = view.stats.get(f"sla_met:{p.label}", 0)
        missed = view.stats.get(f"sla_missed:{p.label}", 0)
        oldest = duration(max(q.oldest_wait_s for q in qs)) if qs else "-"
        lines.append(f"{p.label:<4}{sum(q.depth for q in qs):>7}{oldest:>8}"
                     f"{attainment(met, missed):>10}{missed if met + missed else '-':>7}  "
                     + _busiest(qs, width - 38))
    return lines


def _busiest(queues: list[QueueView], room: int) -> str:
    """The deepest models, "name depth", as many as fit (at most three), then "+N"."""
    cap = max(8, min(max(20, room // MODELS_PER_PRIORITY - 6), room - 10))  # depths stay whole
    shown = [f"{clip(q.model, cap)} {q.depth}" for q in queues[:MODELS_PER_PRIORITY]]
    return fit_list(shown, len(queues), room) or "-"


def _signals(view: PoolView) -> list[str]:
    lines = []
    if view.reservations:
        lines.append("reserved: " + ", ".join(f"{r['worker']} for {short_id(r['task'])}"
                                              for r in view.reservations))
    if view.yield_requests:
        lines.append("yielding: " + ", ".join(_yield(y) for y in view.yield_requests))
    signals = [f"{k.partition(':')[0]} {k.partition(':')[2]} "
               f"{v.get('current', '?')}->{v.get('desired', '?')}"
               for k, v in sorted(view.scale.items()) if ":" in k]
    if "unschedulable" in view.scale:
        signals.append(f"{view.scale['unschedulable'].get('tasks', '?')} unschedulable")
    if signals:
        stale = scale_stale(view.scale, view.scale_age_s)  # no reaper rewrites them: say how old
        lines.append(f"scale (stale, {view.scale_age_s:.0f}s old): " if stale else "scale: ")
        lines[-1] += ", ".join(signals)
    return [""] + lines if lines else []


def _progress(view: PoolView) -> list[str]:
    """One line: running tasks that reported progress, "<task> <percent> <message>"."""
    parts = [f"{short_id(task)} {100 * p['fraction']:.0f}%" + (f" {p['message']}" if p["message"] else "")
             for task, p in sorted(view.progress.items())]
    return ["", "progress: " + ", ".join(parts)] if parts else []


def _tenants(view: PoolView) -> list[str]:
    """One line: each tenant's queued tasks, running GPUs and VRAM against its caps, running
    tasks against the reaper's bound, SLA at start."""
    parts = []
    for t in view.tenants:
        queued = sum(t["queued"].values())
        cap = "" if t["max_gpus"] is None else f" {t.get('running_gpus') or 0}/{t['max_gpus']}gpu"
        if t.get("max_vram_gb") is not None:
            cap += f" {size(t.get('running_vram_gb') or 0)}/{size(t['max_vram_gb'])}GB"
        if t.get("bound") is not None:
            cap += f" {t['running'] or 0}/{t['bound']}b"
        met = sum(s["met"] for s in t["sla"].values())
        done = met + sum(s["missed"] for s in t["sla"].values())
        sla = f" {100 * met / done:.0f}%" if done else ""
        parts.append(f"{t['name']} q{queued}{cap}{sla}")
    return ["", "tenants: " + ", ".join(parts)] if parts else []


def _timeouts(view: PoolView, width: int) -> list[str]:
    """Each bounded handler's ``timeout_s``, as status shows them (where the live workers
    differ, each bound with its count of workers), wrapped on up to TIMEOUT_LINES lines, the
    last ending in "+N" for those that did not fit."""
    rest = [f"{clip(h, 24)} {timeouts_text(b, ' / ')}" for h, b in handler_timeouts(view.workers)]
    lines, head = [""], "handler timeouts: "
    room = width - len(head)
    while rest:
        if len(lines) == TIMEOUT_LINES:
            text, rest = fit_list(rest, len(rest), room), []
        else:
            n = next((k for k in range(len(rest), 1, -1) if len(", ".join(rest[:k])) < room), 1)
            text, rest = ", ".join(rest[:n]) + ("," if n < len(rest) else ""), rest[n:]
        lines.append((head if len(lines) == 1 else " " * len(head)) + text)
    return lines if len(lines) > 1 else []


def _yield(y: dict[str, Any]) -> str:
    left = number(y.get("yield_by_s")) or 0.0
    when = f"{left:.0f}s left" if left >= 0 else f"overdue {-left:.0f}s"
    return f"{short_id(str(y.get('task', '?')))} on {y.get('worker', '?')} ({when})"


def _misses(misses: list[dict[str, Any]], now: float) -> list[str]:
    if not misses:
        return []
    newest = sorted(misses, key=lambda m: number(m.get("at")) or 0.0, reverse=True)
    lines = ["", f"RECENT SLA MISSES ({len(misses)})",
             f"{'AGE':>7}  {'PRI':<4}{'MODEL':<20}{'WAIT':>8}  {'KIND':<8}TASK"]
    for m in newest[:MISS_LINES]:
        at, wait = number(m.get("at")), number(m.get("wait_s"))
        age = duration(max(0.0, now - at)) if at is not None else "?"
        lines.append(f"{age:>7}  {str(m.get('priority', '?')):<4}"
                     f"{shorten(str(m.get('model', '?')), 19):<20}"
                     f"{duration(wait) if wait is not None else '?':>8}  "
                     f"{str(m.get('kind', '?')):<8}{short_id(str(m.get('id', '')))}")
    return lines


def _workers(workers: list[WorkerView], width: int) -> list[str]:
    # the fixed columns take 53; the id gets up to 28 of the rest, the models what is left
    id_w = min(28, max(13, (width - 53) // 2))
    lines = ["", f"{'WORKER':<{id_w}}{'GPU':<10}{'VRAM USED/TOTAL':<17}{'STATE':<9}"
                 f"{'RUN':>3} {'TASK':<7}{'LEVEL':<6}MODELS"]
    for w in sorted(workers, key=lambda w: w.id):  # by id: rows keep their place between frames
        used = max(0.0, w.vram_total_gb - w.vram_free_gb)
        vram = f"{bar(used, w.vram_total_gb, 6)} {size(used):>3}/{size(w.vram_total_gb):<3}"
        first = short_id(w.running[0], 6) if w.running else "-"
        models = fit_list(w.models, len(w.models), width - id_w - 53) or "-"
        gpu = clip(w.gpu.replace("NVIDIA ", "", 1), 9)  # NVML names all start so (after "4x")
        lines.append(f"{shorten(w.id, id_w - 1):<{id_w}}{gpu:<10}{vram:<17}"
                     f"{w.state if w.alive else 'dead?':<9}{len(w.running):>3} {first:<7}"
                     f"{levels_label(w.levels):<6}{models}")
    if not workers:
        lines.append("(no workers)")
    return lines


# -- formatting ----------------------------------------------------------------------------

def size(gb: float) -> str:
    """GB in at most 4 characters (a group of eight 141 GB GPUs holds 1128): 1.1T past 999."""
    return f"{gb:.0f}" if gb < 999.5 else f"{gb / 1000:.1f}T"


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "~"


def shorten(name: str, width: int) -> str:
    """Cut the middle of a long id: worker ids differ at both ends (host ... random)."""
    if len(name) <= width:
        return name
    if width < 3:
        return name[:width]
    head = width // 2  # of the width - 1 characters kept, the head gets the odd one
    return name[:head] + "~" + name[len(name) - (width - 1 - head):]


def fit_list(items: Sequence[str], total: int, room: int) -> str:
    """Comma-join the items that fit in ``room`` columns, "+N" counting the rest of ``total``;
    the first is cut to fit rather than left out."""
    shown: list[str] = []
    for item in items:
        rest = total - len(shown) - 1
        candidate = ", ".join([*shown, item]) + (f", +{rest}" if rest else "")
        if len(candidate) > room:
            break
        shown.append(item)
    if not shown and items:
        more = f", +{total - 1}" if total > 1 else ""
        shown.append(clip(items[0], max(1, room - len(more))))
    rest = total - len(shown)
    return ", ".join(shown) + (f", +{rest}" if rest else "")


def bar(used: float, total: float, cells: int) -> str:
    filled = round(cells * min(1.0, used / total)) if total > 0 else 0
    return "[" + "#" * filled + "." * (cells - filled) + "]"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 24 else f"{hours // 24}d{hours % 24:02d}h"


GENERATED_ID = re.compile(r"[0-9a-f]{32}")


def short_id(task_id: str, n: int = 8) -> str:
    """A task id cut to n characters: a generated id's tail (its head is the enqueue time,
    the same for every task of a few hours), another id's head."""
    return task_id[-n:] if GENERATED_ID.fullmatch(task_id) else task_id[:n]
