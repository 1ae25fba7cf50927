"""Slices of shared GPUs as the agent sees them: which GPUs are shared, who holds which slice,
how much each holder uses, the largest slice a GPU can still take, and over-use episodes.

A shared GPU (``core.sharing``) is served as memory units; the kubelet's PodResources lists the
unit device IDs (``<GPU UUID>::<k>``) each container holds, so a container's slice on a GPU is
its units of that GPU times ``unit_mib``. Its use is the memory of its processes there
(``GpuAttribution.pods``, placed through their cgroups and named through the API's pods).
Pure: no I/O; the agent (render, telemetry, metrics, Events) and ``omaticaya top`` use it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .attribution import ContainerDevices, GpuAttribution
from .sharing import SharedGpus, gpu_room_mib, parse_unit_id, unit_count
from .snapshot import GpuReading, NodeSnapshot

__all__ = [
    "PodIdentity",
    "SliceUse",
    "Sharing",
    "episodes",
    "gpu_slices",
    "is_shared",
    "over_limit",
    "slice_room_mib",
    "stray_unit_ids",
]


@dataclass(frozen=True, slots=True)
class Sharing:
    """What the agent shares: ``gpus`` (``OMATICAYA_SHARED_GPUS``) in units of ``unit_mib``
    (``OMATICAYA_SHARE_UNIT_MIB``). ``Sharing()`` shares nothing."""

    gpus: SharedGpus = SharedGpus()
    unit_mib: int = 1024

    @classmethod
    def of(cls, settings: object) -> Sharing:
        """From the settings (``shared_gpus``, ``share_unit_mib``)."""
        return cls(settings.shared_gpus, settings.share_unit_mib)  # type: ignore[attr-defined]

    def __bool__(self) -> bool:
        return bool(self.gpus)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod as the API names it: ``uid`` (``metadata.uid``) and ``containers``, container ID
    (the runtime's, without the ``containerd://`` scheme) -> container name, from
    ``status.containerStatuses`` and ``initContainerStatuses`` (empty before any started).
    What turns a process's cgroup (pod UID, container ID) into the names PodResources uses."""

    namespace: str
    name: str
    uid: str
    containers: Mapping[str, str]


def is_shared(g: GpuReading, sharing: Sharing | None) -> bool:
    """Whether GPU ``g`` is served as memory units: its index is shared and MIG is not on
    (a GPU with MIG on is given out as MIG devices, never in units)."""
    return sharing is not None and g.index in sharing.gpus and not g.mig_enabled


@dataclass(frozen=True, slots=True)
class SliceUse:
    """One container's slice of one shared GPU.

    ``units`` (its unit device IDs of that GPU, PodResources) x the unit = ``limit_mib``;
    ``used_mib``: the memory its processes hold on the GPU (``None`` when that cannot be said:
    processes not placed, or a pod or container the API did not name)."""

    namespace: str
    pod: str
    container: str
    units: int
    limit_mib: int
    used_mib: int | None

    @property
    def over(self) -> bool:
        """It holds more than it asked for."""
        return self.used_mib is not None and self.used_mib > self.limit_mib

    @property
    def key(self) -> tuple[str, str, str]:
        """``(namespace, pod, container)``."""
        return (self.namespace, self.pod, self.container)


def _units_on(h: ContainerDevices, gpu_uuid: str) -> int:
    return sum(
        1 for d in dict.fromkeys(h.device_ids) if (p := parse_unit_id(d)) and p[0] == gpu_uuid
    )


def gpu_slices(att: GpuAttribution | None, gpu_uuid: str | None, unit_mib: int) -> tuple[SliceUse, ...]:
    """The slices held on the shared GPU ``gpu_uuid``: one per holder with units of it, in the
    kubelet's order. A container's use is the memory of the processes named as its own; the
    processes of its pod whose container is not named count for it when it is the pod's only
    holder of this GPU. Its use is unknown while a process on the GPU is not placed, or while
    its pod is not named (``GpuAttribution.named_pods``; without that, while any process's pod
    is not). ``()`` when not attributed."""
    if att is None or not gpu_uuid:
        return ()
    held = [(h, n) for h in att.holders if (n := _units_on(h, gpu_uuid)) > 0]
    per_pod: dict[tuple[str, str], int] = {}
    for h, _ in held:
        per_pod[(h.namespace, h.pod)] = per_pod.get((h.namespace, h.pod), 0) + 1
    placed = not att.unknown_pids
    every_pod_named = all(p.pod is not None for p in att.pods)
    out = []
    for h, units in held:
        used: int | None = None
        if att.named_pods is not None:
            named = placed and (h.namespace, h.pod) in att.named_pods
        else:
            named = placed and every_pod_named
        if named:
            mine = [p for p in att.pods if (p.namespace, p.pod) == (h.namespace, h.pod)]
            own = sum(p.used_memory_mib for p in mine if p.container == h.container)
            loose = [p for p in mine if p.container is None]
            if not loose:
                used = own
            elif per_pod[(h.namespace, h.pod)] == 1:
                used = own + sum(p.used_memory_mib for p in loose)
        out.append(
            SliceUse(h.namespace, h.pod, h.container, units, units * unit_mib, used)
        )
    return tuple(out)


def slice_room_mib(g: GpuReading, att: GpuAttribution | None, unit_mib: int) -> int | None:
    """The largest slice shared GPU ``g`` can take now, MiB: its live free memory, and no more
    than its units no container holds (PodResources; all of them when not attributed).
    ``None`` when its free memory was not read."""
    if g.memory_free_mib is None:
        return None
    if not g.memory_total_mib:
        return g.memory_free_mib
    held = sum(s.units for s in gpu_slices(att, g.uuid, unit_mib))
    return gpu_room_mib(g.memory_free_mib, unit_count(g.memory_total_mib, unit_mib) - held, unit_mib)


def over_limit(
    snapshot: NodeSnapshot, attribution: Mapping[str, GpuAttribution], sharing: Sharing | None
) -> list[tuple[GpuReading, SliceUse]]:
    """Every slice whose container holds more than its limit, with its GPU, GPU order."""
    out: list[tuple[GpuReading, SliceUse]] = []
    for g in snapshot.gpus:
        if is_shared(g, sharing) and g.uuid:
            assert sharing is not None
            out.extend(
                (g, s) for s in gpu_slices(attribution.get(g.uuid), g.uuid, sharing.unit_mib)
                if s.over
            )
    return out


def stray_unit_ids(assignments: Iterable[ContainerDevices], gpu_uuids: Iterable[str]) -> list[str]:
    """Unit device IDs (``<UUID>::<k>``) in ``assignments`` that name no GPU of ``gpu_uuids``
    (this node's): untrusted input, skipped by the attribution and counted by the caller."""
    known = set(gpu_uuids)
    return [
        d for a in assignments for d in a.device_ids
        if (p := parse_unit_id(d)) is not None and p[0] not in known
    ]


K = TypeVar("K", bound=Hashable)  # an over-use episode's key


def episodes(reported: frozenset[K], now: Iterable[K]) -> tuple[list[K], frozenset[K]]:
    """Over-use episodes: ``(keys whose episode starts now, reported keys still in one)``,
    given the keys whose episode was already said (``reported``) and those over their limit
    ``now``. An episode is said once when it starts and ends when its key is no longer over; a
    later return starts a new one. The caller adds the keys it said to the second part (one it
    could not say stays new, and is tried again)."""
    current = list(dict.fromkeys(now))
    return [k for k in current if k not in reported], frozenset(reported & set(current))
