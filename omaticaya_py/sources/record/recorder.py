"""``Recorder``: one NVML session sampled into a trace document, sample by sample.

The document is the project's trace format, version 2 (``docs/trace-format.md``): the static
facts of every GPU (and of every MIG device), read at the first ``nvmlInit``, then one sample per
call with what NVML answered. Critical Xid and double-bit ECC events delivered since the last
sample go into that sample's ``xid_events``. When the library itself fails (init, the driver
gone) the sample is that error and the next sample starts a new session.
"""

from __future__ import annotations

from typing import Any

import pynvml

from ..nvml import decode
from .gpu import gpu_facts, gpu_sample
from .values import error, value

__all__ = ["Recorder"]

_XID_TYPES = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
#: NVIDIA's Xid for a double-bit ECC error (such an event carries no Xid of its own)
_XID_DOUBLE_BIT_ECC = 48


class Recorder:
    """Samples every GPU through NVML into a trace document (``doc``).

    ``sample(t)`` appends one sample at trace time ``t`` (seconds from the start); it never
    raises for an NVML failure (the failure is the sample). ``close()`` frees the event set and
    shuts NVML down. ``readings``: samples that read the GPUs (not a library error).
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.doc: dict[str, Any] = {
            "format_version": 2,
            "source": "recorded with omaticaya record (nvidia-ml-py) on a real GPU machine",
            "interval_s": interval_s,
            "samples": [],
        }
        self._handles: list[Any] | None = None
        self._events: Any = None
        self.readings = 0  # samples that read the GPUs (not a library error)

    # -- NVML session ---------------------------------------------------------------------

    def _start(self) -> list[Any]:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        if "devices" not in self.doc:
            self._static(handles)
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for h in handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, _XID_TYPES, self._events)
                except pynvml.NVMLError:
                    pass  # this GPU delivers no events (NotSupported): nothing to record
        except pynvml.NVMLError:
            self._events = None
        self._handles = handles
        return handles

    def _static(self, handles: list[Any]) -> None:
        doc = self.doc
        doc["driver_version"] = decode(value(pynvml.nvmlSystemGetDriverVersion))
        doc["nvml_version"] = decode(value(pynvml.nvmlSystemGetNVMLVersion))
        doc["cuda_driver_version"] = value(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        doc["device_count"] = len(handles)
        doc["devices"] = [gpu_facts(index, h) for index, h in enumerate(handles)]

    def _stop(self) -> None:
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except pynvml.NVMLError:
                pass
            self._events = None
        if self._handles is not None:
            self._handles = None
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        self._stop()

    # -- one sample -----------------------------------------------------------------------

    def _xids(self, handles: list[Any]) -> list[dict[str, int]]:
        """The events waiting in the event set: ``[{"index", "xid"}]`` (index -1: a GPU not
        known by UUID)."""
        if self._events is None:
            return []
        index_of = {}
        for i, h in enumerate(handles):
            try:
                index_of[decode(pynvml.nvmlDeviceGetUUID(h))] = i
            except pynvml.NVMLError:
                continue
        out = []
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError:  # Timeout: nothing more in this interval
                return out
            try:
                index = index_of.get(decode(pynvml.nvmlDeviceGetUUID(data.device)), -1)
            except pynvml.NVMLError:
                index = -1
            xid = (
                int(data.eventData)
                if data.eventType == pynvml.nvmlEventTypeXidCriticalError
                else _XID_DOUBLE_BIT_ECC
            )
            out.append({"index": index, "xid": xid})

    def sample(self, t: float) -> dict[str, Any]:
        """Read every GPU once and append the sample (see the class docstring)."""
        sample: dict[str, Any]
        try:
            handles = self._handles if self._handles is not None else self._start()
            sample = {"t": round(t, 3), "gpus": [gpu_sample(i, h) for i, h in enumerate(handles)]}
            xids = self._xids(handles)
            if xids:
                sample["xid_events"] = xids
            self.readings += 1
        except pynvml.NVMLError as exc:  # the library itself: init failed or the driver went
            self._stop()
            sample = {"t": round(t, 3), **error(exc)}
        self.doc["samples"].append(sample)
        return sample
