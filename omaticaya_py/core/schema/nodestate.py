"""A Node's GPU state read back from its labels and telemetry, as untrusted input.

``parse_node`` turns a Node's labels and ``<prefix>/telemetry`` annotation into the typed
``NodeGpuState`` the scheduler extender and ``omaticaya top`` decide on; ``parse_gpu_readings``
gives each published GPU for display. Neither ever raises on what a Node carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..model.sharing import gpu_room_mib
from .names import (
    GPU_HEALTH,
    GPU_MEMORY_FREE,
    GPU_MIG_ENABLED,
    HEALTH,
    HEALTHY_COUNT,
    MEMORY_FREE,
    MEMORY_FREE_TOTAL,
    MIG_STRATEGY,
    SHARED_MEMORY_FREE,
    per_gpu,
)
from .telemetry import TELEMETRY, GpuTelemetry, MigTelemetry, PodTelemetry, Telemetry
from .values import json_int, json_mapping, json_str

__all__ = [
    "MAX_REFRESH_S",
    "GpuInfo",
    "NodeGpuState",
    "label_bounds",
    "lease_ref",
    "parse_gpu_readings",
    "parse_node",
    "state_from_object",
]

@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One whole GPU as the extender sees it: ``free_mib`` now, ``healthy``, and
    ``free_min_mib``, the least free memory over the agent's peak window (``None``: not
    published: window off, not yet half covered, or an older agent); ``total_mib``, its
    memory (the telemetry's ``memory_total_mib``; ``None``: not published), which tells a
    GPU too small for a pod whatever is evicted from it (``scheduler.victims``).

    ``assigned``: the kubelet has handed this whole GPU to a container (the telemetry's
    ``pods``, from PodResources): it has no room for another pod whatever NVML shows, and its
    ``free_mib`` is 0. A shared GPU is never ``assigned``: it has two books, its live
    ``free_mib`` and ``units_left``, the units no container holds (``None``: not published),
    and a slice's room is the least of them (``room_mib``, ``core.model.sharing.gpu_room_mib``)."""

    index: int
    free_mib: int
    healthy: bool
    free_min_mib: int | None = None
    total_mib: int | None = None
    assigned: bool = False
    #: an assigned GPU's free MiB by the live reading (capped as ``free_mib`` is); ``None``
    #: when not assigned: what evicting its holders would start from (``scheduler.preempt``)
    assigned_free_mib: int | None = None
    units_left: int | None = None
    #: a MIG device (``NodeGpuState.mig``): its profile (``1g.10gb``) and its index under its
    #: GPU (``index`` is the GPU's); ``None`` for a whole GPU
    profile: str | None = None
    mig_index: int | None = None
    #: the most units a slice here can take by the node's labels (``gpu.shared.memory.free-mib``
    #: over the unit): a bound on the room, kept apart from ``units_left`` (the kubelet's
    #: books) so that what is taken off the books is never taken off the bound as well
    units_cap: int | None = None

    def room_mib(self, unit_mib: int) -> int:
        """The largest slice this (shared) GPU can take at ``unit_mib`` MiB per unit: the least
        of its two books (``core.model.sharing.gpu_room_mib``), its units bounded by ``units_cap``;
        its ``free_mib`` when no unit count is known."""
        if self.units_left is None:
            return max(self.free_mib, 0)
        units = self.units_left if self.units_cap is None else min(self.units_left, self.units_cap)
        return gpu_room_mib(self.free_mib, units, unit_mib)


