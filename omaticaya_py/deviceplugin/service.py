"""The gRPC servicer of one device-plugin resource: its devices from the agent's cache, and the kubelet's calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from loguru import logger

from ..core.health import Unit
from ..core.readings import AgentFeed, ReadingCache, TickListener, Topology
from ..core.sayonce import SayOnce
from ..core.sharing import SharedGpus, unit_count, unit_gpu
from .allocation import STALE_READING, DeviceState, departed, preferred
from .slicer import DEFAULT_SETTLE_S, Slicer, SliceRefused
from .slices import expand
from .strategies import DEFAULT_STRATEGIES, container_response
from .v1beta1 import api_pb2, api_pb2_grpc

#: no GPU shared (the default of ``shared``)
NOT_SHARED = SharedGpus()


def plugin_options() -> Any:
    """The ``DevicePluginOptions`` this plugin serves and registers: PreStartContainer and
    GetPreferredAllocation both wanted."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=True, get_preferred_allocation_available=True
    )


@dataclass
class CacheFeed:
    """An ``AgentFeed`` over a bare cache (``cache.last``: the latest ``TickResult``) that
    someone else ticks: no PodResources list (slices are released by age alone), no topology,
    listeners appended to ``on_tick`` are never called. ``clock``: monotonic seconds."""

    cache: ReadingCache
    clock: Callable[[], float] = time.monotonic
    last_listed: tuple[frozenset[str], float] | None = None
    on_tick: list[TickListener] = field(default_factory=list)
    topology: Topology | None = None


