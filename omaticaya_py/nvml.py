"""NVML reader: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

``NvmlReader.read()`` returns a ``NodeSnapshot`` and never raises for an NVML failure:
- the library cannot start or the driver is gone -> ``NodeSnapshot.error`` (health Unknown);
  the next read tries ``nvmlInit`` again, so the agent recovers without a restart;
- one GPU cannot be read (GpuIsLost, Unknown, ...) -> that GPU's ``GpuReading.error``;
- one field is NotSupported (fan speed, retired pages on H100, ...) -> ``None`` (absent).
Every error other than NotSupported is counted in ``errors`` by ``(call, error name)``.

Static facts (name, UUID, architecture, compute capability, total memory) are read once per
``nvmlInit``; each read then costs memory, utilisation samples, temperature, power, ECC,
remapped rows, process list and performance state per GPU.

Utilisation is the mean of ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` since the
previous read (the driver keeps a short ring of samples); when no sample is new,
``nvmlDeviceGetUtilizationRates`` is used.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

import pynvml

from .snapshot import ARCHITECTURES, GpuReading, NodeSnapshot, XidEvent

__all__ = ["NvmlReader", "nvml_available"]

T = TypeVar("T")
MIB = 1024 * 1024
_LOST = (pynvml.NVMLError_GpuIsLost,)
_LIBRARY_GONE = (
    pynvml.NVMLError_Uninitialized,
    pynvml.NVMLError_DriverNotLoaded,
    pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_LibRmVersionMismatch,
)


def nvml_available() -> bool:
    """True when NVML initialises here (a GPU and its driver are present)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _name(exc: BaseException) -> str:
    return type(exc).__name__


class _Device:
    """A GPU handle with its static facts, read once per ``nvmlInit``."""

    __slots__ = ("index", "handle", "uuid", "product", "architecture", "cc", "total_mib", "last_ts")

    def __init__(self, index: int, handle: Any, facts: dict[str, Any]) -> None:
        self.index = index
        self.handle = handle
        self.uuid = facts.get("uuid")
        self.product = facts.get("product")
        self.architecture = facts.get("architecture")
        self.cc = facts.get("cc")
        self.total_mib = facts.get("total_mib")
        self.last_ts = 0  # NVML sample timestamp (µs) of the newest utilisation sample seen