@dataclass(frozen=True, slots=True)
class NodeGpuState:
    """What the extender knows about one node's GPUs, parsed once per Node change.

    ``known`` is False when the node carries no Omaticaya data at all; ``health`` is the
    ``gpu.health`` label (or the telemetry's); ``read_at`` is epoch seconds (``None``: no
    telemetry annotation); ``expires_at`` is epoch seconds, the agent's own promise of its next
    rewrite (``None``: an agent that does not publish it, or a value not to be trusted);
    ``lease`` is the ``"<namespace>/<name>"`` of the Lease that holds the agent's liveness
    (``None``: none named, or not of that form): its renewals, not ``read_at``, say whether
    the telemetry is current; ``gpus`` per GPU; ``free_total_mib`` over healthy GPUs (an
    assigned one counts 0);
    ``holders``: the pods the kubelet has handed a GPU, MIG device or slice of this node
    (``"<namespace>/<name>"``, from the telemetry's ``pods``; empty when the agent attributes
    nothing): a pod there is in the reading (``scheduler.inflight.pending``)."""

    name: str
    known: bool = False
    health: str | None = None
    read_at: float | None = None
    expires_at: float | None = None
    gpus: tuple[GpuInfo, ...] = ()
    free_total_mib: int = 0
    problem: str | None = None
    lease: str | None = None
    shared: tuple[GpuInfo, ...] = ()
    share_unit_mib: int | None = None
    holders: frozenset[str] = frozenset()
    #: each slice a holder has on a shared GPU: ``("<namespace>/<name>", GPU index, units)``,
    #: in the telemetry's order (where the device plugin put it)
    slices_held: tuple[tuple[str, int, int], ...] = ()
    #: the telemetry publishes the holders of its shared GPUs (the agent's PodResources
    #: attribution is on): their units left are the kubelet's books
    units_attributed: bool = False
    #: free MiB over healthy whole GPUs by the live reading, assigned ones included (``None``:
    #: not parsed from a Node, then ``free_total_mib``): what the in-flight rule's memory drops
    #: are measured on (``live_free_total_mib``), since an assignment frees no memory
    free_live_total_mib: int | None = None
    #: the MIG devices of the GPUs with MIG on (the telemetry's ``mig_devices`` with a profile):
    #: ``index`` the GPU's, ``mig_index`` and ``profile`` set, ``assigned`` when the kubelet
    #: has handed it to a container (its ``pods``), then ``free_mib`` 0
    mig: tuple[GpuInfo, ...] = ()

    @property
    def live_free_total_mib(self) -> int:
        """Free MiB over the healthy whole GPUs by the live reading, assigned GPUs included."""
        live = self.free_live_total_mib
        return self.free_total_mib if live is None else live

    @property
    def shared_free_total_mib(self) -> int:
        """Free MiB summed over the healthy shared GPUs."""
        return sum(g.free_mib for g in self.shared if g.healthy)


#: the longest ``expires_at - read_at`` trusted (a weekly schedule plus a day of heartbeat):
#: beyond it the value did not come from a working agent, and the extender's TTL applies
MAX_REFRESH_S = 8 * 24 * 3600.0

#: a Lease reference as the agent writes it: ``<namespace>/<name>`` (a DNS label, a DNS
#: subdomain)
_LEASE_REF = re.compile(
    r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9](?:[-.a-z0-9]{0,251}[a-z0-9])?$"
)


def lease_ref(value: Any) -> str | None:
    """``value`` when it is a ``"<namespace>/<name>"`` Lease reference, else ``None``."""
    if isinstance(value, str) and len(value) <= 317 and _LEASE_REF.match(value):
        return value
    return None


