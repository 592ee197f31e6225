"""GPU discovery: NVML when a driver is present, else the size the operator declares."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuq.errors import ConfigError

log = logging.getLogger(__name__)
GIB = float(1 << 30)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    uuid: str
    total_gb: float
    index: int | None
    source: str  # "nvml" or "declared"


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


def nvml_used_gb(index: int) -> float | None:
    """VRAM in use as NVML sees it, to cross-check the ledger; None without a driver."""
    try:
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return round(float(pynvml.nvmlDeviceGetMemoryInfo(handle).used) / GIB, 2)
    except Exception:
        return None


def probe(index: int | None, vram_gb: float | None, name: str | None, worker_id: str) -> GpuInfo:
    """Declared size wins when given (simulated GPUs); otherwise NVML must find the GPU."""
    if vram_gb is not None:
        if vram_gb <= 0:
            raise ConfigError(f"--vram-gb must be > 0, got {vram_gb}")
        info = GpuInfo(name or f"declared-{vram_gb:g}GB", f"declared-{worker_id}", vram_gb, index,
                       "declared")
        log.info("gpu.declared name=%s vram_gb=%g (declared size; NVML not used)", info.name, vram_gb)
        return info
    try:
        info = nvml_gpu(index or 0)
    except ConfigError:
        raise
    except Exception as exc:  # no driver, no library, no device
        raise ConfigError(
            f"no NVIDIA GPU found through NVML ({type(exc).__name__}: {exc}); "
            "declare a simulated one with --vram-gb and --gpu-name"
        ) from None
    log.info("gpu.nvml index=%s name=%s uuid=%s vram_gb=%g", info.index, info.name, info.uuid,
             info.total_gb)
    return info
