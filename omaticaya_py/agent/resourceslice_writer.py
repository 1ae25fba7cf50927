"""The Node's ResourceSlice (the DRA driver ``gpu.omaticaya.io``), kept in step with the
readings change-only, under the labels' write budget.

Each tick's devices come from ``core.publish.dra.inventory`` (the reading, the health rules, the
damped free memory) and ``core.publish.dra.render_devices``. A write goes out when they differ from
what was published: at once when the change is for the worse (``core.publish.dra.worse_devices``: free
memory down, a taint added, a device gone); a change for the better of a device once that
device has not got worse for ``OMATICAYA_MIN_PATCH_INTERVAL_S`` (its own calm window: a
neighbour's churn does not hold a recovered GPU's taint) and the last write is an interval old
or a write goes anyway (``core.publish.budget.held_keys``, the labels' rule), held back until then
(``core.publish.dra.held_devices``).
The slice as stored is read back at each heartbeat (re-created when deleted behind our back).
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
from ..core.publish.budget import Calm, held_keys, note_changes
from ..core.publish.dra import (
    DraDevice,
    held_devices,
    inventory,
    render_devices,
    slice_body,
    strip_server_fields,
    worse_devices,
)
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
    ``slice_errors`` (failed requests). ``published``: the devices as last applied or read
    back (``None``: nothing yet, or to be read back)."""

    def __init__(self, settings: Settings, client: ResourceSliceClient | None, cache: Any, *,
                 mps: Callable[[Iterable[str]], Mapping[str, str]] | None = None,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.settings = settings
        self.client = client
        self.cache = cache
        self.mps = mps
        self.wall = wall
        self.published: list[dict[str, Any]] | None = None
        self.last_write_s: float | None = None
        #: the calm clock of each part of each device (``(name, "free" or "taints")`` ->
        #: ``core.publish.budget.Calm``: when it last got worse than the tick's before;
        #: ``core.publish.budget.note_changes``)
        self.calm: dict[tuple[Any, str], Calm] = {}
        self._last_desired: list[dict[str, Any]] | None = None
        self._devices: list[DraDevice] = []
        self._taint_times: dict[tuple[str, str], str] = {}
        self._node_uid: str | None = None

    def forget(self) -> None:
        """Read the slice back before the next write (a heartbeat: deleted or edited behind
        our back)."""
        self.published = None

    def desired(self, snapshot: NodeSnapshot, health: NodeHealth) -> list[dict[str, Any]]:
        """The devices this reading calls for (before the budget). While NVML cannot be read
        at all, the devices last seen, each tainted ``nvml-unreadable`` with ``NoSchedule``
        whatever ``OMATICAYA_DRA_TAINT_EFFECT`` says (the GPUs are not known to be bad)."""
        s = self.settings
        previous = {
            str(d.get("name")): free
            for d in self.published or []
            if isinstance(free := (d.get("attributes") or {}).get("freeMemoryMiB", {}).get("int"), int)
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
        mps_down = {u: why for u, why in states.items() if why != "up"}
        now = _rfc3339(self.wall())
        # NVML unreadable says nothing of the GPUs (a driver reload, an upgrade): no new claim
        # gets them, but NoExecute would evict every pod of the node
        effect = "NoSchedule" if snapshot.error is not None else s.dra_taint_effect
        rendered = render_devices(devices, snapshot, taint_effect=effect,
                                  mps_down=mps_down, taint_times=self._taint_times)  # fmt: skip
        # the first time each taint is published stays its timeAdded; gone taints are forgotten
        live: dict[tuple[str, str], str] = {}
        for dev in rendered:
            for t in dev.get("taints", []):
                key = (dev["name"], t["key"])
                live[key] = t.setdefault("timeAdded", self._taint_times.get(key, now))
        self._taint_times = live
        return rendered

    def write(self, snapshot: NodeSnapshot, health: NodeHealth, node_uid: str | None,
              now_s: float) -> bool:  # fmt: skip
        """Bring the slice to this reading within the write budget; returns whether a write
        was sent. Raises ``KubeError`` (counted; the next tick reads the slice back and tries
        again)."""
        if node_uid:
            self._node_uid = node_uid
        desired = self.desired(snapshot, health)
        self.note(desired, now_s)
        self._last_desired = desired
        try:
            if self.published is None and self.client is not None:
                stored = self.client.get()
                self.published = (
                    strip_server_fields(stored.get("spec", {}).get("devices")) if stored else None
                )
            before = self.published
            target = desired
            if before is not None:
                target = self.within_budget(before, desired, now_s)
                if target != desired:
                    self.cache.slice_held += 1
            if before is not None and _same(before, target):
                return False
            if self.client is not None:
                self.client.apply(slice_body(self.settings.node_name or "", self._node_uid, target))
            self.published = target
            self.last_write_s = now_s
            self.cache.slice_writes += 1
            return True
        except KubeError:
            self.cache.slice_errors += 1
            self.published = None  # read it back next time
            raise

    def note(self, desired: list[dict[str, Any]], now_s: float) -> None:
        """Move the calm clocks by this tick's devices (``desired``) against the last tick's:
        each part of each device that got worse or better (``core.publish.budget.note_changes``)."""
        if self._last_desired is not None:
            got_worse, got_better = _device_changes(self._last_desired, desired)
            self.calm = note_changes(self.calm, got_worse, got_better, now_s,
                                     self.settings.min_patch_interval_s)  # fmt: skip

    def within_budget(
        self, before: list[dict[str, Any]], desired: list[dict[str, Any]], now_s: float
    ) -> list[dict[str, Any]]:
        """The devices to write now: ``desired`` with the changes for the better the budget
        holds kept as published (``before``); see ``_within_budget``."""
        return _within_budget(before, desired, now_s, self.last_write_s,
                              self.settings.min_patch_interval_s, self.calm)  # fmt: skip

    def delete(self) -> None:
        """Delete the slice (the agent's exit); a failure is logged, never raised."""
        if self.client is None:
            return
        try:
            if self.client.delete():
                logger.info("deleted ResourceSlice {}", self.client.name)
        except KubeError as exc:
            logger.error("could not delete ResourceSlice {}: {}", self.client.name, exc)
        self.published = None


def _by_name(devices: list[dict[str, Any]] | None) -> dict[Any, dict[str, Any]]:
    return {d.get("name"): d for d in devices or []}


#: the parts of a device the budget judges on their own calm clocks: a GPU's memory churn never
#: holds back its taint's removal
FREE, TAINTS = "free", "taints"


def _parts(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, tuple[list[Any], list[Any]]]:
    """One device on both sides (``None``: absent there), seen one part at a time for
    ``core.publish.dra.worse_devices``: its free memory (and what else it says) without its taints,
    and its taints with the same attributes on both sides."""
    attributes = (after or before or {}).get("attributes")

    def view(device: dict[str, Any] | None, part: str) -> list[Any]:
        if device is None:
            return []
        if part == FREE:
            return [{k: v for k, v in device.items() if k != "taints"}]
        return [{**device, "attributes": attributes}]

    return {part: (view(before, part), view(after, part)) for part in (FREE, TAINTS)}


def _device_changes(
    before: list[dict[str, Any]] | None, after: list[dict[str, Any]]
) -> tuple[set[tuple[Any, str]], set[tuple[Any, str]]]:
    """``(worse, better)``: the parts ``(device name, FREE or TAINTS)`` that changed for the
    worse from ``before`` to ``after`` (``core.publish.dra.worse_devices`` of that part alone: free
    memory down, a taint added, the device gone or changed otherwise), and the others that
    changed (free memory up, a taint gone, a new device)."""
    old, new = _by_name(before), _by_name(after)
    worse: set[tuple[Any, str]] = set()
    better: set[tuple[Any, str]] = set()
    for name in old.keys() | new.keys():
        for part, (b, a) in _parts(old.get(name), new.get(name)).items():
            if _same(b, a):
                continue
            (worse if worse_devices(b, a) else better).add((name, part))
    return worse, better


def _within_budget(
    before: list[dict[str, Any]], desired: list[dict[str, Any]], now_s: float,
    last_write_s: float | None, interval_s: float, calm: Mapping[tuple[Any, str], Calm],
) -> list[dict[str, Any]]:
    """The devices to publish: ``desired`` with each change for the better (more free memory,
    a taint gone, a new device) held at ``before`` (the published slice;
    ``core.publish.dra.held_devices``) while the budget holds that part of that device
    (``core.publish.budget.held_keys``: it got worse itself within its calm window (``calm``), or
    nothing goes this time and the last write is under an interval old). Changes for the worse
    always go, and carry the calm parts' changes for the better with them."""
    old = _by_name(before)
    worse, better = _device_changes(before, desired)
    held = held_keys(better, now_s, last_write_s, interval_s, calm, going=bool(worse))
    if not held:
        return desired
    out: list[dict[str, Any]] = []
    for d in desired:
        name = d.get("name")
        hold_free, hold_taints = (name, FREE) in held, (name, TAINTS) in held
        b = old.get(name)
        if b is None:
            if not (hold_free or hold_taints):
                out.append(d)  # a new device, let go
            continue
        if not (hold_free or hold_taints):
            out.append(d)
            continue
        kept = held_devices([b], [d])[0]
        if not hold_taints:
            kept = {k: v for k, v in kept.items() if k != "taints"}
            if "taints" in d:
                kept["taints"] = d["taints"]
        if not hold_free:
            kept["attributes"] = d["attributes"]
        out.append(kept)
    return out


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
