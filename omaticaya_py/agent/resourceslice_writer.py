"""The Node's ResourceSlice (the DRA driver ``gpu.omaticaya.io``), kept in step with the
readings change-only, under the labels' write budget.

Each tick's devices come from ``core.publish.dra.inventory`` (the reading, the health rules, the
damped free memory) and ``core.publish.slice_device.slice_devices`` (typed devices, each
rendering its own JSON). A write goes out when they differ from what was published: at once when
the change is for the worse (``core.publish.slice_budget``: free memory down, a taint added, a
device gone); a change for the better of a device once that device has not got worse for
``OMATICAYA_MIN_PATCH_INTERVAL_S`` (its own calm window: a neighbour's churn does not hold a
recovered GPU's taint) and the last write is an interval old or a write goes anyway
(``core.publish.publisher.Publisher``, the labels' rule), held back until then. The budget
and the hysteresis work from the typed devices last published, never from their JSON.
The slice as stored is read back at each heartbeat: deleted, or edited behind our back (it is
no longer what was last applied), it is put right at once, in full.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from loguru import logger

from ..core.config.settings import Settings
from ..core.model.sharing import Sharing
from ..core.model.snapshot import NodeSnapshot
from ..core.publish.budget import Calm
from ..core.publish.dra import DraDevice, inventory, slice_body, strip_server_fields
from ..core.publish.publisher import Publisher
from ..core.publish.slice_budget import Part, device_changes, within_budget
from ..core.publish.slice_device import SliceDevice, TaintRule, slice_devices
from ..core.rules.health import NodeHealth
from ..kube import KubeError
from ..kube.quantity import parse_quantity
from ..kube.resourceslice import ResourceSliceClient

__all__ = ["ResourceSliceWriter"]

#: the health reason of every device while NVML cannot be read at all
READING_FAILED = "nvml-unreadable"


def _rfc3339(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ResourceSliceWriter:
    """Publishes the Node's ResourceSlice through ``client`` (``None``: dry run, nothing sent).

    - ``settings``: the memory step and hysteresis (``inventory``), the sharing, the taint
      effect (``OMATICAYA_DRA_TAINT_EFFECT``) and the write budget
      (``min_patch_interval_s``).
    - ``mps``: shared GPU UUIDs -> ``"up"`` or why their MPS daemon is not
      (``agent.events.mps_enforcement``); ``None`` when nothing enforces slices.
    - ``wall``: the wall clock (taints' ``timeAdded``).

    Counters for ``/metrics``, on ``cache`` (``agent.state.SnapshotCache``): ``slice_writes``
    (applies sent), ``slice_held`` (ticks whose changes for the better waited),
    ``slice_errors`` (failed requests). ``published_devices``: the devices as last applied
    (``None``: nothing yet, or to be read back); ``published``: the same as JSON."""

    def __init__(self, settings: Settings, client: ResourceSliceClient | None, cache: Any, *,
                 mps: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.settings = settings
        self.client = client
        self.cache = cache
        self.mps = mps
        self.wall = wall
        self.published_devices: list[SliceDevice] | None = None
        #: the write budget: the calm clock of each part of each device (``(name, "free" or
        #: "taints")``) and the last write
        self.publisher: Publisher[Part] = Publisher(settings.min_patch_interval_s)
        self.last_desired: list[SliceDevice] | None = None
        #: the devices last applied (kept across ``forget``: the read-back is checked against it)
        self._applied: list[SliceDevice] | None = None
        self._devices: list[DraDevice] = []
        self._taint_times: dict[tuple[str, str], str] = {}
        self._node_uid: str | None = None

    @property
    def published(self) -> list[dict[str, Any]] | None:
        """``published_devices`` as the slice's ``spec.devices`` JSON."""
        return None if self.published_devices is None else _render(self.published_devices)

    @property
    def last_write_s(self) -> float | None:
        """When the slice was last written (the agent's monotonic seconds)."""
        return self.publisher.last_write_s

    @property
    def calm(self) -> Mapping[Part, Calm]:
        """Each part's calm clock (``core.publish.budget.Calm``)."""
        return self.publisher.calm

    def forget(self) -> None:
        """Read the slice back before the next write (a heartbeat: deleted or edited behind
        our back)."""
        self.published_devices = None

    def desired(self, snapshot: NodeSnapshot, health: NodeHealth) -> list[SliceDevice]:
        """The devices this reading calls for (before the budget). While NVML cannot be read
        at all, the devices last seen, each tainted ``nvml-unreadable`` with ``NoSchedule``
        whatever ``OMATICAYA_DRA_TAINT_EFFECT`` says (the GPUs are not known to be bad)."""
        s = self.settings
        previous = {
            d.name: d.free_memory_mib
            for d in self.published_devices or []
            if d.free_memory_mib is not None
        }
        if snapshot.error is not None:
            devices = [replace(d, reasons=(READING_FAILED,), free_memory_mib=None)
                       for d in self._devices]  # fmt: skip
        else:
            devices = inventory(snapshot, health, Sharing.of(s), s.memory_step_mib,
                                s.hysteresis_pct, previous)  # fmt: skip
            self._devices = devices
        shared = [d.gpu_uuid for d in devices if d.shared and d.gpu_uuid]
        states = self.mps(shared) if self.mps is not None and shared else {}
        # NVML unreadable says nothing of the GPUs (a driver reload, an upgrade): no new claim
        # gets them, but NoExecute would evict every pod of the node
        rule = TaintRule(
            effect="NoSchedule" if snapshot.error is not None else s.dra_taint_effect,
            mps_down={u: why for u, why in states.items() if why != "up"},
            times=self._taint_times, now=_rfc3339(self.wall()),
        )  # fmt: skip
        out = slice_devices(devices, snapshot, rule)
        # the first time each taint is published stays its timeAdded; gone taints are forgotten
        self._taint_times = {(d.name, t.key): t.time_added or "" for d in out for t in d.taints}
        return out

    def write(self, snapshot: NodeSnapshot, health: NodeHealth, node_uid: str | None,
              now_s: float) -> bool:  # fmt: skip
        """Bring the slice to this reading within the write budget; returns whether a write
        was sent. Raises ``KubeError`` (counted; the next tick reads the slice back and tries
        again)."""
        if node_uid:
            self._node_uid = node_uid
        desired = self.desired(snapshot, health)
        self.note(desired, now_s)
        self.last_desired = desired
        try:
            before, stored = self._before()
            target = desired
            if before is not None:
                target = self.within_budget(before, desired, now_s)
                if target != desired:
                    self.cache.slice_held += 1
                if before == target:
                    return False
            elif stored is not None and _same(stored, _render(target)):
                self.published_devices = target  # as the API server keeps it already
                return False
            if self.client is not None:
                body = slice_body(self.settings.node_name or "", self._node_uid, _render(target))
                self.client.apply(body)
            self.published_devices = self._applied = target
            self.publisher = self.publisher.wrote(now_s)
            self.cache.slice_writes += 1
            return True
        except KubeError:
            self.cache.slice_errors += 1
            self.published_devices = None  # read it back next time
            raise

    def _before(self) -> tuple[list[SliceDevice] | None, list[dict[str, Any]] | None]:
        """``(the devices published, None)`` when known (kept, or read back and still what was
        last applied); else ``(None, the slice's devices as stored)`` (``None``: no slice, or
        no API): the write is change-only against the stored slice, with nothing held.
        Raises ``KubeError``."""
        if self.published_devices is not None or self.client is None:
            return self.published_devices, None
        stored = self.client.get()
        if not stored:
            return None, None
        devices = strip_server_fields(stored.get("spec", {}).get("devices"))
        if self._applied is not None and _same(devices, _render(self._applied)):
            self.published_devices = self._applied
            return self._applied, None
        return None, devices

    def note(self, desired: list[SliceDevice], now_s: float) -> None:
        """Move the calm clocks by this tick's devices (``desired``) against the last tick's:
        each part of each device that got worse or better
        (``core.publish.slice_budget.device_changes``)."""
        if self.last_desired is not None:
            self.publisher = self.publisher.noted(device_changes(self.last_desired, desired), now_s)

    def within_budget(
        self, before: list[SliceDevice], desired: list[SliceDevice], now_s: float
    ) -> list[SliceDevice]:
        """The devices to write now: ``desired`` with the changes for the better the budget
        holds kept as published (``before``; ``core.publish.slice_budget.within_budget``)."""
        return within_budget(before, desired, self.publisher, now_s)

    def delete(self) -> None:
        """Delete the slice (the agent's exit); a failure is logged, never raised."""
        if self.client is None:
            return
        try:
            if self.client.delete():
                logger.info("deleted ResourceSlice {}", self.client.name)
        except KubeError as exc:
            logger.error("could not delete ResourceSlice {}: {}", self.client.name, exc)
        self.published_devices = None


def _render(devices: list[SliceDevice]) -> list[dict[str, Any]]:
    return [d.render() for d in devices]


def _canon(devices: list[dict[str, Any]]) -> list[Any]:
    """Devices compared as the API server keeps them: quantities as numbers (it writes
    ``80896Mi`` back as ``79Gi``), everything else as is."""
    def quantity(v: Any) -> Any:
        try:
            return parse_quantity(v) if isinstance(v, str) else v
        except ValueError:
            return v

    def walk(v: Any, key: str = "") -> Any:
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return quantity(v) if key in _QUANTITY_KEYS else v

    return [walk(d) for d in devices]


#: the keys whose values are quantities in a Device's capacity
_QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step"})


def _same(stored: list[dict[str, Any]], ours: list[dict[str, Any]]) -> bool:
    """Whether the slice as stored already is ``ours``."""
    return stored == ours or _canon(stored) == _canon(ours)
