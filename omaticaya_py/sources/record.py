"""``omaticaya record``: write a trace of this node's GPUs from real NVML.

The output is the project's trace format, version 2 (``docs/trace-format.md``): the static facts
of every GPU (and of every MIG device), then one sample per interval with what NVML answered,
errors recorded where they happened under the ``pynvml`` exception class name (a field that is
NotSupported, a GPU that is lost, the whole library gone). Critical Xid and double-bit ECC
events delivered in an interval go into that sample's ``xid_events``. A trace recorded here
replays with ``--trace`` and serves the NVML test library (``tests/nvml/``) unchanged, so a
user can replay their own GPUs or attach one to a bug report.

This is an NVML edge like ``nvml.py``: the values are NVML's raw answers (bytes, mW, mJ), not
the agent's rounded readings, so that a replay sees what the agent would have seen.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from .nvml import LIBRARY_GONE as _LIBRARY_GONE
from .nvml import decode as _text

__all__ = ["RecordError", "Recorder", "record"]

_XID_TYPES = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError


class RecordError(RuntimeError):
    """NVML never produced a reading: ``str()`` is one line naming the NVML error."""


def _error(exc: BaseException) -> dict[str, str]:
    return {"nvml_error": type(exc).__name__, "message": str(exc)}


def _value(fn: Callable[[], Any]) -> Any:
    """``fn()``, or the error NVML raised as ``{"nvml_error", "message"}``; a GPU or library
    failure propagates (it is recorded for the whole GPU or sample)."""
    try:
        return fn()
    except (pynvml.NVMLError_GpuIsLost, *_LIBRARY_GONE):
        raise
    except pynvml.NVMLError as exc:
        return _error(exc)


def _memory(handle: Any) -> dict[str, int]:
    m = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {"total": int(m.total), "used": int(m.used), "free": int(m.free)}


def _processes(handle: Any) -> list[dict[str, Any]]:
    return [
        {"pid": int(p.pid), "usedGpuMemory": p.usedGpuMemory}
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ]


def _attributes(handle: Any) -> dict[str, int]:
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


def _mig_handles(handle: Any) -> list[tuple[int, Any]]:
    """``(slot, MIG handle)`` of a GPU's MIG devices (an empty slot is NotFound)."""
    out = []
    count = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    for slot in range(count):
        try:
            out.append((slot, pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue
    return out


def _mig_enabled(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlDeviceGetMigMode(handle)[0])
    except pynvml.NVMLError:
        return False


class Recorder:
    """Samples every GPU through NVML into a trace document (``doc``).

    ``sample(t)`` appends one sample at trace time ``t`` (seconds from the start); it never
    raises for an NVML failure (the failure is the sample). ``close()`` frees the event set and
    shuts NVML down.
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
        doc["driver_version"] = _text(_value(pynvml.nvmlSystemGetDriverVersion))
        doc["nvml_version"] = _text(_value(pynvml.nvmlSystemGetNVMLVersion))
        doc["cuda_driver_version"] = _value(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        doc["device_count"] = len(handles)
        devices = []
        for index, h in enumerate(handles):
            try:
                device: dict[str, Any] = {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "serial": _text(_value(lambda h=h: pynvml.nvmlDeviceGetSerial(h))),
                    "architecture": _value(lambda h=h: pynvml.nvmlDeviceGetArchitecture(h)),
                    "cuda_compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                }
                mode = _value(lambda h=h: list(pynvml.nvmlDeviceGetMigMode(h)))
                if isinstance(mode, list):
                    device["mig_mode"] = mode
                if _mig_enabled(h):
                    device["max_mig_device_count"] = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
                    device["mig_devices"] = [
                        {
                            "index": slot,
                            "uuid": _text(pynvml.nvmlDeviceGetUUID(m)),
                            "name": _text(_value(lambda m=m: pynvml.nvmlDeviceGetName(m))),
                            "gpu_instance_id": pynvml.nvmlDeviceGetGpuInstanceId(m),
                            "compute_instance_id": pynvml.nvmlDeviceGetComputeInstanceId(m),
                            "attributes": _attributes(m),
                        }
                        for slot, m in _mig_handles(h)
                    ]
            except pynvml.NVMLError_GpuIsLost as exc:
                device = {"index": index, **_error(exc)}
            devices.append(device)
        doc["devices"] = devices

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

    def _gpu(self, index: int, h: Any) -> dict[str, Any]:
        try:
            reading: dict[str, Any] = {"index": index, "memory_bytes": _memory(h)}
        except pynvml.NVMLError_NotSupported as exc:
            reading = {"index": index, "memory_bytes": _error(exc)}
        except _LIBRARY_GONE:
            raise
        except pynvml.NVMLError as exc:
            return {"index": index, **_error(exc)}
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            reading["memory_v2_bytes"] = {
                "version": int(v2.version),
                "total": int(v2.total),
                "reserved": int(v2.reserved),
                "used": int(v2.used),
                "free": int(v2.free),
            }
        except _LIBRARY_GONE + (pynvml.NVMLError_GpuIsLost,):
            raise
        except pynvml.NVMLError as exc:
            reading["memory_v2_bytes"] = _error(exc)

        def util() -> dict[str, int]:
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            return {"gpu": int(u.gpu), "memory": int(u.memory)}

        def remap() -> dict[str, int]:
            c, u, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
            return {"correctable": c, "uncorrectable": u, "pending": pending, "failure": failure}

        def ecc(kind: int, counter: int) -> Callable[[], int]:
            return lambda: int(pynvml.nvmlDeviceGetTotalEccErrors(h, kind, counter))

        unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        fields: dict[str, Callable[[], Any]] = {
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
            "compute_processes": lambda: _processes(h),
        }
        try:
            for key, fn in fields.items():
                reading[key] = _value(fn)
            if _mig_enabled(h):
                reading["mig_devices"] = [self._mig(slot, m) for slot, m in _mig_handles(h)]
        except pynvml.NVMLError_GpuIsLost as exc:
            return {"index": index, **_error(exc)}
        return reading

    def _mig(self, slot: int, m: Any) -> dict[str, Any]:
        try:
            return {
                "index": slot,
                "memory_bytes": _memory(m),
                "compute_processes": _value(lambda: _processes(m)),
            }
        except _LIBRARY_GONE:
            raise
        except pynvml.NVMLError as exc:
            return {"index": slot, **_error(exc)}

    def _xids(self, handles: list[Any]) -> list[dict[str, int]]:
        if self._events is None:
            return []
        index_of = {}
        for i, h in enumerate(handles):
            try:
                index_of[_text(pynvml.nvmlDeviceGetUUID(h))] = i
            except pynvml.NVMLError:
                continue
        out = []
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError:  # Timeout: nothing more in this interval
                return out
            try:
                index = index_of.get(_text(pynvml.nvmlDeviceGetUUID(data.device)), -1)
            except pynvml.NVMLError:
                index = -1
            xid = (
                int(data.eventData)
                if data.eventType == pynvml.nvmlEventTypeXidCriticalError
                else 48  # NVIDIA's Xid for a double-bit ECC error
            )
            out.append({"index": index, "xid": xid})

    def sample(self, t: float) -> dict[str, Any]:
        """Read every GPU once and append the sample (see the class docstring)."""
        sample: dict[str, Any]
        try:
            handles = self._handles if self._handles is not None else self._start()
            sample = {"t": round(t, 3), "gpus": [self._gpu(i, h) for i, h in enumerate(handles)]}
            xids = self._xids(handles)
            if xids:
                sample["xid_events"] = xids
            self.readings += 1
        except pynvml.NVMLError as exc:  # the library itself: init failed or the driver went
            self._stop()
            sample = {"t": round(t, 3), **_error(exc)}
        self.doc["samples"].append(sample)
        return sample


def _write(doc: dict[str, Any], output: Path) -> None:
    """Write ``doc`` to ``output`` atomically (a temporary file in the same folder, renamed)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, output)


def record(
    output: Path,
    *,
    duration_s: float,
    interval_s: float,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Sample NVML every ``interval_s`` for ``duration_s`` seconds (or until ``stop`` is set, or
    SIGINT/SIGTERM in the main thread) and write the trace to ``output``. Returns the document.

    Raises ``RecordError`` when no sample could read the GPUs (the trace of errors is written
    all the same, for a bug report); ``OSError`` when ``output`` cannot be written.
    """
    stop = stop or threading.Event()
    restore: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore[sig] = signal.signal(sig, lambda *_: stop.set())
    recorder = Recorder(interval_s)
    start = clock()
    try:
        n = 0
        while not stop.is_set():
            due = start + n * interval_s
            if due - start > duration_s + 1e-9:
                break
            if stop.wait(max(due - clock(), 0.0)):
                break
            recorder.sample(clock() - start)
            n += 1
    finally:
        recorder.close()
        for sig, handler in restore.items():
            signal.signal(sig, handler)
    _write(recorder.doc, output)
    if recorder.readings == 0:
        errors = {s.get("nvml_error") for s in recorder.doc["samples"]} - {None}
        raise RecordError(
            f"NVML gave no reading ({', '.join(sorted(errors)) or 'no sample taken'}); "
            f"the errors are in {output}"
        )
    return recorder.doc
