"""The deployment files agree with gpuq and with each other.

- Prometheus' config and alert rules pass ``promtool check``, the rules' unit tests
  (``rules_test.yml``) pass ``promtool test rules``, and every dashboard query parses.
- The dashboard, the rules and the ScaledObject name only metric families gpuq exports
  (``gpuq.metrics.METRIC_NAMES``), in the form they take in exposition.
- docker-compose.yml runs every gpuq role from one image, with command lines the CLI accepts,
  and Prometheus scrapes what compose serves; the Kubernetes manifests parse and scale the
  workers on ``gpuq_workers_desired``.

promtool comes from ``GPUQ_PROMTOOL`` (``make test`` sets it with scripts/promtool.sh) or PATH;
with neither, the promtool tests skip and say so. Nothing here starts a server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from gpuq.cli import cli
from gpuq.config import Config
from gpuq.metrics import METRIC_NAMES, PoolCollector, PoolFigures

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PROM = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "gpuq.json"
K8S = ROOT / "deploy" / "k8s"

GPUQ_IMAGE = "gpuq:local"
THIRD_PARTY = {"redis": "redis:", "prometheus": "prom/prometheus:", "grafana": "grafana/grafana:"}
GPUQ_SERVICES = {"reaper", "exporter", "worker-sim", "worker-gpu"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_METRIC = re.compile(r"(?<![\w:$])gpuq_\w*")


# --- helpers ---------------------------------------------------------------------------------

def metric_names(expr: str) -> set[str]:
    """gpuq_* identifiers in a PromQL expression. Quoted strings (label values) are dropped
    first; label names never start with gpuq_, so what is left names metrics."""
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def unknown_metrics(expr: str) -> set[str]:
    """Names in ``expr`` that no gpuq family exposes: a histogram only as _bucket/_sum/_count,
    a counter as its _total name (which METRIC_NAMES already holds), a gauge as is."""
    bad = set()
    for name in metric_names(expr):
        kind = METRIC_NAMES.get(name)
        if kind is not None and kind != "histogram":
            continue
        base = next((name[: -len(s)] for s in HISTOGRAM_SERIES if name.endswith(s)), None)
        if base is None or METRIC_NAMES.get(base) != "histogram":
            bad.add(name)
    return bad


def families(expr: str) -> set[str]:
    out = set()
    for name in metric_names(expr):
        for s in HISTOGRAM_SERIES:
            if name.endswith(s) and METRIC_NAMES.get(name[: -len(s)]) == "histogram":
                name = name[: -len(s)]
        out.add(name)
    return out


def load_yaml(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def dashboard() -> dict[str, Any]:
    with DASHBOARD.open() as f:
        data: dict[str, Any] = json.load(f)
    return data


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every query target."""
    return [(p.get("title", ""), t["expr"]) for p in walk_panels(dashboard()["panels"])
            for t in p.get("targets", []) if "expr" in t]


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(PROM / "rules.yml")["groups"] for r in g["rules"]]


def compose_default(value: str) -> str:
    """``${VAR:-default}`` as compose expands it with VAR unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", str(value).strip())
    assert m, f"not a duration: {value!r}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]


def parse_gpuq_args(args: list[str]) -> click.Context:
    """Parse a gpuq command line (what follows the image's ``gpuq`` entrypoint) as the CLI
    would, without running anything; raises click's usage errors on an unknown option."""
    at = next((i for i, a in enumerate(args) if a in cli.commands), None)
    assert at is not None, f"no gpuq subcommand in {args}"
    parent = cli.make_context("gpuq", args[: at + 1])
    return cli.commands[args[at]].make_context(args[at], args[at + 1:], parent=parent)


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def known_env_names() -> set[str]:
    names = {f"GPUQ_{f.name.upper()}" for f in fields(Config)}
    commands = [cli, *cli.commands.values()]
    for cmd in commands:
        for p in cmd.params:
            if isinstance(p.envvar, str):
                names.add(p.envvar)
            elif p.envvar:
                names.update(p.envvar)
    if "GPUQ_SIM_TIME_SCALE" in (ROOT / "workers" / "sim.py").read_text():
        names.add("GPUQ_SIM_TIME_SCALE")  # the simulated app's own knob
    return names


def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE)
    return data


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        with path.open() as f:
            docs += [(path.name, d) for d in yaml.safe_load_all(f) if d is not None]
    return docs