class DeviceService(api_pb2_grpc.DevicePluginServicer):
    """The ``DevicePlugin`` service of one resource, answered from the agent's cache.

    - ``source``: what it reads from the agent (``core.readings.AgentFeed``: an ``Agent``; its
      ``cache.last`` is served, its ``topology`` breaks ties on real NVML, its ``last_listed``
      releases slices), or ``CacheFeed`` over a bare cache ticked by someone else.
    - ``devices``: ``(index, uuid)`` known before the first reading (a trace's GPUs), so a GPU
      that is gone or unreadable stays listed, as Unhealthy.
    - ``profile``: ``None`` serves whole GPUs (MIG off); a MIG profile (``1g.10gb``) serves the
      MIG devices of that profile.
    - ``poll_s``: how often ``ListAndWatch`` streams look at the cache besides ``notify()``.
    - ``stale_after_s``: every device is Unhealthy (reason ``stale-reading``) while the reading
      it serves is older than this (a tick that never returns: a blocked NVML call), and
      Healthy again as soon as a fresh one comes; ``None``: off. The age is on the plugin's own
      ``clock`` (monotonic seconds), from when it first saw that reading, so the agent's wall
      clock plays no part.
    - ``strategies``: how ``Allocate`` hands a container its devices, NVIDIA's device list
      strategies (``strategies.container_response``; ``OMATICAYA_DEVICE_LIST_STRATEGY``).
    - ``shared``: the GPUs served as memory units (``OMATICAYA_SHARED_GPUS``; MIG-enabled ones
      never are): the whole-GPU resource (``profile`` and ``unit_mib`` None) leaves them out.
    - ``unit_mib``: set, this serves the shared resource: each shared GPU as one unit device
      per ``unit_mib`` MiB of its total memory (``devices`` then are unit IDs), with the health
      of its GPU; ``policy`` and ``settle_s`` as in ``slicer.Slicer``.

    Devices that left the reading (``allocation.departed``: a re-created MIG layout, a GPU now
    in MIG mode) leave the list. Streams send the last list and end once ``_stopping`` is set.
    ``refusals`` counts the ``Allocate`` and ``PreStartContainer`` calls refused (unknown or
    unhealthy devices); ``stale`` is whether the last look found the reading stale.
    """

    def __init__(
        self,
        source: AgentFeed,
        *,
        devices: Iterable[tuple[int, str]] = (),
        profile: str | None = None,
        poll_s: float = 0.2,
        stale_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        strategies: Sequence[str] = DEFAULT_STRATEGIES,
        shared: SharedGpus = NOT_SHARED,
        unit_mib: int | None = None,
        policy: str = "binpack",
        settle_s: float = DEFAULT_SETTLE_S,
    ) -> None:
        self._source = source
        # on real NVML the agent's reader knows the PCIe/NVLink topology between two GPUs
        self._topology = source.topology
        self._cache = source.cache
        self.poll_s = poll_s
        self.profile = profile
        self.shared = shared
        self.slicer = (
            Slicer(unit_mib, policy=policy, settle_s=settle_s, clock=clock,
                   held=self._held_units, stamp=self._agent_now)
            if unit_mib else None
        )  # fmt: skip
        devices = list(devices)
        if self.slicer is not None:  # unit IDs known in advance: their GPUs, and unit counts
            self.slicer.learn(d for _, d in devices)
            devices = list(dict.fromkeys((i, unit_gpu(d) or d) for i, d in devices))
        self._known: dict[str, int] = {uuid: index for index, uuid in devices}
        self._parents: dict[str, str] = {}  # MIG device UUID -> its parent GPU's UUID
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._seen: object | None = None  # the snapshot last seen, and when (``clock``)
        self._seen_at_s = 0.0
        self.stale = False
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._logged: SayOnce[str, bool] = SayOnce()  # devices said unhealthy
        self.refusals = 0  # Allocate / PreStartContainer calls refused (unknown or unhealthy)
        #: NVIDIA's device list strategies Allocate answers by (``strategies.py``)
        self.strategies: tuple[str, ...] = tuple(strategies)

    # -- the devices, from the agent's cache ----------------------------------------------

    def _held_units(self) -> tuple[frozenset[str], float] | None:
        """The device IDs the kubelet's last PodResources list names as assigned, and when it
        was asked for on the agent's clock (the agent's ``last_listed``); ``None``: the agent
        lists none (no socket, or it failed)."""
        return self._source.last_listed

    def _agent_now(self) -> float:
        """The agent's clock now (``AgentFeed.clock``), which ``_held_units``' times are on."""
        return float(self._source.clock())

    def devices(self) -> list[DeviceState]:
        """Every known device with its health from the latest reading, in index order: GPUs,
        MIG devices, or (the shared resource) each shared GPU's units."""
        gpus = self.gpu_states()
        if self.slicer is None:
            return gpus
        return expand(gpus, self.slicer.counts)

    def _mine(self, unit: Unit) -> bool:
        """Whether ``unit`` (from the health assessment) is one of this resource's."""
        if unit.profile != self.profile or unit.is_mig != (self.profile is not None):
            return False
        return unit.is_mig or (unit.gpu_index in self.shared) == (self.slicer is not None)

    def gpu_states(self) -> list[DeviceState]:
        """Every known GPU (or MIG device) of this resource with its health from the latest
        reading, in index order; for the shared resource, the shared GPUs (not yet as units)."""
        last = self._cache.last
        with self._lock:
            if last is None:
                states = [
                    DeviceState(uuid, index, False, ("no-reading",))
                    for uuid, index in self._known.items()
                ]
                return sorted(states, key=lambda s: (s.index, s.id))
            snapshot, health = last.snapshot, last.health
            stale = self._stale(snapshot)
            by_index = {index: uuid for uuid, index in self._known.items()}
            gpu_uuid = {g.index: g.uuid for g in snapshot.gpus if g.uuid}
            units: dict[str, Unit] = {}
            for unit in health.units:
                if not self._mine(unit):
                    continue  # another plugin's resource
                uuid = unit.uuid or (None if unit.is_mig else by_index.get(unit.gpu_index))
                if uuid is None:
                    continue  # never read its UUID: nothing to advertise
                if self.slicer is not None:
                    self.slicer.note_units(uuid, unit_count(unit.memory_total_mib, self.slicer.unit_mib))
                self._known[uuid] = unit.gpu_index
                if unit.is_mig and unit.gpu_index in gpu_uuid:
                    self._parents[uuid] = gpu_uuid[unit.gpu_index]
                units[uuid] = unit
            for uuid in departed(
                self._known, self._parents, units, snapshot, self.profile is not None
            ):
                logger.info("device plugin: {} left the reading: no longer advertised", uuid)
                del self._known[uuid]
                self._parents.pop(uuid, None)
                self._logged.end(uuid)
            states = []
            for uuid, index in self._known.items():
                read = units.get(uuid)
                if stale:
                    states.append(DeviceState(uuid, index, False, (STALE_READING,)))
                elif snapshot.error is not None:
                    states.append(DeviceState(uuid, index, False, (snapshot.error,)))
                elif read is None:
                    states.append(DeviceState(uuid, index, False, ("absent",)))
                else:
                    states.append(
                        DeviceState(
                            uuid,
                            read.gpu_index,
                            read.healthy,
                            read.reasons,
                            read.memory_free_mib,
                            read.mig_index,
                        )
                    )
        states.sort(key=lambda s: (s.index, s.mig_index or 0, s.id))
        self._log_changes(states)
        return states

    def _stale(self, snapshot: object) -> bool:
        """Whether ``snapshot`` (the reading served) is older than ``stale_after_s`` on our
        clock, counted from when this plugin first saw it; logs each change once. Called under
        ``_lock``."""
        now_s = self._clock()
        if snapshot is not self._seen:
            self._seen, self._seen_at_s = snapshot, now_s
        age_s = now_s - self._seen_at_s
        stale = self.stale_after_s is not None and age_s > self.stale_after_s
        if stale and not self.stale:
            logger.warning(
                "device plugin: the agent's reading is {:.1f}s old (more than {:.3g}s): every "
                "{} device Unhealthy until a fresh one", age_s, self.stale_after_s,
                self.profile or "GPU",
            )
        elif self.stale and not stale:
            logger.info("device plugin: a fresh reading again: devices follow their health")
        self.stale = stale
        return stale

    def _log_changes(self, states: list[DeviceState]) -> None:
        with self._lock:
            for s in states:
                if s.healthy:
                    if self._logged.end(s.id) is not None:
                        logger.info("device plugin: GPU {} {} healthy again", s.index, s.id)
                elif self._logged.start(s.id, True):
                    logger.warning(
                        "device plugin: GPU {} {} unhealthy ({})", s.index, s.id, ",".join(s.reasons)
                    )

    def notify(self) -> None:
        """Wake every ``ListAndWatch`` stream now (call after each tick)."""
        with self._changed:
            self._changed.notify_all()

    # -- the gRPC service ------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return plugin_options()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        sent: tuple[tuple[str, str], ...] | None = None
        while context.is_active():
            stopping = self._stopping.is_set()
            states = self.devices()
            now = tuple((s.id, s.health) for s in states)
            if now != sent:
                logger.debug(
                    "device plugin: ListAndWatch sends {} devices, {} unhealthy",
                    len(now), sum(1 for _, h in now if h != "Healthy"),
                )
                yield api_pb2.ListAndWatchResponse(
                    devices=[api_pb2.Device(ID=d, health=h) for d, h in now]
                )
                sent = now
            if stopping:  # the last list went out (an empty one when every device left)
                return
            with self._changed:
                self._changed.wait(self.poll_s)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        # the shared resource: each container's units from one GPU (``slicer.Slicer``)
        gpus = self.gpu_states() if self.slicer is not None else []
        states = {s.id: s for s in self.devices()} if self.slicer is None else {}
        responses = []
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            if self.slicer is not None:
                ids = self.slicer.preferred(gpus, available, must, req.allocation_size)
            else:
                ids = preferred(states, available, must, req.allocation_size, self._topology)
                logger.info(
                    "device plugin: preferred {} of {} (must include {})", ids, available, must
                )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        gpus = self.gpu_states() if self.slicer is not None else []
        devices = expand(gpus, self.slicer.counts) if self.slicer is not None else self.devices()
        states = {s.id: s for s in devices}
        responses = []
        for req in request.container_requests:
            ids = list(dict.fromkeys(req.devicesIDs))  # the kubelet's list, untrusted: once each
            self._refuse(ids, states, context, "allocate")
            visible, envs = ids, dict[str, str]()
            if self.slicer is not None and ids:  # (no device: an empty answer, as for GPUs)
                try:
                    gpu, envs = self.slicer.allocate(ids, gpus)
                except SliceRefused as exc:
                    self.refusals += 1
                    logger.warning("device plugin: refused a slice: {}", exc.message)
                    context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
                visible = [gpu]
                logger.info("device plugin: allocate {} units on {} ({})", len(ids), gpu, envs)
            else:
                logger.info("device plugin: allocate {}", ids)
            try:
                responses.append(container_response(visible, envs, self.strategies))
            except ValueError as exc:  # a device ID no strategy can name (from the driver)
                self.refusals += 1
                logger.warning("device plugin: refused to allocate: {}", exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc)[:256])
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        ids = list(request.devicesIDs)
        self._refuse(ids, {s.id: s for s in self.devices()}, context, "start a container on")
        return api_pb2.PreStartContainerResponse()

    def _refuse(
        self, ids: list[str], states: dict[str, DeviceState], context: Any, what: str
    ) -> None:
        unknown = [d for d in ids if d not in states]
        if unknown:
            # name a few: a request of 10,000 made-up IDs gets a short answer and a short log
            shown = ", ".join(d[:64] for d in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            self.refusals += 1
            logger.warning("device plugin: refused to {} unknown devices {}{}", what, shown, more)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices: {shown}{more}")
        bad = [states[d] for d in ids if not states[d].healthy]
        if bad:
            # a slice's units name their GPU once: "GPU 2 GPU-...: remap-pending"
            detail = "; ".join(dict.fromkeys(
                f"GPU {s.index} {unit_gpu(s.id) or s.id}: {','.join(s.reasons)}" for s in bad
            ))
            self.refusals += 1
            logger.warning("device plugin: refused to {} unhealthy GPUs: {}", what, detail)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"unhealthy: {detail}")
