"""``NvmlReader``: every GPU of this node read through NVML into a ``NodeSnapshot``.

``NvmlReader.read()`` never raises for an NVML failure:
- the library cannot start or the driver is gone -> ``NodeSnapshot.error`` (health Unknown);
  the next read tries ``nvmlInit`` again, so the agent recovers without a restart;
- one GPU cannot be read (GpuIsLost, Unknown, ...) -> that GPU's ``GpuReading.error``;
- one field is NotSupported (ECC on a GPU without ECC, utilisation with MIG on, ...) -> ``None``
  (absent).
Every error other than NotSupported is counted in ``errors`` by ``(call, error name)``.

Static facts (``device``) are read once per ``nvmlInit``, and again for a GPU whose MIG mode
changed (asked on every read, ``mig.follow_mode``: the change is in the first read after NVML
reports it); each read then costs one GPU read (``gpu``, with its MIG mode and MIG devices from
``mig`` and GPM from ``gpm``) per GPU. The GPUs' wiring (``topology``: PCIe, NVLink, NUMA) is
read once per ``nvmlInit``, after the handles (and again when a GPU lost at start comes back),
and carried by every ``NodeSnapshot`` of that session; a topology call that fails is counted and
that fact is absent, never a failed read. A re-init (or
``close()``) frees the GPM sample buffers and stops the Xid watcher (``events``) before ``nvmlShutdown``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pynvml
from loguru import logger

from ...core.model.snapshot import NodeSnapshot
from ...core.model.topology import NodeTopology
from .device import Device, attach
from .events import XidWatcher
from .gpm import free as free_gpm
from .gpu import read_gpu
from .library import Calls, decode, error_name
from .topology import read_topology

__all__ = ["NvmlReader"]


class NvmlReader:
    """``Reader`` over the real NVML library.

    ``watch_xid``: run a background thread on an NVML event set
    (``nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError``) with
    ``nvmlEventSetWait_v2(timeout)``; events are handed to the next ``read()``.
    ``clock`` gives ``NodeSnapshot.clock_s`` (monotonic seconds).
    ``sysfs_root``: where sysfs is mounted (``/sys``), for each GPU's PCIe root and, where NVML
    cannot say, its NUMA node (``topology.read_topology``).
    ``errors``: NVML errors by ``(call, error name)``; ``call_s``: seconds spent inside NVML
    calls (bench).
    """

    def __init__(
        self,
        *,
        watch_xid: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sysfs_root: Path = Path("/sys"),
    ) -> None:
        self.clock = clock
        self.watch_xid = watch_xid
        self.sysfs_root = sysfs_root
        self._calls = Calls()
        self.errors = self._calls.errors
        self._devices: list[Device] | None = None
        self._driver: str | None = None
        self._cuda: tuple[int, int] | None = None
        self._xid = XidWatcher(self.errors, lambda: self.clock())  # follows a later .clock
        self._wiring: NodeTopology | None = None  # read once per nvmlInit

    @property
    def call_s(self) -> float:
        """Seconds spent inside NVML calls so far (bench)."""
        return self._calls.call_s

    def calls_by_name(self) -> dict[str, tuple[int, float]]:
        """Per NVML call name (``nvmlDeviceGetSamples``, ...): how many calls so far and the
        seconds spent inside them (bench/tick.py --nvml: each call's share of the tick)."""
        return {name: (int(n), s) for name, (n, s) in self._calls.by_call.items()}

    @property
    def xid_events_dropped(self) -> int:
        """Xid events the watcher dropped beyond its bound (``XidWatcher.dropped``)."""
        return self._xid.dropped

    # -- lifecycle -----------------------------------------------------------------------

    def _init(self) -> None:
        calls = self._calls
        calls.call("nvmlInit", pynvml.nvmlInit)
        driver = calls.field("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        self._driver = decode(driver)
        cuda = calls.field(
            "nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2
        )
        self._cuda = (cuda // 1000, (cuda % 1000) // 10) if cuda else None
        count = calls.call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount) or 0
        devices = [Device(index, None, {}) for index in range(count)]
        for device in devices:
            attach(calls, device)
        self._devices = devices
        self._read_wiring()
        self._start_watcher()

    def _read_wiring(self) -> None:
        """Read the GPUs' topology (``topology.read_topology``) into ``_wiring``; never
        raises: an NVML error is counted per call by ``read_topology``, anything else is
        counted here as ``("topology", exception name)`` and the topology is unknown."""
        try:
            self._wiring = read_topology(self._calls, self._devices or (), self.sysfs_root)
        except Exception as exc:  # noqa: BLE001 - topology never fails the read
            self.errors[("topology", type(exc).__name__)] += 1
            logger.warning("NVML: the GPUs' topology could not be read: {}", exc)
            self._wiring = None

    def _start_watcher(self) -> None:
        """(Re)start the Xid watcher over the GPUs that have a handle."""
        watched = [d for d in self._devices or () if d.handle is not None]
        if not self.watch_xid or not watched:
            return
        self._xid.start(watched)

    def _shutdown(self) -> None:
        self._wiring = None  # read again after the next nvmlInit
        alive = self._xid.stop()
        if self._devices is not None:
            for device in self._devices:  # GPM sample buffers die with the session
                free_gpm(self._calls, device)
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

    # -- topology ------------------------------------------------------------------------

    @property
    def topology(self) -> NodeTopology | None:
        """The GPUs' wiring read at this session's ``nvmlInit`` (``NodeSnapshot.topology``);
        ``None`` before the first read and while NVML is down."""
        return self._wiring

    # -- reading -------------------------------------------------------------------------

    def read(self) -> NodeSnapshot:
        """Read every GPU (see the module docstring). Never raises for an NVML failure."""
        read_at = datetime.now(timezone.utc)
        now = self.clock()
        try:
            if self._devices is None:
                self._init()
            lost = sum(1 for d in self._devices or () if d.handle is None)
            gpus = tuple(read_gpu(self._calls, d) for d in self._devices or ())
            if lost and lost > sum(1 for d in self._devices or () if d.handle is None):
                self._read_wiring()  # a GPU came back: its place too
                self._start_watcher()  # and its Xids
        except pynvml.NVMLError as exc:
            self._shutdown()  # re-init on the next read: the driver may come back
            return NodeSnapshot(read_at=read_at, clock_s=now, error=error_name(exc), source="nvml")
        return NodeSnapshot(
            read_at=read_at,
            clock_s=now,
            gpus=gpus,
            driver_version=self._driver,
            cuda_driver_version=self._cuda,
            xid_events=self._xid.take(),
            source="nvml",
            topology=self._wiring,
        )
