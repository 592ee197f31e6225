"""GPU discovery: NVML when a driver is present, else the size the operator declares.

A worker owns one GPU or a group of GPUs on one host (``--gpu 0,1,2,3``, or declared
``--gpu-count 4 --vram-gb 80``), as one tensor-parallel inference server does: whatever it
loads is sharded evenly over every device of the group, so the group's VRAM is one figure
(``total_gb``, all devices) and the KV-cache reserve is kept on each device
(``reserve_gb``). Its class name carries the shape: ``4xNVIDIA A100-SXM4-80GB``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuq.errors import ConfigError

log = logging.getLogger(__name__)
GIB = float(1 << 30)
MAX_DECLARED_GB = 1e6  # per device: far above any GPU, low enough that every sum stays finite


@dataclass(frozen=True)
class GpuInfo:
    name: str  # the GPU class: the device name, prefixed "<count>x" for a group
    uuid: str  # comma-separated for a group
    total_gb: float  # every device of the group together
    index: int | None  # the first device's NVML index (None: declared)
    source: str  # "nvml" or "declared"
    count: int = 1  # devices in the group
    indices: tuple[int, ...] = ()  # NVML indices of the group's devices

    @property
    def device_gb(self) -> float:
        return self.total_gb / self.count

    def reserve_gb(self, per_device_gb: float) -> float:
        """The group's KV-cache reserve: the configured one on each device."""
        return per_device_gb * self.count

    @property
    def index_text(self) -> str:
        """The worker hash's gpu_index: "" declared, "0" or "0,1,2,3"."""
        return ",".join(str(i) for i in self.indices) if self.indices else (
            "" if self.index is None else str(self.index))


def class_name(name: str, count: int) -> str:
    return name if count == 1 else f"{count}x{name}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpu(index: int) -> GpuInfo:
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    if not 0 <= index < count:
        raise ConfigError(f"--gpu {index} does not exist: NVML sees {count} GPU(s)")
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuInfo(
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        total_gb=round(memory.total / GIB, 2),
        index=index,
        source="nvml",
    )


def nvml_used_gb(indices: tuple[int, ...]) -> list[float] | None:
    """VRAM in use on each device as NVML sees it, to cross-check the ledger; None without a
    driver."""
    try:
        import pynvml

        return [round(float(pynvml.nvmlDeviceGetMemoryInfo(
            pynvml.nvmlDeviceGetHandleByIndex(i)).used) / GIB, 2) for i in indices]
    except Exception:
        return None


def parse_indices(text: str) -> tuple[int, ...]:
    """``--gpu``: one NVML index or a comma-separated group of distinct ones."""
    try:
        indices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--gpu must be an index or a list like 0,1,2,3, got {text!r}") from None
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise ConfigError(f"--gpu must list distinct indices >= 0, got {text!r}")
    return indices


def nvml_group(indices: tuple[int, ...]) -> GpuInfo:
    """The group of NVML devices: one model of GPU (a tensor-parallel group shards evenly, so
    the smallest device bounds every shard)."""
    devices = [nvml_gpu(i) for i in indices]
    names = {d.name for d in devices}
    if len(names) > 1:
        raise ConfigError(f"--gpu {','.join(map(str, indices))} mixes GPU models "
                          f"({', '.join(sorted(names))}): a group shards evenly over one model")
    smallest = min(d.total_gb for d in devices)
    return GpuInfo(class_name(devices[0].name, len(devices)), ",".join(d.uuid for d in devices),
                   round(smallest * len(devices), 2), indices[0], "nvml", len(devices), indices)


def above_reserve(info: GpuInfo, kv_reserve_gb: float) -> GpuInfo:
    """A GPU no larger than the KV reserve is refused: its class would hold nothing."""
    if info.device_gb <= kv_reserve_gb:
        raise ConfigError(f"a GPU of {info.device_gb:g} GB leaves no room above the KV reserve of "
                          f"{kv_reserve_gb:g} GB per GPU (GPUQ_KV_RESERVE_GB)")
    return info


def probe(gpu: str | None, vram_gb: float | None, name: str | None, worker_id: str,
          count: int | None = None, kv_reserve_gb: float = 0.0) -> GpuInfo:
    """Declared size wins when given (simulated GPUs: ``count`` devices of ``vram_gb`` each);
    otherwise NVML must find every device of ``gpu`` (an index or a list, default 0)."""
    indices = parse_indices(gpu) if gpu is not None else None
    if name is not None and not (0 < len(name) <= 200 and name.isprintable()):
        raise ConfigError(f"--gpu-name must be 1..200 printable characters, got {name!r}")
    if name is not None and vram_gb is None:  # NVML names the devices it reads
        raise ConfigError("--gpu-name names a declared GPU: give its --vram-gb too")
    if count is not None and not 1 <= count <= 64:
        raise ConfigError(f"--gpu-count must be 1..64, got {count}")
    if count is not None and indices is not None and count != len(indices):
        raise ConfigError(f"--gpu-count {count} disagrees with --gpu {gpu} ({len(indices)} GPUs)")
    if vram_gb is not None:
        if not 0 < vram_gb <= MAX_DECLARED_GB:  # nan fails it too: a class size must be a number
            raise ConfigError(f"--vram-gb must be > 0 and <= {MAX_DECLARED_GB:.0f} (GB per GPU), "
                              f"got {vram_gb}")
        n = count or (len(indices) if indices else 1)
        info = above_reserve(GpuInfo(class_name(name or f"declared-{vram_gb:g}GB", n),
                                     f"declared-{worker_id}", vram_gb * n,
                                     indices[0] if indices else None, "declared", n, indices or ()),
                             kv_reserve_gb)
        log.info("gpu.declared name=%s count=%d vram_gb=%g each (declared size; NVML not used)",
                 info.name, n, vram_gb)
        return info
    if count is not None and indices is None:
        indices = tuple(range(count))
    try:
        info = above_reserve(nvml_group(indices or (0,)), kv_reserve_gb)
    except ConfigError:
        raise
    except Exception as exc:  # no driver, no library, no device
        raise ConfigError(
            f"no NVIDIA GPU found through NVML ({type(exc).__name__}: {exc}); "
            "declare a simulated one with --vram-gb and --gpu-name"
        ) from None
    log.info("gpu.nvml indices=%s name=%s uuid=%s vram_gb=%g", info.index_text, info.name,
             info.uuid, info.total_gb)
    return info
