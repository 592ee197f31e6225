"""The LLM request traces (Azure code/conv, Mooncake conversation) and their token cost model.

Neither trace records how long a request ran or how much memory it held, only its token counts.
A request's GPU time and VRAM therefore come from a per-model-class cost model (:class:`LlmCost`)
whose numbers are stated assumptions for one 80 GB GPU, not measurements; docs/SIMULATOR.md
("Traces") explains each one. ``gpuq.sim.traces`` opens the files and calls the readers here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuq.sim.model import TraceTask

# what a request may use of an 80 GB card (its 5 GB KV reserve kept back, the default);
# longer contexts are assumed to page their KV cache
CARD_GB = 75.0


@dataclass(frozen=True)
class LlmCost:
    """Per-token costs and memory of one model class on one 80 GB GPU, at batch size one."""

    size: str
    prefill_s_per_token: float  # prompt processing, compute-bound
    decode_s_per_token: float  # one generated token, memory-bound
    weights_gb: float  # resident weights and runtime buffers
    kv_gb_per_token: float  # KV cache per token of context (prompt + output)
    load_scale: float  # model load time relative to a Stable-Diffusion checkpoint's

    def service_s(self, input_tokens: int, output_tokens: int) -> float:
        return input_tokens * self.prefill_s_per_token + output_tokens * self.decode_s_per_token

    def vram_gb(self, input_tokens: int, output_tokens: int) -> float:
        need = self.weights_gb + self.kv_gb_per_token * (input_tokens + output_tokens)
        return round(min(need, CARD_GB), 2)


# 13B class in fp16: 26 GB of weights; KV 2 (K, V) x 40 layers x 5120 x 2 bytes = 0.82 MB/token.
CLASS_13B = LlmCost("13B", 0.06e-3, 10e-3, 26.0, 0.82e-3, 1.5)
# 70B class quantised to 4 bits: ~35 GB of weights + ~5 GB of scales and buffers = 40 GB;
# grouped-query KV 2 x 80 layers x 8 heads x 128 x 2 bytes = 0.33 MB/token.
CLASS_70B = LlmCost("70B", 0.25e-3, 30e-3, 40.0, 0.33e-3, 2.0)

COSTS: dict[str, LlmCost] = {"azure-code": CLASS_13B, "azure-conv": CLASS_70B, "kimi-conv": CLASS_70B}
AZURE_PRIORITY = {"azure-code": 0, "azure-conv": 1}  # latency-critical completions, then chat


def _task(arrival_s: float, model: str, row: dict[str, str], priority: int, tenant: str) -> TraceTask:
    cost = COSTS[model]
    tokens_in, tokens_out = int(row["input_tokens"]), int(row["output_tokens"])
    service_s = cost.service_s(tokens_in, tokens_out)
    return TraceTask(
        arrival_s=arrival_s,
        model=model,
        vram_gb=cost.vram_gb(tokens_in, tokens_out),
        priority=priority,
        service_s=service_s,
        est_s=service_s,  # the producer can compute it from the token counts
        preemptible=priority >= 2,
        tenant=tenant,
    )


def azure(rows: Iterable[dict[str, str]]) -> tuple[list[TraceTask], Counter[str]]:
    """Azure code + conv: priority by service (code P0, conv P1); the service is the tenant."""
    tasks: list[TraceTask] = []
    skipped: Counter[str] = Counter()
    for row in rows:
        model = row["model"]
        if model not in AZURE_PRIORITY:
            skipped["unknown model"] += 1
            continue
        tasks.append(_task(float(row["arrival_s"]), model, row, AZURE_PRIORITY[model], model))
    return tasks, skipped


def session_roots(rows: list[dict[str, str]]) -> list[int]:
    """Each row's session: the first request of its chain of real multi-turn reuse.

    ``parent_req`` alone links almost every request to row 0, because block 0 (a shared system
    prompt) is reused by nearly all of them. So a row joins its parent's session only when it
    reuses more than that first block (``reused_blocks > 1``); otherwise it starts its own.
    """
    roots: list[int] = []
    for i, row in enumerate(rows):
        parent = int(row["parent_req"])
        real_reuse = 0 <= parent < i and int(row["reused_blocks"]) > 1
        roots.append(roots[parent] if real_reuse else i)
    return roots


def mooncake(
    rows: Iterable[dict[str, str]], tier: Callable[[str], int]
) -> tuple[list[TraceTask], Counter[str]]:
    """Mooncake conversation: one session (see :func:`session_roots`) = one tenant = one tier."""
    listed = list(rows)
    roots = session_roots(listed)
    tasks: list[TraceTask] = []
    skipped: Counter[str] = Counter()
    for row, root in zip(listed, roots):
        if row["model"] not in COSTS:
            skipped["unknown model"] += 1
            continue
        session = f"session-{root}"
        tasks.append(_task(float(row["arrival_s"]), row["model"], row, tier(session), session))
    return tasks, skipped
