"""Plain-text rendering of pool views for the terminal."""

from __future__ import annotations

from gpuq.inspect import PoolView


def render_status(view: PoolView) -> str:
    lines = [f"pool {view.pool}: {sum(q.depth for q in view.queues)} queued, {view.running} running, "
             f"{view.delayed} waiting to retry, {len(view.workers)} workers"]
    lines.append("")
    lines.append(f"{'PRIORITY':<9}{'MODEL':<24}{'DEPTH':>8}{'OLDEST WAIT':>14}")
    for q in view.queues:
        lines.append(f"{q.priority:<9}{q.model[:23]:<24}{q.depth:>8}{q.oldest_wait_s:>13.1f}s")
    if not view.queues:
        lines.append("(no queued tasks)")
    if view.unschedulable:
        lines.append("")
        lines.append(f"unschedulable: {view.unschedulable} queued task(s) need more VRAM than the "
                     f"largest registered GPU class ({view.largest_gpu_gb:g} GB usable): "
                     + ", ".join(view.unschedulable_ids[:5]))
    lines.append("")
    lines.append(f"{'WORKER':<28}{'GPU':<18}{'VRAM FREE/TOTAL':>16}  {'STATE':<9}{'RUN':>4}  MODELS")
    for w in view.workers:
        vram = f"{w.vram_free_gb:.0f}/{w.vram_total_gb:.0f} GB"
        state = w.state if w.alive else "dead?"
        lines.append(f"{w.id[:27]:<28}{w.gpu[:17]:<18}{vram:>16}  {state:<9}{len(w.running):>4}  "
                     f"{','.join(w.models) or '-'}")
    if not view.workers:
        lines.append("(no workers)")
    return "\n".join(lines)