class NvmlReader:
    """``Reader`` over the real NVML library.

    ``watch_xid``: run a background thread on an NVML event set
    (``nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError``) with
    ``nvmlEventSetWait_v2(timeout)``; events are handed to the next ``read()``.
    ``clock`` gives ``NodeSnapshot.clock_s`` (monotonic seconds).
    """

    def __init__(
        self, *, watch_xid: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.watch_xid = watch_xid
        self.errors: Counter[tuple[str, str]] = Counter()
        self.call_s = 0.0  # seconds spent inside NVML calls (bench)
        self._devices: list[_Device] | None = None
        self._driver: str | None = None
        self._cuda: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._events: list[XidEvent] = []
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._topology: dict[tuple[str, str], int | None] = {}

    # -- helpers -------------------------------------------------------------------------

    def _call(self, call: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``; NotSupported -> None; other NVML errors counted and re-raised."""
        start = time.perf_counter()
        try:
            return fn(*args)
        except pynvml.NVMLError_NotSupported:
            return None
        except pynvml.NVMLError as exc:
            self.errors[(call, _name(exc))] += 1
            raise
        finally:
            self.call_s += time.perf_counter() - start

    def _field(self, call: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Like ``_call`` but a non-fatal error of one field is absent, not a GPU failure."""
        try:
            return self._call(call, fn, *args)
        except _LOST + _LIBRARY_GONE:
            raise
        except pynvml.NVMLError:
            return None

    # -- lifecycle -----------------------------------------------------------------------

    def _init(self) -> None:
        self._call("nvmlInit", pynvml.nvmlInit)
        driver = self._field("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        self._driver = driver.decode() if isinstance(driver, bytes) else driver
        cuda = self._field(
            "nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2
        )
        self._cuda = (cuda // 1000, (cuda % 1000) // 10) if cuda else None
        count = self._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount) or 0
        devices = []
        for index in range(count):
            handle = self._call(
                "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
            )
            devices.append(_Device(index, handle, self._facts(handle)))
        self._devices = devices
        if self.watch_xid and self._watcher is None and devices:
            self._stop.clear()
            self._watcher = threading.Thread(target=self._watch, name="nvml-xid", daemon=True)
            self._watcher.start()

    def _facts(self, handle: Any) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        try:
            name = self._field("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle)
            facts["product"] = name.decode() if isinstance(name, bytes) else name
            uuid = self._field("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
            facts["uuid"] = uuid.decode() if isinstance(uuid, bytes) else uuid
            arch = self._field("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, handle)
            facts["architecture"] = ARCHITECTURES.get(arch) if arch is not None else None
            facts["cc"] = self._field(
                "nvmlDeviceGetCudaComputeCapability",
                pynvml.nvmlDeviceGetCudaComputeCapability,
                handle,
            )
            mem = self._field("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
            facts["total_mib"] = mem.total // MIB if mem is not None else None
        except pynvml.NVMLError:
            pass  # a GPU lost at start: its reads will say so
        return facts

    def _shutdown(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
            self._watcher = None
        if self._devices is not None:
            self._devices = None
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def close(self) -> None:
        """Stop the Xid thread and shut NVML down."""
        self._shutdown()

    # -- Xid events ----------------------------------------------------------------------

    def _watch(self) -> None:
        types = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        try:
            event_set = pynvml.nvmlEventSetCreate()
            by_handle: dict[int, int] = {}
            for device in self._devices or ():
                try:
                    pynvml.nvmlDeviceRegisterEvents(device.handle, types, event_set)
                except pynvml.NVMLError as exc:
                    self.errors[("nvmlDeviceRegisterEvents", _name(exc))] += 1
                by_handle[id(device.handle)] = device.index
            uuid_index = {d.uuid: d.index for d in self._devices or () if d.uuid}
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    self.errors[("nvmlEventSetWait_v2", _name(exc))] += 1
                    time.sleep(1)
                    continue
                index = self._event_index(data, uuid_index)
                xid = int(data.eventData) if data.eventType == pynvml.nvmlEventTypeXidCriticalError else 48
                with self._lock:  # Xid 48 is NVIDIA's code for a double-bit ECC error
                    self._events.append(XidEvent(index=index, xid=xid, at_s=self.clock()))
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as exc:
            self.errors[("nvmlEventSetCreate", _name(exc))] += 1

    def _event_index(self, data: Any, uuid_index: dict[str | None, int]) -> int:
        try:
            uuid = pynvml.nvmlDeviceGetUUID(data.device)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            return uuid_index.get(uuid, -1)
        except pynvml.NVMLError:
            return -1

    def _take_events(self) -> tuple[XidEvent, ...]:
        with self._lock:
            events, self._events = tuple(self._events), []
        return events

    # -- topology ------------------------------------------------------------------------

    def topology_level(self, uuid_a: str, uuid_b: str) -> int | None:
        """``nvmlDeviceGetTopologyCommonAncestor`` between two GPUs by UUID: 0 same board,
        10 one PCIe switch, 20 several switches, 30 host bridge, 40 same NUMA node, 50 across
        the system (``NVML_TOPOLOGY_*``); lower is closer. ``None`` when unknown. Cached."""
        key = (uuid_a, uuid_b) if uuid_a <= uuid_b else (uuid_b, uuid_a)
        if key in self._topology:
            return self._topology[key]
        handles = {d.uuid: d.handle for d in self._devices or ()}
        level = None
        if uuid_a in handles and uuid_b in handles:
            try:
                level = self._call(
                    "nvmlDeviceGetTopologyCommonAncestor",
                    pynvml.nvmlDeviceGetTopologyCommonAncestor,
                    handles[uuid_a],
                    handles[uuid_b],
                )
            except pynvml.NVMLError:
                level = None
            self._topology[key] = level
        return level

    # -- reading -------------------------------------------------------------------------

    def _utilization(self, device: _Device) -> tuple[float | None, float | None]:
        handle = device.handle
        rates = self._field(
            "nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, handle
        )
        mem_pct = float(rates.memory) if rates is not None else None
        try:
            samples = self._call(
                "nvmlDeviceGetSamples",
                pynvml.nvmlDeviceGetSamples,
                handle,
                pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                device.last_ts,
            )
        except pynvml.NVMLError_NotFound:  # no sample newer than last_ts
            samples = None
        except pynvml.NVMLError as exc:
            if isinstance(exc, _LOST + _LIBRARY_GONE):
                raise
            samples = None
        if samples:
            _, values = samples
            fresh = [s for s in values if s.timeStamp > device.last_ts]
            if fresh:
                device.last_ts = max(s.timeStamp for s in fresh)
                mean = sum(s.sampleValue.uiVal for s in fresh) / len(fresh)
                return float(mean), mem_pct
        return (float(rates.gpu) if rates is not None else None), mem_pct

    def _read_gpu(self, device: _Device) -> GpuReading:
        h = device.handle
        static = {
            "index": device.index,
            "uuid": device.uuid,
            "product": device.product,
            "architecture": device.architecture,
            "compute_major": device.cc[0] if device.cc else None,
            "compute_minor": device.cc[1] if device.cc else None,
        }
        try:
            mem = self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
            util, mem_util = self._utilization(device)
            temp = self._field(
                "nvmlDeviceGetTemperature",
                pynvml.nvmlDeviceGetTemperature,
                h,
                pynvml.NVML_TEMPERATURE_GPU,
            )
            power_mw = self._field("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, h)
            pstate = self._field(
                "nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, h
            )
            ecc_u = self._field(
                "nvmlDeviceGetTotalEccErrors",
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            ecc_c = self._field(
                "nvmlDeviceGetTotalEccErrors",
                pynvml.nvmlDeviceGetTotalEccErrors,
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            remap = self._field("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, h)
            procs = self._field(
                "nvmlDeviceGetComputeRunningProcesses",
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                h,
            )
        except _LIBRARY_GONE:
            raise
        except pynvml.NVMLError as exc:
            return GpuReading(error=_name(exc), **static)
        return GpuReading(
            memory_total_mib=mem.total // MIB if mem is not None else device.total_mib,
            memory_used_mib=mem.used // MIB if mem is not None else None,
            memory_free_mib=mem.free // MIB if mem is not None else None,
            utilization_pct=util,
            memory_utilization_pct=mem_util,
            temperature_c=int(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            performance_state=int(pstate) if pstate is not None else None,
            ecc_uncorrected_volatile=int(ecc_u) if ecc_u is not None else None,
            ecc_corrected_volatile=int(ecc_c) if ecc_c is not None else None,
            # (correctable, uncorrectable, isPending, failureOccurred)
            remapped_rows_pending=bool(remap[2]) if remap is not None else None,
            remapped_rows_failure=bool(remap[3]) if remap is not None else None,
            process_count=len(procs) if procs is not None else None,
            **static,
        )

    def read(self) -> NodeSnapshot:
        """Read every GPU (see the module docstring). Never raises for an NVML failure."""
        read_at = datetime.now(timezone.utc)
        now = self.clock()
        try:
            if self._devices is None:
                self._init()
            gpus = tuple(self._read_gpu(d) for d in self._devices or ())
        except pynvml.NVMLError as exc:
            self._shutdown()  # re-init on the next read: the driver may come back
            return NodeSnapshot(read_at=read_at, clock_s=now, error=_name(exc), source="nvml")
        return NodeSnapshot(
            read_at=read_at,
            clock_s=now,
            gpus=gpus,
            driver_version=self._driver,
            cuda_driver_version=self._cuda,
            xid_events=self._take_events(),
            source="nvml",
        )