def k8s(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in k8s_docs() if d["kind"] == kind]


def k8s_configmap() -> dict[str, str]:
    (cm,) = k8s("ConfigMap")
    data: dict[str, str] = cm["data"]
    return data


# --- promtool --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def promtool() -> str:
    path = os.environ.get("GPUQ_PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.skip("no promtool: set GPUQ_PROMTOOL (make test does, with scripts/promtool.sh) "
                    "or put promtool on PATH")
    assert os.access(path, os.X_OK), f"GPUQ_PROMTOOL={path} is not an executable file"
    return path


def run_promtool(promtool: str, *args: str) -> str:
    done = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{out}"
    return out


def test_prometheus_config_passes_promtool(promtool: str) -> None:
    out = run_promtool(promtool, "check", "config", "prometheus.yml")
    assert "1 rule files found" in out  # rules.yml, resolved next to the config


def test_alert_rules_pass_promtool(promtool: str) -> None:
    out = run_promtool(promtool, "check", "rules", "rules.yml")
    assert f"{len(alert_rules())} rules found" in out


def test_alert_rules_unit_tests_pass(promtool: str) -> None:
    run_promtool(promtool, "test", "rules", "rules_test.yml")


def test_dashboard_queries_parse(promtool: str, tmp_path: Path) -> None:
    """Each dashboard query, with Grafana's variables filled in, as a recording rule:
    promtool then parses it as Prometheus would."""
    rules = []
    for i, (_, expr) in enumerate(dashboard_exprs()):
        filled = expr.replace("$__rate_interval", "1m").replace("$pool", "default")
        assert "$" not in filled, f"unknown Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{i}", "expr": filled})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", str(path))


# target labels a scrape may add to each exporter's series (a Prometheus Operator's included)
SCRAPE_LABELS = ("instance", "job", "pod", "namespace", "service", "endpoint", "container")


def test_dashboard_figures_are_the_same_with_two_exporters(promtool: str, tmp_path: Path) -> None:
    """Each dashboard query over pool-level families answers the same for pool ``two``, scraped
    by two exporters whose every target label differs, as for pool ``one``, scraped by one."""
    figures = PoolFigures(pool="x", queues=[("P0", "a", 3, 2.0), ("P1", "b", 5, 9.0)],
                          running=2, delayed=1, unschedulable=1, parked=1, reaper_active=True,
                          stats={"enqueued": 7, "succeeded:P0": 5, "failed:P1": 2, "sla_met:P0": 4,
                                 "sla_missed:P0": 1, "preempt:yielded:P2": 1, "fair:P2": 1,
                                 "warm_hints": 3},
                          model_loads=[("a", 2, 30.0), ("b", 1, 12.0)],
                          workers={("c", "idle"): 1, ("c", "busy"): 2},
                          desired=[("class", "c", 3, 4), ("model", "a", 2, 3)])
    series = []
    for family in PoolCollector(lambda: figures).collect():
        for sample in family.samples:
            v = sample.value + 1  # no 0/0: NaN differs from itself
            values = f"0+{v}x20" if family.type == "counter" else f"{v}x20"
            for pool, exporters in (("one", ("a",)), ("two", ("a", "b"))):
                for e in exporters:
                    labels = {**sample.labels, "pool": pool}
                    labels |= {k: f"gpuq-exporter-{e}" for k in SCRAPE_LABELS}
                    text = ", ".join(f'{k}="{val}"' for k, val in sorted(labels.items()))
                    series.append({"series": f"{sample.name}{{{text}}}", "values": values})
    cases = []
    for _, expr in dashboard_exprs():
        if any(re.sub(r"_(bucket|sum|count)$", "", n) in WORKER_FAMILIES for n in metric_names(expr)):
            continue
        one, two = (f"({expr})".replace("$__rate_interval", "5m").replace("$pool", p)
                    for p in ("one", "two"))
        # a tolerance: sums of the same rates in another order may differ in the last bit
        differ = (f"count(abs({two} - {one}) > 1e-9) or count({two} unless {one})"
                  f" or count({one} unless {two})")
        cases.append({"expr": f"{differ} or vector(0)", "eval_time": "10m",
                      "exp_samples": [{"labels": "{}", "value": 0}]})
        cases.append({"expr": f"clamp_max(count({one}), 1)", "eval_time": "10m",  # not empty
                      "exp_samples": [{"labels": "{}", "value": 1}]})
    assert len(cases) >= 20
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": cases}]}))
    run_promtool(promtool, "test", "rules", str(path))


