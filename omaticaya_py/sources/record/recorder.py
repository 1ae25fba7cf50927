"""``Recorder``: one NVML session sampled into a trace document, sample by sample.

The document is the project's trace format, version 2, or 3 once a GPU's place on the node
was recorded (``docs/trace-format.md``): the static facts of every GPU (and of every MIG device),
read at the first ``nvmlInit``, with each GPU's topology (``topology.py``: PCIe common ancestors,
NUMA node, CPU affinity, PCIe root from sysfs, NVLinks, P2P, NVLink fabric; recorded once, at
the first sample where the GPU and its peers have handles), then one sample per call with what
NVML answered. A GPU NVML cannot describe then (lost: no handle) is its error in
``devices`` and in each sample, the others are read; its facts are read once it answers. Critical
Xid and double-bit ECC events (of the types each GPU supports) delivered since the last sample
go into that sample's ``xid_events``. GPM (``gpm.py``): each whole GPU's ``gpm`` object, the
metrics between the previous sample and this one. When the library itself fails (init, the driver gone) the
sample is that error and the next sample starts a new session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml

from ..nvml import LIBRARY_GONE, decode, handle_address
from .gpm import GpmRecorder
from .gpu import gpu_facts, gpu_sample
from .topology import topology_facts
from .values import error, value

__all__ = ["Recorder"]

_XID_TYPES = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
#: NVIDIA's Xid for a double-bit ECC error (such an event carries no Xid of its own)
_XID_DOUBLE_BIT_ECC = 48


class Recorder:
    """Samples every GPU through NVML into a trace document (``doc``).

    ``sample(t)`` appends one sample at trace time ``t`` (seconds from the start); it never
    raises for an NVML failure (the failure is the sample, or that GPU's reading). ``close()``
    frees the event set and shuts NVML down. ``readings``: samples that read the GPUs (not a
    library error). ``sysfs_root``: where sysfs is mounted, for each GPU's ``pcie_root``.
    """

    def __init__(self, interval_s: float, sysfs_root: Path = Path("/sys")) -> None:
        self.interval_s = interval_s
        self.sysfs_root = sysfs_root
        self.doc: dict[str, Any] = {
            "format_version": 2,
            "source": "recorded with omaticaya record (nvidia-ml-py) on a real GPU machine",
            "interval_s": interval_s,
            "samples": [],
        }
        self._live = False  # nvmlInit succeeded and nvmlShutdown is owed
        self._handles: list[Any] = []  # per GPU index; None until NVML gives it (lost at start)
        self._registered: set[int] = set()  # GPUs registered for events this session
        self._events: Any = None
        self._gpm = GpmRecorder()
        self._placed: set[int] = set()  # GPUs whose topology is recorded
        self.readings = 0  # samples that read the GPUs (not a library error)

    # -- NVML session ---------------------------------------------------------------------

    def _start(self) -> None:
        """``nvmlInit``, the system facts (first session) and the event set; GPU handles come
        in ``_handle``. Raises NVML's error (``sample`` then shuts the session down)."""
        pynvml.nvmlInit()
        self._live = True
        count = pynvml.nvmlDeviceGetCount()
        if "devices" not in self.doc:
            doc = self.doc
            doc["driver_version"] = decode(value(pynvml.nvmlSystemGetDriverVersion))
            doc["nvml_version"] = decode(value(pynvml.nvmlSystemGetNVMLVersion))
            doc["cuda_driver_version"] = value(pynvml.nvmlSystemGetCudaDriverVersion_v2)
            doc["device_count"] = count
            doc["devices"] = [{"index": index} for index in range(count)]
        try:
            self._events = pynvml.nvmlEventSetCreate()
        except LIBRARY_GONE:
            raise
        except pynvml.NVMLError:
            self._events = None  # no Xid events this session; the readings go on
        self._handles = [None] * count

    def _handle(self, index: int) -> Any:
        """GPU ``index``'s handle, got once per session: then its static facts go into
        ``devices`` (until they could be read) and its Xid events are registered (until that
        worked: a GPU lost at first registers when it is back). Raises NVML's error (of
        ``nvmlDeviceGetHandleByIndex``, GpuIsLost while the GPU is off the bus, or of a required
        fact): the GPU's error in this sample, tried again at the next."""
        h = self._handles[index]
        if h is None:
            h = self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        devices = self.doc["devices"]
        if index < len(devices) and "uuid" not in devices[index]:
            devices[index] = gpu_facts(index, h)
        if index not in self._registered and self._register(h):
            self._registered.add(index)
        return h

    def _register(self, h: Any) -> bool:
        """Register ``h`` for the Xid and double-bit ECC events it supports (NVML registers
        nothing when asked for one it does not: a GPU without ECC still reports Xids). False
        when NVML failed (lost, ...: try again)."""
        if self._events is None:
            return True  # no event set this session: nothing to register
        try:
            types = _XID_TYPES & pynvml.nvmlDeviceGetSupportedEventTypes(h)
            if types:
                pynvml.nvmlDeviceRegisterEvents(h, types, self._events)
        except LIBRARY_GONE:
            raise
        except pynvml.NVMLError_NotSupported:
            return True  # this GPU delivers no events: nothing to record
        except pynvml.NVMLError:
            return False
        return True

    def _stop(self) -> None:
        self._gpm.stop()  # GPM buffers before nvmlShutdown
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except pynvml.NVMLError:
                pass
            self._events = None
        self._handles = []
        self._registered = set()
        if self._live:
            self._live = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        self._stop()

    # -- one sample -----------------------------------------------------------------------

    def _gpu(self, index: int) -> dict[str, Any]:
        """GPU ``index`` in this sample; a GPU without a handle is its error (also in
        ``devices`` while its facts are unknown). Raises ``LIBRARY_GONE``."""
        try:
            h = self._handle(index)
        except LIBRARY_GONE:
            raise
        except pynvml.NVMLError as exc:
            devices = self.doc["devices"]
            if index < len(devices) and "uuid" not in devices[index]:
                devices[index] = {"index": index, **error(exc)}
            return {"index": index, **error(exc)}
        reading = gpu_sample(index, h)
        if "nvml_error" in reading:
            self._gpm.forget(index)
        elif "mig_devices" not in reading:
            try:
                gpm = self._gpm.read(index, h)
            except LIBRARY_GONE:
                raise
            except pynvml.NVMLError as exc:  # lost between the calls
                return {"index": index, **error(exc)}
            if gpm is not None:
                reading["gpm"] = gpm
        return reading

    def _topology(self) -> None:
        """Record the version 3 keys of every GPU that has a handle and facts and has none yet,
        against the peers that have handles now; the document becomes version 3 with the first
        GPU that has any. A GPU lost meanwhile is tried again at the next sample. Raises
        ``LIBRARY_GONE``."""
        peers = {i: h for i, h in enumerate(self._handles) if h is not None}
        devices = self.doc["devices"]
        for index, h in peers.items():
            if index in self._placed or index >= len(devices) or "uuid" not in devices[index]:
                continue
            try:
                facts = topology_facts(
                    index, h, peers, devices[index].get("pci_bus_id"), self.sysfs_root
                )
            except LIBRARY_GONE:
                raise
            except pynvml.NVMLError:
                continue  # lost on the way: the next sample tries again
            devices[index].update(facts)
            self._placed.add(index)
            if facts:
                self.doc["format_version"] = 3

    def _xid_index(self, device: Any, index_of: dict[str, int]) -> int:
        """The index of the GPU an event came from: by UUID, else (a GPU that fell off the
        bus, Xid 79, has no UUID) by its handle; -1 when neither is known."""
        try:
            return index_of.get(decode(pynvml.nvmlDeviceGetUUID(device)), -1)
        except pynvml.NVMLError:
            address = handle_address(device)
            for i, h in enumerate(self._handles):
                if h is not None and handle_address(h) == address:
                    return i
            return -1

    def _xids(self) -> list[dict[str, int]]:
        """The events waiting in the event set: ``[{"index", "xid"}]`` (index -1: a GPU not
        known)."""
        if self._events is None:
            return []
        index_of = {}
        for i, h in enumerate(self._handles):
            try:
                if h is not None:
                    index_of[decode(pynvml.nvmlDeviceGetUUID(h))] = i
            except pynvml.NVMLError:
                continue
        out: list[dict[str, Any]] = []
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError:  # Timeout: nothing more in this interval
                return out
            xid = (
                int(data.eventData)
                if data.eventType == pynvml.nvmlEventTypeXidCriticalError
                else _XID_DOUBLE_BIT_ECC
            )
            out.append({"index": self._xid_index(data.device, index_of), "xid": xid})

    def sample(self, t: float) -> dict[str, Any]:
        """Read every GPU once and append the sample (see the class docstring)."""
        sample: dict[str, Any]
        try:
            if not self._live:
                self._start()
            sample = {"t": round(t, 3), "gpus": [self._gpu(i) for i in range(len(self._handles))]}
            self._topology()
            xids = self._xids()
            if xids:
                sample["xid_events"] = xids
            self.readings += 1
        except pynvml.NVMLError as exc:  # the library itself: init failed or the driver went
            self._stop()
            sample = {"t": round(t, 3), **error(exc)}
        self.doc["samples"].append(sample)
        return sample
