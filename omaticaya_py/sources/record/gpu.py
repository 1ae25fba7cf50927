"""One GPU in the trace: its static facts (with its MIG devices') and its values in one sample,
NVML's raw answers (bytes, mW, mJ) with each field's error where it happened."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pynvml

from ..nvml import LIBRARY_GONE, decode
from .topology import pci_bus_id
from .values import attributes, error, memory, mig_enabled, mig_handles, processes, value

__all__ = ["gpu_facts", "gpu_sample"]


def gpu_facts(index: int, h: Any) -> dict[str, Any]:
    """A GPU's static facts as a trace ``devices`` entry: name, UUID, serial, PCI address
    (``pci_bus_id``, when NVML gives it), architecture, compute capability, MIG mode and, with MIG on, its MIG devices; a lost GPU is
    ``{"index", "nvml_error", "message"}``. Raises any other NVML error of a required fact."""
    try:
        device: dict[str, Any] = {
            "index": index,
            "name": decode(pynvml.nvmlDeviceGetName(h)),
            "uuid": decode(pynvml.nvmlDeviceGetUUID(h)),
            "serial": decode(value(lambda: pynvml.nvmlDeviceGetSerial(h))),
            "architecture": value(lambda: pynvml.nvmlDeviceGetArchitecture(h)),
            "cuda_compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
        }
        bus_id = pci_bus_id(h)
        if bus_id is not None:
            device["pci_bus_id"] = bus_id
        mode = value(lambda: list(pynvml.nvmlDeviceGetMigMode(h)))
        if isinstance(mode, list):
            device["mig_mode"] = mode
        if mig_enabled(h):
            device["max_mig_device_count"] = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
            device["mig_devices"] = [
                {
                    "index": slot,
                    "uuid": decode(pynvml.nvmlDeviceGetUUID(m)),
                    "name": decode(value(partial(pynvml.nvmlDeviceGetName, m))),
                    "gpu_instance_id": pynvml.nvmlDeviceGetGpuInstanceId(m),
                    "compute_instance_id": pynvml.nvmlDeviceGetComputeInstanceId(m),
                    "attributes": attributes(m),
                }
                for slot, m in mig_handles(h)
            ]
    except pynvml.NVMLError_GpuIsLost as exc:
        device = {"index": index, **error(exc)}
    return device


def _fields(h: Any) -> dict[str, Callable[[], Any]]:
    """The sample's fields of one GPU, by trace key, each one NVML call on ``h``."""

    def memory_v2() -> dict[str, int]:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        return {
            "version": int(v2.version),
            "total": int(v2.total),
            "reserved": int(v2.reserved),
            "used": int(v2.used),
            "free": int(v2.free),
        }

    def util() -> dict[str, int]:
        u = pynvml.nvmlDeviceGetUtilizationRates(h)
        return {"gpu": int(u.gpu), "memory": int(u.memory)}

    def remap() -> dict[str, int]:
        c, u, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
        return {"correctable": c, "uncorrectable": u, "pending": pending, "failure": failure}

    def ecc(kind: int, counter: int) -> Callable[[], int]:
        return lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(h, kind, counter))

    unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    return {
        "memory_v2_bytes": memory_v2,
        "utilization_pct": util,
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "power_mw": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "total_energy_mj": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
        "performance_state": lambda: pynvml.nvmlDeviceGetPerformanceState(h),
        "clock_sm_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "clock_mem_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "fan_speed_pct": lambda: pynvml.nvmlDeviceGetFanSpeed(h),
        "clocks_event_reasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "ecc_uncorrected_volatile": ecc(unc, pynvml.NVML_VOLATILE_ECC),
        "ecc_corrected_volatile": ecc(cor, pynvml.NVML_VOLATILE_ECC),
        "ecc_uncorrected_aggregate": ecc(unc, pynvml.NVML_AGGREGATE_ECC),
        "remapped_rows": remap,
        "retired_pages_dbe": lambda: len(
            pynvml.nvmlDeviceGetRetiredPages(
                h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            )
        ),
        "compute_processes": lambda: processes(h),
    }


def _mig_sample(slot: int, m: Any) -> dict[str, Any]:
    """One MIG device in a sample: memory (bytes) and processes, or its own error. Raises
    ``LIBRARY_GONE``."""
    try:
        return {
            "index": slot,
            "memory_bytes": memory(m),
            "compute_processes": value(lambda: processes(m)),
        }
    except LIBRARY_GONE:
        raise
    except pynvml.NVMLError as exc:
        return {"index": slot, **error(exc)}


def gpu_sample(index: int, h: Any) -> dict[str, Any]:
    """One GPU in a sample: memory (v1 and v2, bytes), every field of ``_fields`` and, with MIG
    on, its MIG devices; a field's error is that field's value, the GPU's own error (lost, ...,
    also when it falls off the bus after its first calls) is ``{"index", "nvml_error",
    "message"}``. Raises ``LIBRARY_GONE`` (the whole sample's)."""
    try:
        reading: dict[str, Any] = {"index": index, "memory_bytes": memory(h)}
    except pynvml.NVMLError_NotSupported as exc:
        reading = {"index": index, "memory_bytes": error(exc)}
    except LIBRARY_GONE:
        raise
    except pynvml.NVMLError as exc:
        return {"index": index, **error(exc)}
    try:
        for key, fn in _fields(h).items():
            reading[key] = value(fn)
        if mig_enabled(h):
            reading["mig_devices"] = [_mig_sample(slot, m) for slot, m in mig_handles(h)]
    except pynvml.NVMLError_GpuIsLost as exc:
        return {"index": index, **error(exc)}
    return reading
