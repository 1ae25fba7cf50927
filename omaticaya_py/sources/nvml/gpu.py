"""One read of one GPU: memory, utilisation, temperature, power, ECC, remapped rows, processes,
performance state, its MIG mode (asked on every read: ``mig.follow_mode``) and its MIG devices,
as a ``GpuReading``.

Where GPM is supported (``gpm.py``), utilisation is the SM activity between the previous read's
GPM sample and this read's (``sm_active_pct``, with ``tensor_active_pct`` and ``dram_bw_pct``)
and ``nvmlDeviceGetSamples`` is not called (2.35-2.8 ms a GPU on an H100); the first read after
an ``nvmlInit`` has no earlier GPM sample and takes ``nvmlDeviceGetUtilizationRates``. Elsewhere
(or when this read's GPM failed) utilisation is the mean of
``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` since the previous read (the driver keeps
a short ring of samples); when no sample is new, ``nvmlDeviceGetUtilizationRates`` is used. Fan speed and page retirement are not read (row
remapping is, on Ampere and later).
"""

from __future__ import annotations

from typing import Any

import pynvml

from ...core.model.snapshot import GpuReading
from .device import Device, attach
from .gpm import GPM_FIELDS, free, read_gpm
from .library import LIBRARY_GONE, LOST, MIB, Calls, error_name, processes
from .mig import follow_mode, read_migs

__all__ = ["read_gpu"]


def _utilization(
    calls: Calls, device: Device
) -> tuple[float | None, float | None, dict[str, float | None]]:
    """``(GPU %, memory %, GPM fields)`` of the GPU (see the module docstring); advances
    ``device.last_ts`` on the samples path. Raises ``LOST`` and ``LIBRARY_GONE``; any other
    error is absent."""
    handle = device.handle
    gpm = read_gpm(calls, device)
    rates = calls.field(
        "nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, handle
    )
    mem_pct = float(rates.memory) if rates is not None else None
    fields: dict[str, float | None] = {name: None for name, _ in GPM_FIELDS}
    if isinstance(gpm, dict):
        if not gpm:  # first read after nvmlInit: no interval yet
            return (float(rates.gpu) if rates is not None else None), mem_pct, fields
        fields.update(gpm)
        if gpm.get("sm_active_pct") is not None:
            return gpm["sm_active_pct"], mem_pct, fields
    return _sampled(calls, device, rates), mem_pct, fields


def _sampled(calls: Calls, device: Device, rates: Any) -> float | None:
    """The mean of the utilisation samples since ``device.last_ts`` (the rates' value when no
    sample is new)."""
    handle = device.handle
    try:
        samples = calls.call(
            "nvmlDeviceGetSamples",
            pynvml.nvmlDeviceGetSamples,
            handle,
            pynvml.NVML_GPU_UTILIZATION_SAMPLES,
            device.last_ts,
        )
    except pynvml.NVMLError_NotFound:  # no sample newer than last_ts
        samples = None
    except pynvml.NVMLError as exc:
        if isinstance(exc, LOST + LIBRARY_GONE):
            raise
        samples = None
    if samples:
        _, values = samples
        fresh = [s for s in values if s.timeStamp > device.last_ts]
        if fresh:
            device.last_ts = max(s.timeStamp for s in fresh)
            mean = sum(s.sampleValue.uiVal for s in fresh) / len(fresh)
            return float(mean)
    return float(rates.gpu) if rates is not None else None


def _static(device: Device) -> dict[str, Any]:
    """The ``GpuReading`` fields that come from the GPU's static facts (``device``)."""
    return {
        "index": device.index,
        "uuid": device.uuid,
        "product": device.product,
        "architecture": device.architecture,
        "compute_major": device.cc[0] if device.cc else None,
        "compute_minor": device.cc[1] if device.cc else None,
        "mig_enabled": device.mig_enabled,
    }


def read_gpu(calls: Calls, device: Device) -> GpuReading:
    """One read of ``device``: a field NVML does not support is ``None``; the GPU's own NVML
    error (lost, Unknown, ...) is ``GpuReading.error`` with its static facts kept. Raises
    ``LIBRARY_GONE`` (the whole node's error)."""
    if device.handle is None and not attach(calls, device):
        return GpuReading(index=device.index, error=pynvml.NVMLError_GpuIsLost.__name__)
    try:
        follow_mode(calls, device)
    except LIBRARY_GONE:
        raise
    except pynvml.NVMLError as exc:  # lost, or no handle to read its facts again
        free(calls, device)
        return GpuReading(error=error_name(exc), **_static(device))
    h = device.handle
    static = _static(device)
    try:
        mem = calls.call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        util, mem_util, gpm = _utilization(calls, device)
        sensors = _sensors(calls, h)
        procs = calls.field(
            "nvmlDeviceGetComputeRunningProcesses",
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            h,
        )
        migs = read_migs(calls, device) if device.mig_enabled else ()
    except LIBRARY_GONE:
        raise
    except pynvml.NVMLError as exc:
        if isinstance(exc, LOST):
            free(calls, device)  # its GPM samples are of a GPU gone: start again when back
        return GpuReading(error=error_name(exc), **static)
    return GpuReading(
        memory_total_mib=mem.total // MIB if mem is not None else device.total_mib,
        memory_used_mib=mem.used // MIB if mem is not None else None,
        memory_free_mib=mem.free // MIB if mem is not None else None,
        utilization_pct=util,
        memory_utilization_pct=mem_util,
        sm_active_pct=gpm["sm_active_pct"],
        tensor_active_pct=gpm["tensor_active_pct"],
        dram_bw_pct=gpm["dram_bw_pct"],
        **sensors,
        process_count=len(procs) if procs is not None else None,
        processes=processes(procs),
        mig_devices=migs,
        **static,
    )


def _sensors(calls: Calls, h: Any) -> dict[str, Any]:
    """The GPU ``h``'s temperature, power, performance state, volatile ECC counts and row
    remapping, as ``GpuReading``'s fields (``temperature_c``, ``power_w``,
    ``performance_state``, ``ecc_uncorrected_volatile``, ``ecc_corrected_volatile``,
    ``remapped_rows_pending``, ``remapped_rows_failure``): ``None`` where NVML does not
    support one. Raises the ``pynvml.NVMLError`` of the GPU (lost...) or ``LIBRARY_GONE``."""
    temp = calls.field(
        "nvmlDeviceGetTemperature",
        pynvml.nvmlDeviceGetTemperature,
        h,
        pynvml.NVML_TEMPERATURE_GPU,
    )
    power_mw = calls.field("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, h)
    pstate = calls.field("nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, h)
    ecc_u = calls.field(
        "nvmlDeviceGetTotalEccErrors",
        pynvml.nvmlDeviceGetTotalEccErrors,
        h,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    ecc_c = calls.field(
        "nvmlDeviceGetTotalEccErrors",
        pynvml.nvmlDeviceGetTotalEccErrors,
        h,
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    remap = calls.field("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, h)
    return {
        "temperature_c": int(temp) if temp is not None else None,
        "power_w": power_mw / 1000.0 if power_mw is not None else None,
        "performance_state": int(pstate) if pstate is not None else None,
        "ecc_uncorrected_volatile": int(ecc_u) if ecc_u is not None else None,
        "ecc_corrected_volatile": int(ecc_c) if ecc_c is not None else None,
        # (correctable, uncorrectable, isPending, failureOccurred)
        "remapped_rows_pending": bool(remap[2]) if remap is not None else None,
        "remapped_rows_failure": bool(remap[3]) if remap is not None else None,
    }
