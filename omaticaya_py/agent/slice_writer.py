"""The Node's ResourceSlice (the DRA driver ``gpu.omaticaya.io``), kept in step with the
readings change-only, under the labels' write budget.

Each tick's devices come from ``core.dra.inventory`` (the reading, the health rules, the
damped free memory) and ``core.dra.render_devices``. A write goes out when they differ from
what was published: at once when the change is for the worse (``core.dra.worse_devices``: free
memory down, a taint added, a device gone), else once ``OMATICAYA_MIN_PATCH_INTERVAL_S`` has
passed since the last write and since the last change for the worse (``core.budget.hold_back``,
the labels' rule), changes for the better held back until then (``core.dra.held_devices``).
The slice as stored is read back at each heartbeat (re-created when deleted behind our back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from loguru import logger

from ..core.budget import hold_back
from ..core.dra import (
    DraDevice,
    held_devices,
    inventory,
    render_devices,
    slice_body,
    strip_server_fields,
    worse_devices,
)
from ..core.health import NodeHealth
from ..core.settings import Settings
from ..core.sharing import Sharing
from ..core.snapshot import NodeSnapshot
from ..kube import KubeError
from ..kube.quantity import parse_quantity
from ..kube.resourceslice import ResourceSliceClient

__all__ = ["SliceWriter"]

#: the health reason of every device while NVML cannot be read at all
READING_FAILED = "nvml-unreadable"


def _rfc3339(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class SliceWriter:
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
        self.calm_since_s: float | None = None
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
        if self._last_desired is not None and worse_devices(self._last_desired, desired):
            self.calm_since_s = now_s
        self._last_desired = desired
        try:
            if self.published is None and self.client is not None:
                stored = self.client.get()
                self.published = (
                    strip_server_fields(stored.get("spec", {}).get("devices")) if stored else None
                )
            before = self.published
            target = desired
            interval_s = self.settings.min_patch_interval_s
            if before is not None and not worse_devices(before, desired) and hold_back(
                now_s, self.last_write_s, interval_s, False, self.calm_since_s
            ):
                target = held_devices(before, desired)
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
