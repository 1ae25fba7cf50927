"""The gRPC servicer of one device-plugin resource: the kubelet's calls, answered from the
plugin's ``Inventory`` (devices and their health), the placement model's order of whole devices
(``allocation.preferred``) or the shared resource's book (``slicer.Slicer``), and the device list
strategies (``strategies.container_response``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from loguru import logger

from ..core.allocation.mps import ClientSpec
from ..core.model.sharing import unit_gpu
from ..core.publish.readings import ReadingCache, TickListener
from .allocation import DeviceState, plugin_options, preferred
from .inventory import Inventory
from .slicer import Booking, Slicer
from .slices import SliceRefused, expand
from .strategies import DEFAULT_STRATEGIES, container_response
from .v1beta1 import api_pb2, api_pb2_grpc

__all__ = ["CacheFeed", "DeviceService"]


@dataclass
class CacheFeed:
    """An ``AgentFeed`` over a bare cache (``cache.last``: the latest ``TickResult``) that
    someone else ticks: no PodResources list (slices are released by age alone),
    listeners appended to ``on_tick`` are never called. ``clock``: monotonic seconds."""

    cache: ReadingCache
    clock: Callable[[], float] = time.monotonic
    last_listed: tuple[frozenset[str], float] | None = None
    on_tick: list[TickListener] = field(default_factory=list)


class DeviceService(api_pb2_grpc.DevicePluginServicer):
    """The ``DevicePlugin`` gRPC service of one resource.

    - ``inventory``: the resource's devices and their health (``inventory.Inventory``).
    - ``slicer``: set (the inventory's book of slices, ``slicer.Slicer``), this serves the shared
      resource (units of shared GPUs).
    - ``strategies``: how ``Allocate`` hands a container its devices, NVIDIA's device list
      strategies (``strategies.container_response``; ``OMATICAYA_DEVICE_LIST_STRATEGY``).
    - ``poll_s``: how often ``ListAndWatch`` streams look at the inventory besides ``notify()``.

    Streams send the last list and end once ``stopping`` is set. ``refusals`` counts the
    ``Allocate`` and ``PreStartContainer`` calls refused (unknown or unhealthy devices, a slice
    across GPUs or without the live room). An ``Allocate`` refused for one of its containers
    books no slice for the others (``slicer.Slicer.take_back``).
    """

    def __init__(self, inventory: Inventory, *, slicer: Slicer | None = None,
                 strategies: Sequence[str] = DEFAULT_STRATEGIES, poll_s: float = 0.2) -> None:  # fmt: skip
        self.inventory = inventory
        self.slicer = slicer
        #: NVIDIA's device list strategies Allocate answers by (``strategies.py``)
        self.strategies: tuple[str, ...] = tuple(strategies)
        self.poll_s = poll_s
        self.stopping = threading.Event()
        self._changed = threading.Condition()
        self.refusals = 0

    def notify(self) -> None:
        """Wake every ``ListAndWatch`` stream now (call after each tick)."""
        with self._changed:
            self._changed.notify_all()

    # -- the gRPC service ------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        """The options this plugin serves (``allocation.plugin_options``)."""
        return plugin_options()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        """The device list, then a new one whenever a device's health changes; the last one
        (empty when every device left) once ``stopping`` is set."""
        sent: tuple[tuple[str, str], ...] | None = None
        while context.is_active():
            stopping = self.stopping.is_set()
            now = tuple((s.id, s.health) for s in self.inventory.devices())
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
        """Per container request, the devices to prefer out of the kubelet's available list:
        for the shared resource each container's units from one GPU (``slicer.Slicer``), else
        whole devices in the placement model's order (``allocation.preferred``; several GPUs by the
        latest reading's topology, ``Inventory.topology``)."""
        gpus = self.inventory.gpu_states() if self.slicer is not None else []
        states = {s.id: s for s in self.inventory.devices()} if self.slicer is None else {}
        responses = []
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            if self.slicer is not None:
                ids = self.slicer.preferred(gpus, available, must, req.allocation_size)
            else:
                ids = preferred(states, available, must, req.allocation_size,
                                self.inventory.topology())  # fmt: skip
                logger.info(
                    "device plugin: preferred {} of {} (must include {})", ids, available, must
                )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        """Each container's devices, by the device list strategies (plus, for a slice, its
        memory limit in the environment); refuses unknown or unhealthy devices and a slice the
        book refuses (``slicer.Slicer.allocate``). A refusal takes back the slices already
        booked for the earlier containers of the same request."""
        gpus = self.inventory.gpu_states() if self.slicer is not None else []
        devices = expand(gpus, self.slicer.counts) if self.slicer is not None else (
            self.inventory.devices())  # fmt: skip
        states = {s.id: s for s in devices}
        booking = Booking()
        try:
            responses = [self._allocate(req, states, gpus, booking, context)
                         for req in request.container_requests]  # fmt: skip
        except BaseException:  # context.abort raises: nothing of this request stays booked
            if self.slicer is not None:
                self.slicer.take_back(booking)
            raise
        return api_pb2.AllocateResponse(container_responses=responses)

    def _allocate(self, req: Any, states: dict[str, DeviceState], gpus: list[DeviceState],
                  booking: Booking, context: Any) -> Any:  # fmt: skip
        """One container's answer (see ``Allocate``); aborts ``context`` on a refusal."""
        ids = list(dict.fromkeys(req.devicesIDs))  # the kubelet's list, untrusted: once each
        self._refuse(ids, states, context, "allocate")
        visible, spec = ids, ClientSpec({}, ())
        if self.slicer is not None and ids:  # (no device: an empty answer, as for GPUs)
            try:
                gpu, spec = self.slicer.allocate(ids, gpus, booking)
            except SliceRefused as exc:
                self.refusals += 1
                logger.warning("device plugin: refused a slice: {}", exc.message)
                context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            visible = [gpu]
            logger.info("device plugin: allocate {} units on {} ({}{})", len(ids), gpu,
                        dict(spec.envs), ", an MPS client" if spec.mounts else "")  # fmt: skip
        else:
            logger.info("device plugin: allocate {}", ids)
        try:
            return container_response(visible, spec.envs, self.strategies, spec.mounts)
        except ValueError as exc:  # a device ID no strategy can name (from the driver)
            self.refusals += 1
            logger.warning("device plugin: refused to allocate: {}", exc)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc)[:256])
            raise  # (abort raises; for a context that does not)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        """Refuses a device that turned unhealthy (or left) since its allocation."""
        ids = list(request.devicesIDs)
        states = {s.id: s for s in self.inventory.devices()}
        self._refuse(ids, states, context, "start a container on")
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
