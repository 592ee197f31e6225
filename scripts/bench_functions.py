#!/usr/bin/env python
"""What the hot-path scripts cost the server as FCALL of gpuq's function library, against EVALSHA.

An ``EVALSHA`` runs its script's whole chunk each time: before its first line of work it
makes a closure of every helper it includes and concatenates its key names. gpuq's function
library (``gpuq.functions``) runs that chunk once, at ``FUNCTION LOAD``, and gpuq sends FCALL;
EVALSHA remains where a server cannot load the library. This benchmark runs enqueue, claim
and ack both ways (``Sender.fcall`` switched per round) on one pool, interleaved round by
round: the same fleet as ``bench_scale.py`` (8 workers holding 2 of 10 models, 20,000 queued
no-op tasks), one claim and its ack per worker in turn, then one enqueue per acked task.

Figures: the median over rounds of the script's own server time (``INFO commandstats``) per
enqueue and per claim + ack, and Redis CPU per claim + ack (``INFO cpu``), each way
(docs/DECISIONS.md, "Client and scripts"). Needs Redis >= 7 (FUNCTION).

    python scripts/bench_functions.py              # 8 rounds of 1,000 lifecycles each way
    python scripts/bench_functions.py --rounds 4 --n 500
"""

from __future__ import annotations

import argparse
import statistics

import redis
from bench import scale as scale_point
from bench.common import log
from bench.scale_load import new_task
from bench.stats import server_cpu, usec_stats

from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer


def script_us(r: redis.Redis) -> int:
    """The scripts' µs since the last CONFIG RESETSTAT (FCALL and EVALSHA folded)."""
    return usec_stats(r).get("script", (0, 0))[1]


def round_of(p: scale_point.Point, r: redis.Redis, verb: str, n: int) -> dict[str, float]:
    """n claims and acks by the fleet's claimers in turn, then n enqueues, one way."""
    p.scripts.sender.fcall = verb == "fcall"
    claimed = []
    r.config_resetstat()
    cpu = server_cpu(r)
    for i in range(n):
        member = p.claimers[i % len(p.claimers)]
        call = p.calls.claim(member.request)
        task = p.scripts.run(call).task
        if task is None:
            raise RuntimeError("a warm claim found nothing: the pool ran dry")
        ack = p.calls.ack(task["id"], int(task["token"]), "null")
        p.scripts.run(ack)
        claimed.append(task["model"])
    out = {"claim_ack_cpu_us": (server_cpu(r) - cpu) / n * 1e6, "claim_ack_us": script_us(r) / n}
    r.config_resetstat()
    for model in claimed:
        p.scripts.run(p.calls.enqueue([new_task(model)]))
    out["enqueue_us"] = script_us(r) / n
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="interleaved rounds each way (default 8)")
    ap.add_argument("--n", type=int, default=1000, help="lifecycles per round (default 1000)")
    args = ap.parse_args(argv)
    with EmbeddedServer("redis") as server:
        r = connect(server.url)
        p = scale_point.Point(server.url, 8, 10, 20_000, scale_point.Sizes(
            calls=300, load_s=0.0, procs=1, reaper_rounds=1, scrapes=1))
        try:
            r.function_load(p.scripts.sender.library.source)
        except redis.ResponseError as exc:
            raise SystemExit(f"bench_functions: this server cannot load a function library: {exc}") from None
        for source in p.scripts.sender.sources.values():
            r.script_load(source)
        p.register()
        p.fill()
        got: dict[str, list[dict[str, float]]] = {"evalsha": [], "fcall": []}
        for k in range(max(1, args.rounds)):
            for verb in ("evalsha", "fcall") if k % 2 == 0 else ("fcall", "evalsha"):
                log(f"round {k + 1}/{args.rounds}: {verb}")
                got[verb].append(round_of(p, r, verb, args.n))
        p.close()
    print(f"{args.rounds} rounds of {args.n} lifecycles each way, medians (server µs):")
    for field, label in (("enqueue_us", "enqueue script"), ("claim_ack_us", "claim + ack scripts"),
                         ("claim_ack_cpu_us", "Redis CPU per claim + ack")):
        e, f = (statistics.median(x[field] for x in got[v]) for v in ("evalsha", "fcall"))
        print(f"  {label:<26} EVALSHA {e:7.1f}   FCALL {f:7.1f}   FCALL/EVALSHA {f / e:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