# --- alert rules -----------------------------------------------------------------------------

def test_alert_rules_name_only_gpuq_metrics() -> None:
    for rule in alert_rules():
        assert not unknown_metrics(rule["expr"]), (rule["alert"], unknown_metrics(rule["expr"]))
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_every_alert_has_a_firing_unit_test() -> None:
    tests = load_yaml(PROM / "rules_test.yml")["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", [])
             if case.get("exp_alerts")}
    assert {r["alert"] for r in alert_rules()} <= fired


def test_alert_rules_count_a_pool_once_whatever_the_exporters() -> None:
    """Regression: the SLA and failure rules summed pool-level counters across exporters, so
    with two exporters of one pool their volume floors (20 starts, 20 tasks) were met at half
    the real volume. Every pool-level selector sits directly in a ``max by (...)`` (through
    one range function at most), which counts it once; rules_test.yml feeds two exporters."""
    for rule in alert_rules():
        expr = " ".join(_STRING.sub('""', rule["expr"]).split())
        for name in metric_names(expr) - WORKER_FAMILIES:
            for m in re.finditer(rf"(?<!\w){name}(?!\w)", expr):
                before = re.sub(r"(rate|increase|deriv)\( ?$", "", expr[: m.start()].rstrip())
                assert re.search(r"max by \([\w, ]+\) \( ?$", before), (rule["alert"], expr)


def test_unknown_metric_names_are_caught() -> None:
    assert unknown_metrics('sum(rate(gpuq_tasks_total{outcome="failed"}[5m]))') == set()
    assert unknown_metrics("gpuq_schedule_latency_seconds_bucket") == set()
    assert unknown_metrics("gpuq_schedule_latency_seconds") == {"gpuq_schedule_latency_seconds"}
    assert unknown_metrics("rate(gpuq_tasks[5m]) + gpuq_queue_depth_sum") == {
        "gpuq_tasks", "gpuq_queue_depth_sum"}
    assert unknown_metrics('up{job="gpuq_exporter"} + gpuq_workers{gpu_class="x"}') == set()


# --- dashboard and Grafana provisioning ------------------------------------------------------

def test_dashboard_names_only_gpuq_metrics() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    for title, expr in exprs:
        assert not unknown_metrics(expr), (title, unknown_metrics(expr))
    for var in dashboard()["templating"]["list"]:
        query = var.get("definition") or var.get("query")
        query = query["query"] if isinstance(query, dict) else query
        assert not unknown_metrics(query), (var["name"], query)


def test_dashboard_shows_the_pool_essentials() -> None:
    exprs = [e for _, e in dashboard_exprs()]
    shown = set().union(*(families(e) for e in exprs))
    assert {
        "gpuq_queue_depth", "gpuq_schedule_latency_seconds", "gpuq_sla_attainment_ratio",
        "gpuq_sla_starts_total", "gpuq_gpu_vram_usage_ratio", "gpuq_preemptions_total",
        "gpuq_model_loads_total", "gpuq_model_load_seconds_total", "gpuq_workers_desired",
        "gpuq_workers_current", "gpuq_workers", "gpuq_tasks_total", "gpuq_task_phase_seconds",
    } <= shown
    assert any("histogram_quantile" in e and "gpuq_schedule_latency_seconds_bucket" in e
               and "priority" in e for e in exprs)
    assert any("gpuq_task_phase_seconds" in e and "phase" in e for e in exprs)
    assert any("gpuq_preemptions_total" in e and "kind" in e for e in exprs)


def test_dashboard_filters_every_query_by_the_pool_variable() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert "pool" in variables
    for title, expr in dashboard_exprs():
        for name in metric_names(expr):
            # every selector of a gpuq metric carries the pool matcher
            for m in re.finditer(rf"{name}(\{{[^}}]*\}})?", expr):
                assert m.group(1) and 'pool="$pool"' in m.group(1), (title, expr)


WORKER_FAMILIES = {"gpuq_schedule_latency_seconds", "gpuq_task_phase_seconds", "gpuq_worker_tasks_total",
                   "gpuq_gpu_vram_total_bytes", "gpuq_gpu_vram_usage_ratio", "gpuq_worker_running_tasks",
                   "gpuq_worker_loaded_models"}


