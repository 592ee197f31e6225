"""GPU discovery of one GPU or a group: declared sizes, NVML (a stand-in module), bad input."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from gpuq.errors import ConfigError
from gpuq.metrics import WorkerMetrics
from gpuq.worker.gpu import probe


def test_a_declared_group_spans_its_devices() -> None:
    gpu = probe(None, 80, "A100", "w", 4)
    assert (gpu.name, gpu.count, gpu.total_gb, gpu.device_gb) == ("4xA100", 4, 320, 80)
    assert gpu.reserve_gb(5) == 20
    assert gpu.index_text == ""


def test_one_declared_gpu_keeps_its_plain_class_name() -> None:
    gpu = probe(None, 24, "L4", "w")
    assert (gpu.name, gpu.count, gpu.total_gb, gpu.reserve_gb(5)) == ("L4", 1, 24, 5)


def test_a_declared_group_may_name_its_indices() -> None:
    gpu = probe("2,3", 80, None, "w")
    assert (gpu.name, gpu.count, gpu.indices, gpu.index_text) == ("2xdeclared-80GB", 2, (2, 3), "2,3")


@pytest.mark.parametrize("gpu, count, message", [
    ("0,0", None, "distinct indices"),
    ("a,b", None, "an index or a list"),
    ("-1", None, "distinct indices >= 0"),
    ("0,1", 4, "--gpu-count 4 disagrees with --gpu 0,1"),
    (None, 0, "--gpu-count must be 1..64"),
])
def test_bad_groups_are_refused_in_one_line(gpu: str | None, count: int | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        probe(gpu, 80, None, "w", count)


class FakeNvml(types.ModuleType):
    """pynvml as far as discovery uses it: devices by index, each a name and a total."""

    def __init__(self, devices: list[tuple[str, float]]) -> None:
        super().__init__("pynvml")
        self.devices = devices

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, i: int) -> str:
        return self.devices[i][0]

    def nvmlDeviceGetUUID(self, i: int) -> str:
        return f"GPU-{i}"

    def nvmlDeviceGetMemoryInfo(self, i: int) -> Any:
        return types.SimpleNamespace(total=int(self.devices[i][1] * (1 << 30)), used=1 << 30)


def test_an_nvml_group_reads_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([("H100", 79.6), ("H100", 79.4), ("H100", 79.6)]))
    gpu = probe("0,1,2", None, None, "w")
    # a group shards evenly: its smallest device bounds every shard
    assert (gpu.name, gpu.count, gpu.total_gb, gpu.uuid) == ("3xH100", 3, 238.2, "GPU-0,GPU-1,GPU-2")
    assert probe(None, None, None, "w", 2).indices == (0, 1)


def test_an_nvml_group_of_mixed_models_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([("H100", 80), ("A100", 80)]))
    with pytest.raises(ConfigError, match="mixes GPU models"):
        probe("0,1", None, None, "w")
    with pytest.raises(ConfigError, match="--gpu 2 does not exist: NVML sees 2"):
        probe("0,2", None, None, "w")


def test_a_group_exports_its_vram_per_device() -> None:
    metrics = WorkerMetrics("p", "w", "2xA100", devices=2)
    metrics.gpu_state(160, 80, [30.0, 50.0], running=1, models=1)
    got = {(s.labels["gpu"], s.labels.get("source")): s.value
           for family in metrics.registry.collect() if family.name.startswith("gpuq_gpu_vram")
           for s in family.samples}
    assert got == {("w:0", None): 80 * 2**30, ("w:1", None): 80 * 2**30,
                   ("w:0", "ledger"): 0.5, ("w:1", "ledger"): 0.5,
                   ("w:0", "nvml"): 30 / 80, ("w:1", "nvml"): 50 / 80}


@pytest.mark.parametrize("vram_gb, count", [(float("nan"), None), (float("inf"), None), (1e308, None),
                                            (1e308, 2), (1e6 + 1, 4), (0.0, None)])
def test_a_declared_size_must_be_a_finite_sane_number(vram_gb: float, count: int | None) -> None:
    """nan or inf would become the class size every reader of the pool chokes on."""
    with pytest.raises(ConfigError, match=r"--vram-gb must be > 0 and <= 1000000 \(GB per GPU\)"):
        probe(None, vram_gb, "L4", "w", count)
    assert probe(None, 1e6, "big", "w", 64).total_gb == 64e6  # the bound itself is accepted


@pytest.mark.parametrize("name", ["", "A100\x1b[2J", "x" * 201])
def test_a_declared_gpu_name_must_be_printable_and_not_empty(name: str) -> None:
    """An empty name (a shell variable left unset) became "declared-80GB" without a word."""
    with pytest.raises(ConfigError, match="--gpu-name must be 1..200 printable characters"):
        probe(None, 80, name, "w")


def test_a_gpu_name_without_a_declared_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="--gpu-name names a declared GPU: give its --vram-gb too"):
        probe("0", None, "A100", "w")
