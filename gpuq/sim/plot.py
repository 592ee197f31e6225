"""Pictures of simulation runs, for people who would rather look than read: the CDF of the
wait from arrival to handler start (model loaded) per priority (one line per policy, a share
of all the level's tasks: a task that never started keeps it below 1) and
each GPU's busy timeline. Needs matplotlib (``pip install 'gpuq[plot]'``)."""

from __future__ import annotations

import os

from gpuq.errors import ConfigError
from gpuq.sim.model import SimResult

COLORS = {"gpuq": "#1b7837", "fifo": "#b2182b", "priority": "#2166ac"}


def check(path: str) -> None:
    """Before a replay: matplotlib is there and writes the file's format (by its extension;
    none: PNG), so a replay of minutes does not end in an error."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'gpuq[plot]'") from None
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    formats = FigureCanvasAgg.get_supported_filetypes()
    if ext and ext not in formats:
        raise ConfigError(f"--plot {path!r}: .{ext} is not a picture format matplotlib writes "
                          f"({', '.join(sorted(formats))})")


def wait_cdf(result: SimResult, priority: int) -> tuple[list[float], list[float]]:
    """The level's waits from arrival to handler start, sorted (1 ms at least: the axis is
    logarithmic), and at each the share of all the level's tasks started by then, as
    sla_attainment counts them: a task that never started (expired, starved) keeps the curve
    below 1."""
    tasks = [t for t in result.tasks if t.priority == priority]
    waits = sorted(max(t.exec_s - t.arrival_s, 1e-3) for t in tasks if t.exec_s is not None)
    return waits, [(i + 1) / len(tasks) for i in range(len(waits))]


def plot(results: list[SimResult], path: str) -> None:
    check(path)
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5), gridspec_kw={"height_ratios": [1, 1.2]})
    for p, ax in enumerate(axes[0]):
        for r in results:
            waits, shares = wait_cdf(r, p)
            if waits:
                ax.step(waits, shares, where="post", color=COLORS.get(r.policy), label=r.policy)
        sla = results[0].sla_s[p] if results else None
        if sla:
            ax.axvline(sla, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"P{p}: wait to handler start" + (f" (SLA {sla:g} s)" if sla else ""))
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of tasks (never started: not reached)")
    axes[0][0].legend(loc="lower right")
    bottom = fig.add_subplot(2, 1, 2)
    for ax in axes[1]:
        ax.remove()
    row = 0.0
    for r in results:
        for spans in r.busy_intervals.values():
            bottom.broken_barh([(a, b - a) for a, b in spans], (row, 0.8), color=COLORS.get(r.policy))
            row += 1
        row += 0.6
    bottom.set_yticks([])
    bottom.set_xlabel("virtual seconds (busy: loading a model or running a task)")
    bottom.set_title("GPU busy timeline, one row per GPU: " + ", ".join(
        f"{r.policy} ({100 * sum(r.busy_s.values()) / max(1e-9, len(r.gpus) * r.makespan_s):.0f}% busy)"
        for r in results))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