def pool_family_labels() -> dict[str, set[str]]:
    """Each exporter family's own labels (exposition names), as ``PoolCollector`` writes them."""
    figures = PoolFigures(pool="p", queues=[("P0", "m", 1, 1.0)], stats={"enqueued": 1, "sla_met:P0": 1},
                          model_loads=[("m", 1, 1.0)], workers={("c", "idle"): 1},
                          desired=[("class", "c", 1, 1), ("model", "m", 1, 1)],
                          forecast=[("class", "c", 1.0, 1.0)], scale_age_s=1.0)
    labels: dict[str, set[str]] = {}
    for family in PoolCollector(lambda: figures).collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def test_dashboard_counts_a_pool_once_whatever_the_scrape_labels() -> None:
    """Regression: the dashboard collapsed exporters with ``max without (instance, job)``, but a
    scrape may add more target labels (``pod``, ``namespace``, ``service``, ``endpoint``,
    ``container`` under a Prometheus Operator), so two exporters of one pool still doubled its
    depths and rates. Every pool-level selector sits directly in a ``max`` (through one range
    function at most) over the family's own labels, or over fewer when that max is the
    outermost aggregation, so a pool counts once whatever labels the scrape adds."""
    own = pool_family_labels()
    for title, expr in dashboard_exprs():
        expr = " ".join(expr.split())
        for name in metric_names(expr):
            if re.sub(r"_(bucket|sum|count)$", "", name) in WORKER_FAMILIES:
                continue
            for m in re.finditer(rf"(?<!\w){name}(?!\w)", expr):
                before = re.sub(r"(rate|increase|deriv)\( ?$", "", expr[: m.start()].rstrip())
                agg = re.search(r"max(?: by \(([\w, ]*)\))? ?\( ?$", before)
                assert agg, (title, expr)
                by = {w for w in re.split(r"[, ]+", agg.group(1) or "") if w}
                outside = before[: agg.start()]
                outermost = outside.count("(") == outside.count(")")
                assert by == own[name] or (outermost and by < own[name]), (title, expr)


def test_dashboard_uses_the_provisioned_datasource() -> None:
    (source,) = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in walk_panels(dashboard()["panels"]) if "datasource" in p}
    uids |= {t["datasource"]["uid"] for p in walk_panels(dashboard()["panels"])
             for t in p.get("targets", [])}
    assert uids == {source["uid"]}


def test_grafana_provisioning_matches_compose_mounts() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    for source in mounts:
        assert (ROOT / source).is_dir(), source
    (provider,) = load_yaml(GRAFANA / "provisioning" / "dashboards" / "gpuq.yml")["providers"]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


# --- docker compose --------------------------------------------------------------------------

def test_compose_runs_every_gpuq_role_from_one_image() -> None:
    services = compose()["services"]
    gpuq = {name for name, s in services.items()
            if not (name in THIRD_PARTY and s.get("image", "").startswith(THIRD_PARTY[name]))}
    assert gpuq == GPUQ_SERVICES, "a service is neither gpuq nor a known third-party image"
    builds = {json.dumps(services[name].get("build"), sort_keys=True) for name in gpuq}
    assert {services[name]["image"] for name in gpuq} == {GPUQ_IMAGE}
    assert len(builds) == 1 and builds != {"null"}  # one build, so the image is built once
    for name in set(services) - gpuq:
        assert "build" not in services[name], name


def test_compose_gpuq_commands_parse_and_log_json() -> None:
    services = compose()["services"]
    for name in GPUQ_SERVICES:
        args = [str(a) for a in services[name]["command"]]
        ctx = parse_gpuq_args(args)
        assert ctx.parent is not None and ctx.parent.params["log_format"] == "json", name
    assert option(services["exporter"]["command"], "--port") == "9108"
    for name in ("worker-sim", "worker-gpu"):
        assert option(services[name]["command"], "--metrics-port") == "9200", name


def test_compose_env_names_are_gpuq_settings() -> None:
    known = known_env_names()
    for name, service in compose()["services"].items():
        env = service.get("environment") or {}
        unknown = {k for k in env if k.startswith("GPUQ_")} - known
        assert not unknown, (name, unknown)


def test_compose_workers_drain_within_their_stop_grace() -> None:
    services = compose()["services"]
    for name in ("worker-sim", "worker-gpu"):
        w = services[name]
        assert w["restart"] == "on-failure", name  # retired and drained workers exit 0, stay down
        grace = float(compose_default(w["environment"]["GPUQ_SHUTDOWN_GRACE_S"]))
        assert seconds(w["stop_grace_period"]) > grace, name
    gpu = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "--appendonly" in services["redis"]["command"]


