"""RQ interop at the CLI boundary: without the rq extra, one clear line and a non-zero exit."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from gpuq.cli import cli

DEAD_REDIS = "redis://127.0.0.1:1/0"  # never reached: the rq check comes first
MISSING = "Error: configuration: RQ interop needs the rq extra: pip install 'gpuq[rq]' (rq>=2,<3)"


@pytest.fixture
def without_rq(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rq", None)  # import rq now raises ImportError


@pytest.mark.parametrize("args", [
    ["rq-bridge", "--rq-queue", "gpu"],
    ["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--rq-allow", "myjobs"],
])
def test_rq_options_without_the_extra_fail_with_one_line(without_rq: None, args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["--redis", DEAD_REDIS, *args])
    assert result.exit_code == 2  # bad input or configuration
    assert result.output.strip() == MISSING


def test_gpuq_imports_and_the_accessors_answer_without_rq(without_rq: None) -> None:
    from gpuq.rq import current_model
    from gpuq.rq.context import NoCurrentJob

    with pytest.raises(NoCurrentJob, match="no RQ job is running"):
        current_model()


def test_an_rq_other_than_2x_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import rq

    monkeypatch.setattr(rq, "__version__", "3.0.0")
    result = CliRunner().invoke(cli, ["--redis", DEAD_REDIS, "rq-bridge", "--rq-queue", "gpu"])
    assert result.exit_code == 2  # bad input or configuration
    assert result.output.strip() == ("Error: configuration: RQ interop supports rq 2.x, found rq "
                                     "3.0.0: pip install 'gpuq[rq]'")


@pytest.mark.parametrize("args, fragment", [
    (["--model", "m", "--vram-gb", "-1"], "vram_gb must be a finite number > 0"),
    (["--max-attempts", "0"], "max_attempts must be an integer in 1..100"),
])
def test_bad_bridge_defaults_are_refused_at_start(args: list[str], fragment: str) -> None:
    """Regression: they were checked job by job: the bridge took every queued job, marked
    each failed in RQ, and exited 0."""
    pytest.importorskip("rq")
    result = CliRunner().invoke(cli, ["--redis", DEAD_REDIS, "rq-bridge", "--rq-queue", "gpu", *args])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1  # bad input
    assert fragment in result.output


@pytest.mark.parametrize("given, fragment", [
    ("myapp.jobs", "must be a list of module names such as myapp.jobs, got 'myapp.jobs'"),
    (None, "must be a list of module names"),
    ([sys], "is not a module name"),
    ([""], "'' is not a module name"),
    (["myapp.*"], "'myapp.*' is not a module name (dotted, e.g. myapp.jobs; no patterns)"),
    (["myapp/jobs"], "is not a module name"),
    (["myapp.jobs:add"], "is not a module name"),
])
def test_an_rq_allowlist_that_names_no_modules_is_refused_in_one_line(given: object, fragment: str) -> None:
    """Found by a QA pass: App(rq_allow="myapp.jobs") allowed the modules a, b, j, m, ... (each
    letter), a module object or None gave a traceback, and --rq-allow '' or 'myapp.*'
    started a worker that refused every job."""
    from gpuq.errors import AppError, ConfigError
    from gpuq.rq.support import module_names

    with pytest.raises(AppError) as err:
        module_names(given, "app 'llm': rq_allow", AppError)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        module_names(given, "--rq-allow", ConfigError)
    got = module_names([" myapp.jobs ", "other_mod"], "--rq-allow", ConfigError)
    assert got == ["myapp.jobs", "other_mod"]
