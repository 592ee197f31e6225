"""A real Prometheus server scrapes a real worker and the exporter with the compose stack's
configuration (targets swapped for local ports), loads its alert rules, and answers every
query of the Grafana dashboard.

The server binary comes from ``GPUQ_PROMETHEUS`` (``make test`` sets it with
``scripts/promtool.sh prometheus``) or PATH; with neither, the test skips and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from procs import ROOT, Procs, est, wait_for
from test_deploy import dashboard_exprs
from test_metrics import free_port

from gpuq import Queue, State

pytestmark = pytest.mark.slow

PROM = ROOT / "deploy" / "prometheus"


def prometheus_binary() -> str:
    path = os.environ.get("GPUQ_PROMETHEUS") or shutil.which("prometheus")
    if not path:
        pytest.skip("no prometheus: set GPUQ_PROMETHEUS (make test does, with "
                    "scripts/promtool.sh prometheus) or put prometheus on PATH")
    return path


def local_config(worker_port: int, exporter_port: int) -> dict[str, Any]:
    """The compose stack's prometheus.yml with local targets and a 1 s cadence."""
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert {j["job_name"] for j in cfg["scrape_configs"]} >= {"gpuq-exporter", "gpuq-worker"}
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str(PROM / f) for f in cfg["rule_files"]]
    cfg["scrape_configs"] = [
        {"job_name": "gpuq-exporter", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
        {"job_name": "gpuq-worker", "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]}]
    return cfg


def dashboard_queries(pool: str) -> list[str]:
    """Every dashboard query with Grafana's variables filled in (test_deploy checks that
    these two are the only ones used)."""
    return [e.replace("$__rate_interval", "1m").replace("$pool", pool) for _, e in dashboard_exprs()]


def test_prometheus_scrapes_worker_and_exporter_and_answers_the_dashboard(
        procs: Procs, real_queue: Queue, tmp_path: Path) -> None:
    binary = prometheus_binary()
    worker_port, exporter_port, prom_port = free_port(), free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(local_config(worker_port, exporter_port)))
    log = open(tmp_path / "prometheus.log", "wb")  # closed in finally
    server = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        procs.worker("w1", vram_gb=48, env={"GPUQ_METRICS_PORT": str(worker_port)})
        procs.start("exporter", ["exporter", "--port", str(exporter_port), "--host", "127.0.0.1"])
        procs.reaper()
        ids = [real_queue.enqueue("sim.run", {}, model="m", vram_gb=10, priority=f"P{i % 4}",
                                  est_s=est(0.02)).id for i in range(12)]
        procs.wait_all(ids, State.SUCCEEDED)

        def api(path: str, **query: str) -> Any:
            url = f"http://127.0.0.1:{prom_port}/api/v1/{path}"
            if query:
                url += "?" + urllib.parse.urlencode(query)
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)["data"]

        def both_up() -> bool:
            try:
                targets = api("targets")["activeTargets"]
                done = api("query", query=f'sum(gpuq_tasks_total{{pool="{procs.pool}"}})')["result"]
            except OSError:
                return False
            return (len(targets) == 2 and all(t["health"] == "up" for t in targets)
                    and bool(done) and float(done[0]["value"][1]) == 12)

        server_log = tmp_path / "prometheus.log"
        wait_for(both_up, 30, interval=0.5, message=lambda: (
            f"Prometheus to scrape both targets; its log:\n{server_log.read_text()[-3000:]}"))
        rules = [r for g in api("rules")["groups"] for r in g["rules"]]
        assert rules and all(r["health"] == "ok" for r in rules), rules
        queries = dashboard_queries(procs.pool)

        def answered() -> int | None:
            # a query Prometheus rejects raises HTTP 400; rates need a few scrapes to have data,
            # and the drained queues' panels (depth, oldest wait, model signals) stay empty
            n = sum(bool(api("query", query=q)["result"]) for q in queries)
            return n if n >= len(queries) - 6 else None

        wait_for(answered, 30, interval=1.0, message=lambda: "the dashboard's queries to have data")
        latency = api("query", query=f'sum(gpuq_schedule_latency_seconds_count{{pool="{procs.pool}"}})')
        assert float(latency["result"][0]["value"][1]) == 12
    finally:
        server.terminate()
        server.wait(15)
        log.close()
