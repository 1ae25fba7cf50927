"""NVML's raw answers as trace values: an error as ``{"nvml_error", "message"}``, memory,
processes, MIG attributes and MIG handles, as the trace format (version 2) writes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from ..nvml import LIBRARY_GONE

__all__ = ["attributes", "error", "memory", "mig_enabled", "mig_handles", "processes", "value"]


def error(exc: BaseException) -> dict[str, str]:
    """An NVML error as the trace records it: the pynvml class name and its message."""
    return {"nvml_error": type(exc).__name__, "message": str(exc)}


def value(fn: Callable[[], Any]) -> Any:
    """``fn()``, or the error NVML raised as ``{"nvml_error", "message"}``; a GPU or library
    failure propagates (it is recorded for the whole GPU or sample)."""
    try:
        return fn()
    except (pynvml.NVMLError_GpuIsLost, *LIBRARY_GONE):
        raise
    except pynvml.NVMLError as exc:
        return error(exc)


def memory(handle: Any) -> dict[str, int]:
    """``nvmlDeviceGetMemoryInfo`` in bytes: ``{"total", "used", "free"}``. Raises NVML's
    error."""
    m = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {"total": int(m.total), "used": int(m.used), "free": int(m.free)}


def processes(handle: Any) -> list[dict[str, Any]]:
    """``nvmlDeviceGetComputeRunningProcesses``: ``[{"pid", "usedGpuMemory" (bytes or
    None)}]``. Raises NVML's error."""
    return [
        {"pid": int(p.pid), "usedGpuMemory": p.usedGpuMemory}
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ]


def attributes(handle: Any) -> dict[str, int]:
    """A MIG device's ``nvmlDeviceGetAttributes_v2`` (counts, slices, ``memory_size_mb``).
    Raises NVML's error."""
    a = pynvml.nvmlDeviceGetAttributes_v2(handle)
    return {
        "multiprocessor_count": a.multiprocessorCount,
        "shared_copy_engine_count": a.sharedCopyEngineCount,
        "shared_decoder_count": a.sharedDecoderCount,
        "shared_encoder_count": a.sharedEncoderCount,
        "shared_jpeg_count": a.sharedJpegCount,
        "shared_ofa_count": a.sharedOfaCount,
        "gpu_instance_slice_count": a.gpuInstanceSliceCount,
        "compute_instance_slice_count": a.computeInstanceSliceCount,
        "memory_size_mb": a.memorySizeMB,
    }


def mig_handles(handle: Any) -> list[tuple[int, Any]]:
    """``(slot, MIG handle)`` of a GPU's MIG devices (an empty slot is NotFound). Raises the
    NVML error of ``nvmlDeviceGetMaxMigDeviceCount``."""
    out = []
    count = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    for slot in range(count):
        try:
            out.append((slot, pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue
    return out


def mig_enabled(handle: Any) -> bool:
    """Whether MIG is on (the current mode); False when NVML cannot say."""
    try:
        return bool(pynvml.nvmlDeviceGetMigMode(handle)[0])
    except pynvml.NVMLError:
        return False
