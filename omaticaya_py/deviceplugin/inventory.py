"""The devices one plugin serves and their health, from the agent's cache.

``Inventory`` keeps the devices of one resource known so far (GPU or MIG UUIDs, from the trace
and every reading since) and answers, from the latest reading, each one's health: the health
rules' (``core.rules.health``), ``stale-reading`` while the reading is older than the stuck bound, the
library's error while NVML cannot be read, ``absent`` while the device is not in the reading.
Devices that left the reading (``allocation.departed``) leave it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from loguru import logger

from ..core.model.sayonce import SayOnce
from ..core.model.sharing import unit_count, unit_gpu
from ..core.model.snapshot import NodeSnapshot
from ..core.model.topology import NodeTopology
from ..core.publish.readings import ReadingAge, ReadingCache
from ..core.rules.health import Unit
from .allocation import STALE_READING, DeviceState, departed
from .config import DEFAULT_TIMING, Scope, Timing
from .slices import expand

__all__ = ["Inventory", "UnitBook"]


class UnitBook(Protocol):
    """What the inventory of the shared resource asks of its book of slices
    (``slicer.Slicer``): each shared GPU's unit count, learnt from unit IDs known in advance and
    from each GPU's total memory at ``unit_mib`` MiB per unit."""

    unit_mib: int

    @property
    def counts(self) -> Mapping[str, int]:
        """GPU UUID -> its unit count."""
        ...

    def learn(self, unit_ids: Iterable[str]) -> dict[str, int]:
        """Record the unit counts unit IDs known in advance imply."""
        ...

    def note_units(self, gpu_uuid: str, count: int) -> None:
        """Record a GPU's unit count (0: unknown, the one known stays)."""
        ...


