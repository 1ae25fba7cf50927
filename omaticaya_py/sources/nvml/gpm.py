"""GPM (GPU Performance Monitoring, Hopper and newer): one GPU's SM activity, tensor activity
and DRAM bandwidth over the interval since the previous read.

Per GPU and per ``nvmlInit``: ``nvmlGpmQueryDeviceSupport`` once; two GPM sample buffers
(``nvmlGpmSampleAlloc``); each read fills the spare one (``nvmlGpmSampleGet``), asks
``nvmlGpmMetricsGet`` for ``SM_UTIL``, ``ANY_TENSOR_UTIL`` and ``DRAM_BW_UTIL`` between the kept
sample and it (one call), and keeps the new one. The buffers are freed on a re-init, ``close()``
and a lost GPU (``free``). Every call goes through ``Calls`` under its NVML name.
"""

from __future__ import annotations

from typing import Any

import pynvml

from .device import Device
from .library import LIBRARY_GONE, LOST, Calls

__all__ = ["GPM_FIELDS", "GpmResult", "free", "read_gpm"]

#: (GpuReading field, NVML_GPM_METRIC_*) in the order ``nvmlGpmMetricsGet`` is asked
GPM_FIELDS = (
    ("sm_active_pct", pynvml.NVML_GPM_METRIC_SM_UTIL),
    ("tensor_active_pct", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("dram_bw_pct", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL),
)

#: what ``read_gpm`` answers: ``None`` = GPM not used on this GPU (the samples path);
#: ``{}`` = GPM supported but no interval this read (first read after an init: the
#: instantaneous utilisation rates); else the fields (a metric that failed: ``None``), or the
#: string ``"error"`` = this read's GPM failed (fields ``None``, the samples path)
GpmResult = dict[str, float | None] | str | None


def _clamp(value: float) -> float:
    return min(100.0, max(0.0, float(value)))


def free(calls: Calls, device: Device) -> None:
    """Free ``device``'s GPM sample buffers (re-init, close, lost GPU); never raises."""
    for sample in (device.gpm_kept, device.gpm_spare):
        if sample is None:
            continue
        try:
            calls.call("nvmlGpmSampleFree", pynvml.nvmlGpmSampleFree, sample)
        except pynvml.NVMLError:
            pass
    device.gpm_kept = device.gpm_spare = None
    device.gpm_filled = False


def _supported(calls: Calls, device: Device) -> bool:
    """``nvmlGpmQueryDeviceSupport`` once per ``nvmlInit`` (``device.gpm_supported``); an
    error other than a lost GPU or a gone library is asked again at the next read."""
    if device.gpm_supported is None:
        if device.mig_enabled:
            device.gpm_supported = False  # GPM of a MIG instance is another API: not read
            return False
        try:
            support = calls.call(
                "nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport, device.handle
            )
        except LOST + LIBRARY_GONE:
            raise
        except pynvml.NVMLError:
            return False
        device.gpm_supported = bool(support is not None and support.isSupportedDevice)
    return device.gpm_supported


def _request() -> Any:
    """A ``c_nvmlGpmMetricsGet_t`` asking for ``GPM_FIELDS`` (about 19 KB: pynvml sizes its
    array at ``NVML_GPM_METRIC_MAX``, so one is made per GPU and reused)."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_FIELDS)
    for i, (_, metric) in enumerate(GPM_FIELDS):
        request.metrics[i].metricId = metric
    return request


def _metrics(
    calls: Calls, device: Device, first: Any, second: Any
) -> dict[str, float | None] | None:
    """``nvmlGpmMetricsGet`` for ``GPM_FIELDS`` between two samples (one call); ``None`` when
    the call fails with anything but a lost GPU or a gone library (raised)."""
    request = device.gpm_request
    if request is None:
        request = device.gpm_request = _request()
    request.sample1 = first
    request.sample2 = second
    try:
        got = calls.call("nvmlGpmMetricsGet", pynvml.nvmlGpmMetricsGet, request)
    except LOST + LIBRARY_GONE:
        raise
    except pynvml.NVMLError:
        return None
    if got is None:  # NotSupported for the pair
        return None
    out: dict[str, float | None] = {}
    for i, (name, _) in enumerate(GPM_FIELDS):
        m = request.metrics[i]
        out[name] = _clamp(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else None
    return out


def read_gpm(calls: Calls, device: Device) -> GpmResult:
    """This read's GPM metrics for ``device`` (see ``GpmResult``). Raises ``LOST`` (the
    buffers freed first) and ``LIBRARY_GONE``."""
    if device.handle is None or not _supported(calls, device):
        return None
    try:
        if device.gpm_kept is None:
            device.gpm_kept = calls.call("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)
            device.gpm_filled = False
        if device.gpm_spare is None:
            device.gpm_spare = calls.call("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)
        if device.gpm_kept is None or device.gpm_spare is None:  # NotSupported
            device.gpm_supported = False
            free(calls, device)
            return None
        got = calls.call(
            "nvmlGpmSampleGet", pynvml.nvmlGpmSampleGet, device.handle, device.gpm_spare
        )
    except LOST:
        free(calls, device)
        raise
    except LIBRARY_GONE:
        raise
    except pynvml.NVMLError:
        return "error"
    if got is None:  # NotSupported: GPM off for this GPU until the next init
        device.gpm_supported = False
        free(calls, device)
        return None
    had = device.gpm_filled
    try:
        values = _metrics(calls, device, device.gpm_kept, device.gpm_spare) if had else {}
    except LOST:
        free(calls, device)
        raise
    # the newest sample is kept whatever the metrics said: the next interval starts here
    device.gpm_kept, device.gpm_spare = device.gpm_spare, device.gpm_kept
    device.gpm_filled = True
    return "error" if values is None else values
