"""NVML reader: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

``NvmlReader.read()`` returns a ``NodeSnapshot`` and never raises for an NVML failure:
- the library cannot start or the driver is gone -> ``NodeSnapshot.error`` (health Unknown);
  the next read tries ``nvmlInit`` again, so the agent recovers without a restart;
- one GPU cannot be read (GpuIsLost, Unknown, ...) -> that GPU's ``GpuReading.error``;
- one field is NotSupported (ECC on a GPU without ECC, utilisation with MIG on, ...) -> ``None``
  (absent). Fan speed and page retirement are not read (row remapping is, on Ampere and later).
Every error other than NotSupported is counted in ``errors`` by ``(call, error name)``.

Static facts (name, UUID, architecture, compute capability, total memory) are read once per
``nvmlInit``; each read then costs memory, utilisation samples, temperature, power, ECC,
remapped rows, process list and performance state per GPU.

Utilisation is the mean of ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` since the
previous read (the driver keeps a short ring of samples); when no sample is new,
``nvmlDeviceGetUtilizationRates`` is used.

MIG: ``nvmlDeviceGetMigMode`` is read once per ``nvmlInit``; on a GPU with MIG on, every read
enumerates its MIG devices (``nvmlDeviceGetMaxMigDeviceCount``,
``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot is NotFound, not an error) and reads
each one's memory and processes on its own handle. A MIG device's static facts (UUID, name,
GPU/compute instance IDs, ``nvmlDeviceGetAttributes_v2`` -> profile name) are read the first
time its UUID is seen. NVML has no utilisation with MIG on (NotSupported: absent).

The Xid watcher has its own stop event; ``close()`` and a re-init wait for it to leave
``nvmlEventSetWait_v2`` before ``nvmlShutdown``. Its events name the GPU by UUID.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

import pynvml
from loguru import logger

from ..core.snapshot import (
    ARCHITECTURES,
    GpuReading,
    MigReading,
    NodeSnapshot,
    XidEvent,
    mig_profile_name,
)

__all__ = ["LIBRARY_GONE", "NvmlReader", "decode", "nvml_available"]

T = TypeVar("T")
MIB = 1024 * 1024
_LOST = (pynvml.NVMLError_GpuIsLost,)
#: NVML errors that mean the library itself is unusable (re-initialise; nothing per GPU)
LIBRARY_GONE = _LIBRARY_GONE = (
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


def decode(value: Any) -> Any:
    """NVML strings as ``str`` (older pynvml returns ``bytes``); anything else unchanged."""
    return value.decode() if isinstance(value, bytes) else value


_text = decode


class _Device:
    """A GPU handle with its static facts, read once per ``nvmlInit``."""

    __slots__ = (
        "index",
        "handle",
        "uuid",
        "product",
        "architecture",
        "cc",
        "total_mib",
        "total_bytes",
        "mig_enabled",
        "mig_facts",
        "last_ts",
    )

    def __init__(self, index: int, handle: Any, facts: dict[str, Any]) -> None:
        self.index = index
        self.handle = handle
        self.uuid = facts.get("uuid")
        self.product = facts.get("product")
        self.architecture = facts.get("architecture")
        self.cc = facts.get("cc")
        self.total_mib = facts.get("total_mib")
        self.total_bytes = facts.get("total_bytes")
        self.mig_enabled: bool | None = facts.get("mig_enabled")
        self.mig_facts: dict[str, dict[str, Any]] = {}  # MIG UUID -> static facts
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
        self._watcher_stop: threading.Event | None = None
        self._topology: dict[tuple[str, str], int | None] = {}

    # -- helpers -------------------------------------------------------------------------

    def _call(
        self, call: str, fn: Callable[..., T], *args: Any, expected: tuple[type, ...] = ()
    ) -> T | None:
        """``fn(*args)``; NotSupported -> None; other NVML errors counted and re-raised
        (those in ``expected`` re-raised uncounted: an empty MIG slot is NotFound)."""
        start = time.perf_counter()
        try:
            return fn(*args)
        except pynvml.NVMLError_NotSupported:
            return None
        except expected:
            raise
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
        self._driver = _text(driver)
        cuda = self._field(
            "nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2
        )
        self._cuda = (cuda // 1000, (cuda % 1000) // 10) if cuda else None
        count = self._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount) or 0
        devices = [_Device(index, None, {}) for index in range(count)]
        for device in devices:
            self._attach(device)
        self._devices = devices
        self._start_watcher()

    def _attach(self, device: _Device) -> bool:
        """Get a GPU's handle and static facts; False (handle None) while it is lost: one GPU
        off the bus is that GPU's error, never the whole node's. Retried on every read."""
        try:
            handle = self._call(
                "nvmlDeviceGetHandleByIndex",
                pynvml.nvmlDeviceGetHandleByIndex,
                device.index,
                expected=_LOST,
            )
        except _LOST:
            return False
        fresh = _Device(device.index, handle, self._facts(handle))
        for name in _Device.__slots__:
            setattr(device, name, getattr(fresh, name))
        return True

    def _start_watcher(self) -> None:
        """(Re)start the Xid watcher over the GPUs that have a handle."""
        watched = [d for d in self._devices or () if d.handle is not None]
        if not self.watch_xid or not watched:
            return
        if self._watcher is not None:
            self._stop_watcher()
        stop = threading.Event()  # this watcher's own: a later one never revives it
        self._watcher_stop = stop
        self._watcher = threading.Thread(
            target=self._watch, args=(watched, stop), name="nvml-xid", daemon=True
        )
        self._watcher.start()

    def _facts(self, handle: Any) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        try:
            name = self._field("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle)
            facts["product"] = _text(name)
            uuid = self._field("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
            facts["uuid"] = _text(uuid)
            arch = self._field("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, handle)
            facts["architecture"] = ARCHITECTURES.get(arch) if arch is not None else None
            facts["cc"] = self._field(
                "nvmlDeviceGetCudaComputeCapability",
                pynvml.nvmlDeviceGetCudaComputeCapability,
                handle,
            )
            mem = self._field("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
            facts["total_mib"] = mem.total // MIB if mem is not None else None
            facts["total_bytes"] = mem.total if mem is not None else None
            mig = self._field("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle)
            facts["mig_enabled"] = bool(mig[0]) if mig is not None else None
        except pynvml.NVMLError:
            pass  # a GPU lost at start: its reads will say so
        return facts

    #: longest a watcher can stay inside ``nvmlEventSetWait_v2`` (ms), and the join's margin
    _WAIT_MS = 1000
    _JOIN_S = 5.0

    def _stop_watcher(self) -> bool:
        """Stop the Xid watcher; True if it is still inside NVML after the join's margin."""
        watcher, stop = self._watcher, self._watcher_stop
        self._watcher = self._watcher_stop = None
        if stop is not None:
            stop.set()
        if watcher is None:
            return False
        watcher.join(timeout=self._JOIN_S)
        return watcher.is_alive()

    def _shutdown(self) -> None:
        alive = self._stop_watcher()
        if self._devices is not None:
            self._devices = None
            if alive:  # never pull NVML from under a thread still inside it
                self.errors[("nvmlShutdown", "XidWatcherStillWaiting")] += 1
                logger.warning("NVML: the Xid watcher did not stop; nvmlShutdown skipped")
                return
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def close(self) -> None:
        """Stop the Xid thread and shut NVML down."""
        self._shutdown()

    # -- Xid events ----------------------------------------------------------------------

    def _watch(self, devices: list[_Device], stop: threading.Event) -> None:
        """Deliver critical Xid and double-bit ECC events of ``devices`` until ``stop``."""
        types = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self.errors[("nvmlEventSetCreate", _name(exc))] += 1
            return
        try:
            for device in devices:
                try:
                    # a type the GPU cannot report makes NVML register nothing: mask first
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(device.handle)
                    pynvml.nvmlDeviceRegisterEvents(device.handle, types & supported, event_set)
                except pynvml.NVMLError as exc:
                    self.errors[("nvmlDeviceRegisterEvents", _name(exc))] += 1
            index_of = {d.uuid: d.index for d in devices if d.uuid}
            while not stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, self._WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    self.errors[("nvmlEventSetWait_v2", _name(exc))] += 1
                    stop.wait(1.0)
                    continue
                uuid = self._event_uuid(data)
                # Xid 48 is NVIDIA's code for a double-bit ECC error
                xid = int(data.eventData) if data.eventType == pynvml.nvmlEventTypeXidCriticalError else 48
                event = XidEvent(index=index_of.get(uuid, -1), xid=xid, at_s=self.clock(), uuid=uuid)
                with self._lock:
                    self._events.append(event)
        finally:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError:
                pass

    def _event_uuid(self, data: Any) -> str | None:
        """The UUID of the GPU an event came from (``nvmlDeviceGetUUID(eventData.device)``)."""
        try:
            return _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            return None

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

    def _mig_static(self, device: _Device, uuid: str, handle: Any) -> dict[str, Any]:
        """A MIG device's static facts, read once per UUID."""
        facts = device.mig_facts.get(uuid)
        if facts is not None:
            return facts
        facts = {"uuid": uuid}
        facts["gpu_instance_id"] = self._field(
            "nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, handle
        )
        facts["compute_instance_id"] = self._field(
            "nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, handle
        )
        attrs = self._field("nvmlDeviceGetAttributes_v2", pynvml.nvmlDeviceGetAttributes_v2, handle)
        facts["profile"] = None
        if attrs is not None and device.total_bytes:
            try:
                facts["profile"] = mig_profile_name(
                    attrs.gpuInstanceSliceCount,
                    attrs.computeInstanceSliceCount,
                    attrs.memorySizeMB,
                    device.total_bytes,
                )
            except ValueError:
                pass  # a zero slice count: no profile name rather than a wrong one
        device.mig_facts[uuid] = facts
        return facts

    def _read_mig(self, device: _Device, slot: int, handle: Any) -> MigReading:
        try:
            uuid = _text(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
            static = self._mig_static(device, uuid, handle) if uuid else {}
            mem = self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
            procs = self._field(
                "nvmlDeviceGetComputeRunningProcesses",
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                handle,
            )
        except _LIBRARY_GONE:
            raise
        except pynvml.NVMLError as exc:
            return MigReading(index=slot, error=_name(exc))
        return MigReading(
            index=slot,
            memory_total_mib=mem.total // MIB if mem is not None else None,
            memory_used_mib=mem.used // MIB if mem is not None else None,
            memory_free_mib=mem.free // MIB if mem is not None else None,
            process_count=len(procs) if procs is not None else None,
            **static,
        )

    def _read_migs(self, device: _Device) -> tuple[MigReading, ...]:
        """Every MIG device of a GPU with MIG on (see the module docstring)."""
        h = device.handle
        slots = self._call(
            "nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h
        )
        out = []
        for slot in range(slots or 0):
            try:
                handle = self._call(
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                    pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                    h,
                    slot,
                    expected=(pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument),
                )
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
                continue  # an empty slot
            if handle is not None:
                out.append(self._read_mig(device, slot, handle))
        return tuple(out)

    def _read_gpu(self, device: _Device) -> GpuReading:
        if device.handle is None and not self._attach(device):
            return GpuReading(index=device.index, error=pynvml.NVMLError_GpuIsLost.__name__)
        h = device.handle
        static = {
            "index": device.index,
            "uuid": device.uuid,
            "product": device.product,
            "architecture": device.architecture,
            "compute_major": device.cc[0] if device.cc else None,
            "compute_minor": device.cc[1] if device.cc else None,
            "mig_enabled": device.mig_enabled,
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
            migs = self._read_migs(device) if device.mig_enabled else ()
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
            mig_devices=migs,
            **static,
        )

    def read(self) -> NodeSnapshot:
        """Read every GPU (see the module docstring). Never raises for an NVML failure."""
        read_at = datetime.now(timezone.utc)
        now = self.clock()
        try:
            if self._devices is None:
                self._init()
            lost = sum(1 for d in self._devices or () if d.handle is None)
            gpus = tuple(self._read_gpu(d) for d in self._devices or ())
            if lost and lost > sum(1 for d in self._devices or () if d.handle is None):
                self._start_watcher()  # a GPU came back: watch its Xids too
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