def test_compose_publishes_on_loopback_only() -> None:
    published = {}
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
            published[name] = str(port)
    assert published["prometheus"] == "127.0.0.1:9090:9090"
    assert published["grafana"] == "127.0.0.1:3000:3000"


def test_prometheus_scrapes_what_compose_serves() -> None:
    config = load_yaml(PROM / "prometheus.yml")
    services = compose()["services"]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    (targets,) = [c["targets"] for c in jobs["gpuq-exporter"]["static_configs"]]
    assert targets == [f"exporter:{option(services['exporter']['command'], '--port')}"]
    (dns,) = jobs["gpuq-worker"]["dns_sd_configs"]
    serving = {name for name, s in services.items() if "--metrics-port" in s.get("command", [])}
    assert dns["type"] == "A" and set(dns["names"]) == serving
    assert {str(dns["port"])} == {option(services[n]["command"], "--metrics-port") for n in serving}
    for rule_file in config["rule_files"]:
        assert (PROM / rule_file).is_file()
    prom = services["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]


# --- Kubernetes ------------------------------------------------------------------------------

def test_k8s_manifests_parse_and_are_all_applied() -> None:
    docs = k8s_docs()
    assert docs
    for file, doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), file
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], file
            assert doc["metadata"].get("namespace", "gpuq") == "gpuq", file
    (kustomization,) = k8s("Kustomization")
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_k8s_scaledobject_follows_gpuq_workers_desired() -> None:
    (scaled,) = k8s("ScaledObject")
    deployments = {d["metadata"]["name"]: d for d in k8s("Deployment")}
    worker = deployments[scaled["spec"]["scaleTargetRef"]["name"]]
    assert "replicas" not in worker["spec"]  # KEDA's HPA owns the count
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    query = meta["query"]
    assert "gpuq_workers_desired" in metric_names(query)
    assert not unknown_metrics(query)
    assert f'pool="{k8s_configmap()["GPUQ_POOL"]}"' in query and "gpu_class=" in query
    # replicas = desired: an average of the metric over replicas, with a target of 1
    assert trigger.get("metricType", "AverageValue") == "AverageValue"
    assert str(meta["threshold"]) == "1"
    assert str(meta.get("ignoreNullValues")).lower() == "false"  # no data must not read as 0
    spec = scaled["spec"]
    assert spec["minReplicaCount"] == int(k8s_configmap()["GPUQ_MIN_WORKERS"])
    assert spec["maxReplicaCount"] > spec["minReplicaCount"]


def test_k8s_worker_one_gpu_per_pod_and_drains_within_grace() -> None:
    (scaled,) = k8s("ScaledObject")
    worker = {d["metadata"]["name"]: d for d in k8s("Deployment")}[
        scaled["spec"]["scaleTargetRef"]["name"]]
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod.get("restartPolicy", "Always") == "Always"
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert pod["terminationGracePeriodSeconds"] > float(k8s_configmap()["GPUQ_SHUTDOWN_GRACE_S"])
    args = container["args"]
    assert parse_gpuq_args(args).info_name == "worker"
    port = option(args, "--metrics-port")
    assert port is not None and {str(p["containerPort"]) for p in container["ports"]} == {port}
    assert worker["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == port


def test_k8s_gpuq_containers_parse_and_read_the_configmap() -> None:
    deployments = {d["metadata"]["name"]: d for d in k8s("Deployment")}
    roles = set()
    for name, d in deployments.items():
        for c in d["spec"]["template"]["spec"]["containers"]:
            ctx = parse_gpuq_args(c["args"])
            assert ctx.parent is not None and ctx.parent.params["log_format"] == "json", name
            roles.add(ctx.info_name)
            assert {"configMapRef": {"name": "gpuq"}} in c["envFrom"], name
    assert roles == {"worker", "reaper", "exporter"}
    assert deployments["gpuq-reaper"]["spec"]["replicas"] == 2  # one active, one standby
    (service,) = k8s("Service")
    exporter = deployments["gpuq-exporter"]["spec"]["template"]["spec"]["containers"][0]
    assert str(service["spec"]["ports"][0]["port"]) == option(exporter["args"], "--port")
    unknown = set(k8s_configmap()) - known_env_names()
    assert not unknown