class Inventory:
    """The devices of one resource, with their health from ``cache.last`` (the agent's latest
    ``TickResult``).

    - ``scope``: which devices (``config.Scope``: a MIG profile, whole GPUs, or the shared
      GPUs' units).
    - ``devices``: ``(GPU index, UUID)`` known before the first reading (a trace's; for the
      shared resource unit IDs, whose GPUs and unit counts are learnt), so a device that is
      gone or unreadable stays listed, as Unhealthy.
    - ``timing``: ``stale_after_s`` on ``clock`` (``config.Timing``): every device is Unhealthy
      (``stale-reading``) while the reading served is older than this, counted on the plugin's
      own clock from when it first saw that reading (the agent's wall clock plays no part).
    - ``slicer``: the shared resource's book (``UnitBook``: a ``slicer.Slicer``), which keeps
      each shared GPU's unit count; ``None`` for GPUs and MIG devices.
    - ``enforced``: for the shared resource under MPS, whether a GPU UUID's MPS daemon is up now
      and if not why (``sources.mps.MpsWatch.enforcement``'s ``up`` and ``reason``): a GPU
      healthy by its reading but not enforced is Unhealthy with that reason (fail closed: a
      client whose daemon is down would run without its limit), and healthy again once its
      daemon is up. ``None``: no enforcement to check.

    ``stale``: whether the last look found the reading stale. Thread-safe.
    """

    def __init__(self, cache: ReadingCache, scope: Scope, devices: Iterable[tuple[int, str]] = (),
                 timing: Timing = DEFAULT_TIMING, slicer: UnitBook | None = None,
                 enforced: Callable[[str], tuple[bool, str]] | None = None) -> None:  # fmt: skip
        self._cache = cache
        self._enforced = enforced
        self.scope = scope
        self.slicer = slicer
        self.stale_after_s = timing.stale_after_s
        self._clock = timing.clock
        known = list(devices)
        if slicer is not None:  # unit IDs known in advance: their GPUs, and unit counts
            slicer.learn(d for _, d in known)
            known = list(dict.fromkeys((i, unit_gpu(d) or d) for i, d in known))
        self._known: dict[str, int] = {uuid: index for index, uuid in known}
        self._parents: dict[str, str] = {}  # MIG device UUID -> its parent GPU's UUID
        self._age = ReadingAge()  # the snapshot served, on ``clock``
        self.stale = False
        self._lock = threading.Lock()
        self._logged: SayOnce[str, bool] = SayOnce()  # devices said unhealthy

    def devices(self) -> list[DeviceState]:
        """Every known device with its health from the latest reading, in index order: GPUs,
        MIG devices, or (the shared resource) each shared GPU's units."""
        gpus = self.gpu_states()
        return gpus if self.slicer is None else expand(gpus, self.slicer.counts)

    def topology(self) -> NodeTopology | None:
        """How the node's GPUs are wired, as the latest reading says
        (``NodeSnapshot.topology``: NVML's, read once per ``nvmlInit``, or a version 3
        trace's); ``None`` before the first reading or when unknown."""
        last = self._cache.last
        return last.snapshot.topology if last is not None else None

    def gpu_states(self) -> list[DeviceState]:
        """Every known GPU (or MIG device) of this resource with its health from the latest
        reading, in index order; for the shared resource, the shared GPUs (not yet as units)."""
        last = self._cache.last
        with self._lock:
            if last is None:
                states = [DeviceState(uuid, index, False, ("no-reading",))
                          for uuid, index in self._known.items()]  # fmt: skip
                return sorted(states, key=lambda s: (s.index, s.id))
            units = self._read(last.snapshot, last.health.units)
            states = self._states(last.snapshot, units, self._stale(last.snapshot))
        states.sort(key=lambda s: (s.index, s.mig_index or 0, s.id))
        self._log_changes(states)
        return states

    def _mine(self, unit: Unit) -> bool:
        """Whether ``unit`` (from the health assessment) is one of this resource's."""
        scope = self.scope
        if unit.profile != scope.profile or unit.is_mig != (scope.profile is not None):
            return False
        return unit.is_mig or scope.shared.shares(unit.gpu_index, unit.uuid) == scope.units

    def _read(self, snapshot: NodeSnapshot, assessed: Iterable[Unit]) -> dict[str, Unit]:
        """This resource's units of the reading by UUID, learnt as known (with their unit
        counts and MIG parents); the devices that left the reading forgotten. Under ``_lock``."""
        assessed = list(assessed)
        read = {u.uuid for u in assessed if u.uuid}
        gpu_uuid = {g.index: g.uuid for g in snapshot.gpus if g.uuid}
        units: dict[str, Unit] = {}
        for unit in assessed:
            if not self._mine(unit):
                continue  # another plugin's resource
            uuid = unit.uuid or (None if unit.is_mig else self._by_index(unit.gpu_index, read))
            if uuid is None:
                continue  # never read its UUID: nothing to advertise
            if self.slicer is not None:
                self.slicer.note_units(uuid, unit_count(unit.memory_total_mib, self.slicer.unit_mib))
            self._known[uuid] = unit.gpu_index
            if unit.is_mig and unit.gpu_index in gpu_uuid:
                self._parents[uuid] = gpu_uuid[unit.gpu_index]
            units[uuid] = unit
        mig = self.scope.profile is not None
        for uuid in departed(self._known, self._parents, units, snapshot, mig):
            logger.info("device plugin: {} left the reading: no longer advertised", uuid)
            del self._known[uuid]
            self._parents.pop(uuid, None)
            self._logged.end(uuid)
        return units

    def _by_index(self, index: int, read: set[str]) -> str | None:
        """The known GPU a unit NVML gave no UUID for is taken to be: the one known GPU last
        seen at ``index`` that the reading does not show under its UUID elsewhere; ``None``
        when there is no such GPU or more than one (indices shift when a GPU is lost at boot:
        a device ID is a UUID, never guessed from an index that two GPUs held). Under
        ``_lock``."""
        found = [uuid for uuid, i in self._known.items() if i == index and uuid not in read]
        return found[0] if len(found) == 1 else None

    def _states(self, snapshot: NodeSnapshot, units: dict[str, Unit], stale: bool
                ) -> list[DeviceState]:  # fmt: skip
        """Each known device's state: stale, the library's error, absent, or as read."""
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
                healthy, reasons = read.healthy, read.reasons
                if self._enforced is not None:
                    up, why = self._enforced(uuid)
                    if not up:
                        healthy, reasons = False, (*reasons, why)
                states.append(DeviceState(uuid, read.gpu_index, healthy, reasons,
                                          read.memory_free_mib, read.mig_index))  # fmt: skip
        return states

    def _stale(self, snapshot: object) -> bool:
        """Whether ``snapshot`` (the reading served) is older than ``stale_after_s`` on our
        clock, counted from when this plugin first saw it; logs each change once. Called under
        ``_lock``."""
        age_s = self._age.age_s(snapshot, self._clock())
        stale = self.stale_after_s is not None and age_s > self.stale_after_s
        if stale and not self.stale:
            logger.warning(
                "device plugin: the agent's reading is {:.1f}s old (more than {:.3g}s): every "
                "{} device Unhealthy until a fresh one", age_s, self.stale_after_s,
                self.scope.profile or "GPU",
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
