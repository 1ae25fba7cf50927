"""Slices of shared GPUs as the agent sees them: who holds which, and how much each uses.

A container's slice on a shared GPU is its units of that GPU (the kubelet's PodResources,
``core.rules.attribution.ContainerDevices``) times ``unit_mib``; its use is the memory of its
processes there, placed through their cgroups and named through the API's pods
(``core.rules.attribution.GpuAttribution``), with each of those processes' own memory where the GPU's
NVML process list gives it (``SliceUse.processes``: what tells a container with several CUDA
processes, each held to the slice by MPS, from one process over it): ``gpu_slices``; the largest slice a GPU can still take
(``slice_room_mib``), the slices over their limit (``over_limit``) and unit IDs naming no GPU
of this node (``stray_unit_ids``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..model.sharing import Sharing, gpu_room_mib, is_shared, parse_unit_id, unit_count
from ..model.snapshot import GpuProcess, GpuReading, NodeSnapshot
from ..rules.attribution import ContainerDevices, GpuAttribution

__all__ = ["SliceUse", "gpu_slices", "over_limit", "slice_room_mib", "stray_unit_ids"]


@dataclass(frozen=True, slots=True)
class SliceUse:
    """One container's slice of one shared GPU.

    ``units`` (its unit device IDs of that GPU, PodResources) x the unit = ``limit_mib``;
    ``used_mib``: the memory its processes hold on the GPU (``None`` when that cannot be said:
    processes not placed, or a pod or container the API did not name); ``processes``: the
    processes counted in it, ``(pid, MiB)`` by pid (the MiB from the GPU's NVML process list,
    ``None`` where NVML gave none or the list was not given); ``()`` when ``used_mib`` is
    ``None`` or no process list was given (``gpu_slices``). ``unit_ids``: those unit IDs, in the
    kubelet's order (what names the slice's MPS daemon: ``core.allocation.mps.slice_id`` of them sorted).
    Neither is compared."""

    namespace: str
    pod: str
    container: str
    units: int
    limit_mib: int
    used_mib: int | None
    processes: tuple[tuple[int, int | None], ...] = field(default=(), compare=False)
    unit_ids: tuple[str, ...] = field(default=(), compare=False)

    @property
    def over(self) -> bool:
        """It holds more than it asked for."""
        return self.used_mib is not None and self.used_mib > self.limit_mib

    @property
    def key(self) -> tuple[str, str, str]:
        """``(namespace, pod, container)``."""
        return (self.namespace, self.pod, self.container)


def _units_on(h: ContainerDevices, gpu_uuid: str) -> int:
    return len(_unit_ids_on(h, gpu_uuid))


def _unit_ids_on(h: ContainerDevices, gpu_uuid: str) -> tuple[str, ...]:
    return tuple(
        d for d in dict.fromkeys(h.device_ids) if (p := parse_unit_id(d)) and p[0] == gpu_uuid
    )


def gpu_slices(
    att: GpuAttribution | None,
    gpu_uuid: str | None,
    unit_mib: int,
    processes: Iterable[GpuProcess] | None = None,
) -> tuple[SliceUse, ...]:
    """The slices held on the shared GPU ``gpu_uuid``: one per holder with units of it, in the
    kubelet's order. A container's use is the memory of the processes named as its own; the
    processes of its pod whose container is not named count for it when it is the pod's only
    holder of this GPU. Its use is unknown while a process on the GPU is not placed, or while
    its pod is not named (``GpuAttribution.named_pods``; without that, while any process's pod
    is not), and while the GPU could not be read (``GpuAttribution.read``). ``()`` when not
    attributed. ``processes``: the GPU's NVML compute processes (``GpuReading.processes``, the
    list the attribution was made from): with it, each slice whose use is known has the pids
    counted in it with their own MiB (``SliceUse.processes``); ``None``: not asked for."""
    if att is None or not gpu_uuid:
        return ()
    held = [(h, n) for h in att.holders if (n := _units_on(h, gpu_uuid)) > 0]
    per_pod: dict[tuple[str, str], int] = {}
    for h, _ in held:
        per_pod[(h.namespace, h.pod)] = per_pod.get((h.namespace, h.pod), 0) + 1
    placed = att.read and not att.unknown_pids
    every_pod_named = all(p.pod is not None for p in att.pods)
    mib_of = {p.pid: p.used_memory_mib for p in processes} if processes is not None else None
    out = []
    for h, units in held:
        used: int | None = None
        counted: list[int] = []
        if att.named_pods is not None:
            named = placed and (h.namespace, h.pod) in att.named_pods
        else:
            named = placed and every_pod_named
        if named:
            mine = [p for p in att.pods if (p.namespace, p.pod) == (h.namespace, h.pod)]
            own = sum(p.used_memory_mib for p in mine if p.container == h.container)
            loose = [p for p in mine if p.container is None]
            counted = [pid for p in mine if p.container == h.container for pid in p.pids]
            if not loose:
                used = own
            elif per_pod[(h.namespace, h.pod)] == 1:
                used = own + sum(p.used_memory_mib for p in loose)
                counted += [pid for p in loose for pid in p.pids]
        per_pid: tuple[tuple[int, int | None], ...] = ()
        if used is not None and mib_of is not None:
            per_pid = tuple((pid, mib_of.get(pid)) for pid in sorted(set(counted)))
        out.append(
            SliceUse(h.namespace, h.pod, h.container, units, units * unit_mib, used, per_pid,
                     _unit_ids_on(h, gpu_uuid))  # fmt: skip
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
    """Every slice whose container holds more than its limit, with its GPU, GPU order; each
    with its processes' own MiB (``SliceUse.processes``, from ``GpuReading.processes``)."""
    out: list[tuple[GpuReading, SliceUse]] = []
    for g in snapshot.gpus:
        if is_shared(g, sharing) and g.uuid:
            assert sharing is not None
            slices = gpu_slices(attribution.get(g.uuid), g.uuid, sharing.unit_mib, g.processes)
            out.extend((g, s) for s in slices if s.over)
    return out


def stray_unit_ids(assignments: Iterable[ContainerDevices], gpu_uuids: Iterable[str]) -> list[str]:
    """Unit device IDs (``<UUID>::<k>``) in ``assignments`` that name no GPU of ``gpu_uuids``
    (this node's): untrusted input, skipped by the attribution and counted by the caller."""
    known = set(gpu_uuids)
    return [
        d for a in assignments for d in a.device_ids
        if (p := parse_unit_id(d)) is not None and p[0] not in known
    ]
