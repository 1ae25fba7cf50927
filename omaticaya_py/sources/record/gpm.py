"""GPM (Hopper and newer) in a recorded trace: per GPU per sample the ``gpm`` object
(``docs/trace-format.md``), what the NVML test library serves back.

Per GPU and per NVML session: ``nvmlGpmQueryDeviceSupport`` once (no ``gpm`` recorded where NVML says
no: absent is "no GPM"), two sample buffers; each sample takes a GPM sample and records the metrics between
it and the previous sample's, so a value recorded at sample k covers ``(t[k-1], t[k]]``. The
first sample of a session has no interval: ``{"supported": true}`` alone. A metric NVML could not
give is its error; a failed ``nvmlGpmMetricsGet`` is that error on every metric. MIG-enabled
GPUs record no ``gpm`` (a MIG instance's GPM is another API).
"""

from __future__ import annotations

from typing import Any

import pynvml

from ..nvml import LIBRARY_GONE
from .values import error

__all__ = ["METRICS", "GpmRecorder"]

#: trace field -> NVML_GPM_METRIC_*, in the order nvmlGpmMetricsGet is asked
METRICS = {
    "sm_active_pct": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "tensor_active_pct": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_bw_pct": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "graphics_pct": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "sm_occupancy_pct": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
}

_LOST = (pynvml.NVMLError_GpuIsLost, *LIBRARY_GONE)


class GpmRecorder:
    """One NVML session's GPM state per GPU index; ``stop()`` frees every buffer (before
    ``nvmlShutdown``)."""

    def __init__(self) -> None:
        self._supported: dict[int, bool] = {}
        self._kept: dict[int, Any] = {}  # index -> a filled sample
        self._spare: dict[int, Any] = {}

    def forget(self, index: int) -> None:
        """Free GPU ``index``'s buffers (lost, or the session ends)."""
        for pool in (self._kept, self._spare):
            sample = pool.pop(index, None)
            if sample is not None:
                try:
                    pynvml.nvmlGpmSampleFree(sample)
                except pynvml.NVMLError:
                    pass

    def stop(self) -> None:
        for index in set(self._kept) | set(self._spare):
            self.forget(index)
        self._supported.clear()

    def read(self, index: int, h: Any) -> dict[str, Any] | None:
        """The ``gpm`` object of GPU ``index`` in this sample (``None``: record none). Raises
        GpuIsLost (its buffers freed) and ``LIBRARY_GONE``."""
        try:
            return self._read(index, h)
        except pynvml.NVMLError_GpuIsLost:
            self.forget(index)
            raise

    def _read(self, index: int, h: Any) -> dict[str, Any] | None:
        supported = self._supported.get(index)
        if supported is None:
            try:
                supported = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            except pynvml.NVMLError_NotSupported:
                supported = False
            except _LOST:
                raise
            except pynvml.NVMLError as exc:
                return error(exc)  # asked again at the next sample
            self._supported[index] = supported
        if not supported:
            return None  # absent: a GPU without GPM (the trace of a pre-Hopper GPU as before)
        try:
            if index not in self._spare:
                self._spare[index] = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(h, self._spare[index])
        except pynvml.NVMLError_NotSupported:
            self._supported[index] = False
            self.forget(index)
            return None
        except _LOST:
            raise
        except pynvml.NVMLError as exc:
            return {"supported": True, **{name: error(exc) for name in METRICS}}
        out: dict[str, Any] = {"supported": True}
        kept = self._kept.get(index)
        if kept is not None:
            out |= self._metrics(kept, self._spare[index])
        self._kept[index], fresh = self._spare[index], kept
        if fresh is None:
            del self._spare[index]
        else:
            self._spare[index] = fresh
        return out

    @staticmethod
    def _metrics(first: Any, second: Any) -> dict[str, Any]:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(METRICS)
        request.sample1 = first
        request.sample2 = second
        for i, metric in enumerate(METRICS.values()):
            request.metrics[i].metricId = metric
        try:
            pynvml.nvmlGpmMetricsGet(request)
        except _LOST:
            raise
        except pynvml.NVMLError as exc:
            return {name: error(exc) for name in METRICS}
        out: dict[str, Any] = {}
        for i, name in enumerate(METRICS):
            m = request.metrics[i]
            if m.nvmlReturn == pynvml.NVML_SUCCESS:
                out[name] = round(min(100.0, max(0.0, float(m.value))), 3)
            else:
                out[name] = error(pynvml.NVMLError(m.nvmlReturn))
        return out