def parse_node(
    name: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    prefix: str = "omaticaya.io",
) -> NodeGpuState:
    """A node's GPU state from its labels and the ``<prefix>/telemetry`` annotation.

    Per-GPU data comes from the telemetry (exact MiB) when it parses, else from the
    ``gpu-N.*`` labels, else from the node aggregates (``gpu.memory.free-mib`` on one GPU,
    ``gpu.healthy-count`` GPUs). Only whole GPUs count: a GPU with MIG on (``mig_enabled`` in
    the telemetry, ``gpu-N.mig.enabled`` label) is given out as MIG devices, not as a GPU.

    Shared GPUs (the telemetry's ``gpus[].shared``, with its ``share_unit_mib``) go to
    ``shared``, never to ``gpus``: a pod asking for whole GPUs cannot be given one.

    The kubelet's books count as the device plugin counts them (``core.model.sharing``): a whole GPU
    with a holder in the telemetry's ``pods`` is ``assigned`` (``free_mib`` 0), and a shared
    GPU's ``free_mib`` is at most its units no holder has (``share_units`` less the holders'
    ``limit_mib`` over ``share_unit_mib``: ``gpu_room_mib``). Both need the agent's PodResources
    attribution; without it no holder is published and only the live memory counts.

    Never above the truth: each GPU's ``free_mib`` is the least of the telemetry's exact value
    and what the labels say (``label_bounds``): its ``gpu-N.memory.free-mib``, and the node's
    ``gpu.memory.free-mib`` (the most free on any one healthy unit, so a bound on every GPU;
    for a shared GPU ``gpu.shared.memory.free-mib``, the largest slice one can take);
    ``free_total_mib`` is also at most ``gpu.memory.free-total-mib``. Labels go down at once
    and are rounded down (``core.publish.budget``, ``core.model.labelvalues.stable_down``), while the
    telemetry may be a drop behind (it is rewritten when a label changes or free memory drops by
    ``OMATICAYA_TELEMETRY_FREE_DROP_MIB``): whichever is lower is the one to trust. A label that
    is absent or not a whole number bounds nothing.

    Everything here is untrusted (any controller can write a Node's annotations): it never
    raises. Values of the wrong type are ignored; a telemetry annotation that is not a JSON
    object, is over ``MAX_TELEMETRY_BYTES``, nests too deep for the parser, has a ``schema``
    newer than ``TELEMETRY_VERSION``, holds a number that is not finite where a whole number
    belongs, or lacks a valid ``read_at`` sets ``problem``
    (the filter then fails the node with that reason)."""
    labels = json_mapping(labels)
    annotations = json_mapping(annotations)
    p = prefix + "/"
    mine = {
        k[len(p) :]: v
        for k, v in labels.items()
        if isinstance(k, str) and k.startswith(p) and isinstance(v, str)
    }
    raw = annotations.get(p + TELEMETRY)
    doc, problem = Telemetry.parse(raw) if raw is not None else (None, None)
    health = json_str(mine.get(HEALTH)) or (doc.health if doc else None)
    if not mine and doc is None:
        return NodeGpuState(name=name, problem=problem)
    read_at = doc.read_at_s if doc else None
    if doc is not None and read_at is None:
        problem = "telemetry annotation without a valid read_at"
    expires_at = doc.expires_at_s if doc and read_at is not None else None
    if expires_at is not None and not 0 <= expires_at - read_at <= MAX_REFRESH_S:  # type: ignore[operator]
        expires_at = None

    # whole GPUs only: a GPU with MIG on is given out as MIG devices (nvidia.com/mig-<profile>),
    # never as a whole GPU, so its whole-GPU free memory must not make room for a pod; a shared
    # GPU is given out in memory units (slices), never whole either
    gpus: list[GpuInfo] = []
    shared: list[GpuInfo] = []
    unit_mib = doc.share_unit_mib if doc is not None else None
    unit_mib = unit_mib if unit_mib is not None and unit_mib > 0 else None
    listed = doc is not None and doc.gpus_listed
    holders: set[str] = set()
    slices_held: list[tuple[str, int, int]] = []
    attributed = False
    mig: list[GpuInfo] = []
    for g in doc.gpus if doc is not None else ():
        holders.update(_holders(g.pods))
        for m in g.mig_devices or ():
            holders.update(_holders(m.pods))
            if m.profile and g.mig:
                mig.append(_mig_info(g.index, m))
        if g.mig:
            continue
        if g.memory_free_unreadable:
            problem = "telemetry annotation with a bad memory_free_mib"
        free = g.memory_free_mib
        room = free or 0
        assigned = False
        units_left = None
        # the units' book needs the holders: ``pods`` is absent when the agent attributes nothing
        if g.shared and unit_mib is not None and g.share_units is not None and g.pods is not None:
            held = [(k, max(p.limit_mib or 0, 0) // unit_mib)
                    for p in g.pods or () for k in _holders((p,))]  # fmt: skip
            slices_held.extend((k, g.index, n) for k, n in held if n > 0)
            attributed = True
            units_left = g.share_units - sum(
                max(p.limit_mib or 0, 0) // unit_mib for p in g.pods or ()
            )
        elif not g.shared and g.pods:
            assigned = True  # no room for another pod: free_mib 0 below, after the live total
        info = GpuInfo(
            g.index,
            room,
            g.health == "Healthy" and free is not None,
            g.memory_free_min_mib,
            g.memory_total_mib,
            assigned,
            units_left=units_left,
        )
        if g.shared:  # without a unit size its slices cannot be sized: not given out
            if unit_mib is not None:
                shared.append(info)
            continue
        gpus.append(info)
    if not gpus and not listed:
        gpus = _label_gpus(mine)
    per_gpu, best, total = label_bounds(mine)
    gpus = [_capped(g, per_gpu.get(g.index), best) for g in gpus]
    # the largest slice one shared GPU can take (gpu.shared.memory.free-mib) bounds each one's
    # room: its units (its live memory stays the live reading's, capped by its own label)
    shared_best = json_int(mine.get(SHARED_MEMORY_FREE))
    shared = [_capped(g, per_gpu.get(g.index)) for g in shared]
    if shared_best is not None and unit_mib is not None:
        most = max(shared_best, 0) // unit_mib
        shared = [replace(g, units_left=most) if g.units_left is None
                  else g if g.units_left <= most else replace(g, units_cap=most)
                  for g in shared]  # fmt: skip
    live_total = sum(g.free_mib for g in gpus if g.healthy)
    if total is not None:
        live_total = min(live_total, max(total, 0))
    gpus = [replace(g, free_mib=0, assigned_free_mib=g.free_mib) if g.assigned else g
            for g in gpus]  # fmt: skip
    free_total = sum(g.free_mib for g in gpus if g.healthy)
    if total is not None:
        free_total = min(free_total, max(total, 0))
    return NodeGpuState(
        name=name,
        known=True,
        health=health,
        read_at=read_at,
        expires_at=expires_at,
        lease=lease_ref(doc.lease) if doc is not None and read_at is not None else None,
        gpus=tuple(gpus),
        free_total_mib=free_total,
        free_live_total_mib=live_total,
        problem=problem,
        shared=tuple(shared),
        share_unit_mib=unit_mib if shared else None,
        holders=frozenset(holders),
        slices_held=tuple(slices_held),
        units_attributed=attributed,
        mig=tuple(mig),
    )


def _mig_info(gpu_index: int, m: MigTelemetry) -> GpuInfo:
    """One MIG device as placement sees it: held (``pods``) means assigned, free 0."""
    free = m.memory_free_mib
    healthy = m.health == "Healthy" and free is not None and m.error is None
    held = bool(m.pods)
    return GpuInfo(gpu_index, 0 if held else max(free or 0, 0), healthy,
                   total_mib=m.memory_total_mib, assigned=held,
                   assigned_free_mib=free if held else None, profile=m.profile,
                   mig_index=m.index)  # fmt: skip


def _holders(pods: tuple[PodTelemetry, ...] | None) -> Iterator[str]:
    """``"<namespace>/<name>"`` of each holder with both names (others name no pod)."""
    for p in pods or ():
        if p.namespace and p.pod:
            yield f"{p.namespace}/{p.pod}"


def label_bounds(mine: Mapping[str, str]) -> tuple[dict[int, int], int | None, int | None]:
    """What a node's labels (``mine``: our label names without the prefix -> values) say the
    free memory is at most, MiB: ``(per GPU index from gpu-N.memory.free-mib, any one GPU
    from gpu.memory.free-mib, the sum over healthy GPUs from gpu.memory.free-total-mib)``;
    ``None`` (or no entry) where the label is absent or not a whole number. Never raises."""
    bounds: dict[int, int] = {}
    for index, names in per_gpu(mine).items():
        free = json_int(names.get(GPU_MEMORY_FREE))
        if free is not None:
            bounds[index] = free
    return bounds, json_int(mine.get(MEMORY_FREE)), json_int(mine.get(MEMORY_FREE_TOTAL))


def _capped(gpu: GpuInfo, *caps: int | None) -> GpuInfo:
    """``gpu`` with ``free_mib`` at most each cap that is not ``None`` (and never below 0)."""
    bound = min((c for c in caps if c is not None), default=None)
    if bound is None or gpu.free_mib <= bound:
        return gpu
    return replace(gpu, free_mib=max(bound, 0))


def _label_gpus(mine: Mapping[str, str]) -> list[GpuInfo]:
    """Whole GPUs from the ``gpu-N.*`` labels, else from the node aggregates."""
    gpus: list[GpuInfo] = []
    per = per_gpu(mine)
    for index in sorted(per):
        if per[index].get(GPU_MIG_ENABLED) == "true":
            continue
        free = json_int(per[index].get(GPU_MEMORY_FREE))
        gpus.append(
            GpuInfo(index, free or 0, per[index].get(GPU_HEALTH) == "Healthy" and free is not None)
        )
    if not gpus and MIG_STRATEGY not in mine:  # aggregates count MIG devices
        free = json_int(mine.get(MEMORY_FREE))
        healthy = json_int(mine.get(HEALTHY_COUNT)) or 0
        if free is not None and healthy > 0:
            # only aggregates: the best GPU has `free`; assume no more than that on the others,
            # capped by the free total
            left = json_int(mine.get(MEMORY_FREE_TOTAL)) or free
            for index in range(healthy):
                share = min(free, left)
                gpus.append(GpuInfo(index, share, True))
                left -= share
    return gpus


def state_from_object(node: Mapping[str, Any], prefix: str) -> NodeGpuState:
    """``parse_node`` on a v1.Node document (as the scheduler sends in ``Nodes.items``)."""
    meta = json_mapping(json_mapping(node).get("metadata"))
    name = meta.get("name")
    return parse_node(
        name if isinstance(name, str) else "", meta.get("labels"), meta.get("annotations"), prefix
    )


def parse_gpu_readings(
    annotations: Mapping[str, str] | None, prefix: str = "omaticaya.io"
) -> tuple[GpuTelemetry, ...]:
    """Each GPU of the ``<prefix>/telemetry`` annotation, by index (the first entry of an
    index wins), for display.

    Untrusted input, like ``parse_node``: it never raises; an annotation that is absent or
    unreadable gives ``()`` (``parse_node`` names the problem), a GPU entry that is not an
    object or has no whole ``index`` is skipped, and a field of the wrong type reads as
    ``None``."""
    doc, _ = Telemetry.parse(json_mapping(annotations).get(prefix + "/" + TELEMETRY))
    readings: dict[int, GpuTelemetry] = {}
    for g in doc.gpus if doc is not None else ():
        readings.setdefault(g.index, g)
    return tuple(readings[i] for i in sorted(readings))
