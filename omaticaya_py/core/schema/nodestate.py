"""A Node's GPU state read back from its labels and telemetry, as untrusted input.

``parse_node`` turns a Node's labels and ``<prefix>/telemetry`` annotation into the typed
``NodeGpuState`` the scheduler extender and ``omaticaya top`` decide on; ``parse_gpu_readings``
gives each published GPU for display. Neither ever raises on what a Node carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..model.topology import LEVEL_SCORE, GpuTopology, NodeTopology, PairLink
from .gpustate import GpuInfo, NodeGpuState
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
    "MAX_PAIR_NVLINKS",
    "MAX_REFRESH_S",
    "GpuInfo",
    "NodeGpuState",
    "label_bounds",
    "lease_ref",
    "parse_gpu_readings",
    "parse_node",
    "state_from_object",
    "topology_of",
]

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
    mine = _our_labels(labels, prefix)
    raw = json_mapping(annotations).get(f"{prefix}/{TELEMETRY}")
    doc, problem = Telemetry.parse(raw) if raw is not None else (None, None)
    if not mine and doc is None:
        return NodeGpuState(name=name, problem=problem)
    read_at, expires_at, lease = _liveness(doc)
    unit_mib = _share_unit_mib(doc)
    books = _TelemetryBooks.read(doc, unit_mib)
    problem = _problem(problem, doc is not None and read_at is None, books.bad_memory)
    gpus = books.gpus if books.gpus or (doc is not None and doc.gpus_listed) else _label_gpus(mine)
    per_gpu_mib, best_mib, total_mib = label_bounds(mine)
    gpus, free_total, live_total = _whole_totals(gpus, per_gpu_mib, best_mib, total_mib)
    shared = _bounded_shared(books.shared, per_gpu_mib, mine, unit_mib)
    return NodeGpuState(
        name=name, known=True, problem=problem, read_at=read_at, expires_at=expires_at,
        lease=lease, health=json_str(mine.get(HEALTH)) or (doc.health if doc else None),
        gpus=tuple(gpus), free_total_mib=free_total, free_live_total_mib=live_total,
        shared=tuple(shared), share_unit_mib=unit_mib if shared else None, mig=tuple(books.mig),
        holders=frozenset(books.holders), slices_held=tuple(books.slices_held),
        units_attributed=books.attributed, topology=topology_of(doc),
    )  # fmt: skip


#: the most NVLinks one pair can have that a reader believes (NVML_NVLINK_MAX_LINKS)
MAX_PAIR_NVLINKS = 36


def topology_of(doc: Telemetry | None) -> NodeTopology | None:
    """The node's wiring from the telemetry (``links`` and each GPU's ``pci_bus_id``,
    ``numa_node``, ``pcie_root``): what the placement model chooses several GPUs by. ``None``
    when the document has no ``links``. Untrusted: a pair naming an index that is no GPU of the
    document, or itself, is left out; a level NVML does not define reads as unknown; an NVLink
    count below 0 or over ``MAX_PAIR_NVLINKS`` as 0."""
    if doc is None or doc.links is None:
        return None
    gpus = tuple(GpuTopology(g.index, g.uuid, g.pci_bus_id, g.numa_node, g.pcie_root)
                 for g in doc.gpus)  # fmt: skip
    indices = {g.index for g in gpus}
    pairs: dict[tuple[int, int], PairLink] = {}
    for link in doc.links:
        a, b = sorted((link.a, link.b))
        if a == b or a not in indices or b not in indices:
            continue
        level = link.level if link.level in LEVEL_SCORE else None
        n = link.nvlinks if link.nvlinks is not None and 0 <= link.nvlinks <= MAX_PAIR_NVLINKS else 0
        pairs[(a, b)] = PairLink(level, n, link.p2p)
    return NodeTopology(gpus, pairs)


def _our_labels(labels: Mapping[str, str] | None, prefix: str) -> dict[str, str]:
    """Our labels (``<prefix>/...``) without the prefix -> value; a key or value that is not
    text is skipped."""
    p = prefix + "/"
    return {
        k[len(p) :]: v
        for k, v in json_mapping(labels).items()
        if isinstance(k, str) and k.startswith(p) and isinstance(v, str)
    }


def _problem(parsed: str | None, no_read_at: bool, bad_memory: bool) -> str | None:
    """What fails the node: a GPU's unreadable ``memory_free_mib`` (``bad_memory``), else a
    telemetry without a valid ``read_at`` (``no_read_at``), else the parse's own (``parsed``:
    ``Telemetry.parse``'s problem, ``None`` for none)."""
    if bad_memory:
        return "telemetry annotation with a bad memory_free_mib"
    if no_read_at:
        return "telemetry annotation without a valid read_at"
    return parsed


def _liveness(doc: Telemetry | None) -> tuple[float | None, float | None, str | None]:
    """``(read_at, expires_at, lease)`` of the telemetry, epoch seconds and a Lease reference;
    all ``None`` without a valid ``read_at``. ``expires_at`` is ``None`` when not published or
    not within ``[read_at, read_at + MAX_REFRESH_S]``; ``lease`` when not ``lease_ref``'s form."""
    read_at = doc.read_at_s if doc is not None else None
    if doc is None or read_at is None:
        return None, None, None
    expires_at = doc.expires_at_s
    if expires_at is not None and not 0 <= expires_at - read_at <= MAX_REFRESH_S:
        expires_at = None
    return read_at, expires_at, lease_ref(doc.lease)


def _share_unit_mib(doc: Telemetry | None) -> int | None:
    """The telemetry's ``share_unit_mib`` (MiB per memory unit of a shared GPU) when positive,
    else ``None`` (no slice can then be sized)."""
    unit_mib = doc.share_unit_mib if doc is not None else None
    return unit_mib if unit_mib is not None and unit_mib > 0 else None


@dataclass(slots=True)
class _TelemetryBooks:
    """What the telemetry's GPU entries say, gathered in one pass (``read``): whole GPUs
    (``gpus``), shared GPUs (``shared``), MIG devices (``mig``), the holders' names, the slices
    held, whether the shared GPUs' holders are published (``attributed``), and whether a GPU's
    ``memory_free_mib`` was there but unreadable (``bad_memory``)."""

    gpus: list[GpuInfo] = field(default_factory=list)
    shared: list[GpuInfo] = field(default_factory=list)
    mig: list[GpuInfo] = field(default_factory=list)
    holders: set[str] = field(default_factory=set)
    slices_held: list[tuple[str, int, int]] = field(default_factory=list)
    attributed: bool = False
    bad_memory: bool = False

    @classmethod
    def read(cls, doc: Telemetry | None, unit_mib: int | None) -> _TelemetryBooks:
        """The books of ``doc``'s GPUs (empty without a document). Whole GPUs only in ``gpus``:
        a GPU with MIG on is given out as MIG devices (``nvidia.com/mig-<profile>``), never as a
        whole GPU, so its whole-GPU free memory must not make room for a pod; a shared GPU is
        given out in memory units (slices), never whole either."""
        books = cls()
        for g in doc.gpus if doc is not None else ():
            books.holders.update(_holders(g.pods))
            for m in g.mig_devices or ():
                books.holders.update(_holders(m.pods))
                if m.profile and g.mig:
                    books.mig.append(_mig_info(g.index, m))
            if g.mig:
                continue
            if g.memory_free_unreadable:
                books.bad_memory = True
            books._add_gpu(g, unit_mib)
        return books

    def _add_gpu(self, g: GpuTelemetry, unit_mib: int | None) -> None:
        """One GPU without MIG: to ``shared`` (when a unit size is known: without one its
        slices cannot be sized, and it is not given out) or to ``gpus``, ``assigned`` when a
        holder has it (its ``free_mib`` is zeroed later, after the live total)."""
        free = g.memory_free_mib
        assigned = False
        units_left = None
        # the units' book needs the holders: ``pods`` is absent when the agent attributes nothing
        if g.shared and unit_mib is not None and g.share_units is not None and g.pods is not None:
            units_left = self._units_left(g, g.share_units, unit_mib)
        elif not g.shared and g.pods:
            assigned = True
        info = GpuInfo(
            g.index,
            free or 0,
            g.health == "Healthy" and free is not None,
            g.memory_free_min_mib,
            g.memory_total_mib,
            assigned,
            units_left=units_left,
        )
        if not g.shared:
            self.gpus.append(info)
        elif unit_mib is not None:
            self.shared.append(info)

    def _units_left(self, g: GpuTelemetry, share_units: int, unit_mib: int) -> int:
        """A shared GPU's units no holder has (``share_units`` less each holder's
        ``limit_mib`` over ``unit_mib``, a negative limit counted 0); notes its slices held."""
        held = [(k, max(p.limit_mib or 0, 0) // unit_mib)
                for p in g.pods or () for k in _holders((p,))]  # fmt: skip
        self.slices_held.extend((k, g.index, n) for k, n in held if n > 0)
        self.attributed = True
        return share_units - sum(max(p.limit_mib or 0, 0) // unit_mib for p in g.pods or ())


def _whole_totals(
    gpus: list[GpuInfo],
    per_gpu_mib: Mapping[int, int],
    best_mib: int | None,
    total_mib: int | None,
) -> tuple[list[GpuInfo], int, int]:
    """``(gpus, free_total_mib, free_live_total_mib)``: the whole GPUs, each ``free_mib`` at
    most its ``gpu-N.memory.free-mib`` label (``per_gpu_mib``) and the node's
    ``gpu.memory.free-mib`` (``best_mib``), then each assigned one's ``free_mib`` 0 (its live
    value kept as ``assigned_free_mib``); the free MiB over the healthy ones after that and
    before (the live reading), each at most ``gpu.memory.free-total-mib`` (``total_mib``)."""
    gpus = [_capped(g, per_gpu_mib.get(g.index), best_mib) for g in gpus]
    live_total = _at_most(sum(g.free_mib for g in gpus if g.healthy), total_mib)
    gpus = [replace(g, free_mib=0, assigned_free_mib=g.free_mib) if g.assigned else g
            for g in gpus]  # fmt: skip
    return gpus, _at_most(sum(g.free_mib for g in gpus if g.healthy), total_mib), live_total


def _at_most(value_mib: int, bound_mib: int | None) -> int:
    """``value_mib``, at most ``bound_mib`` (taken as 0 when negative) when there is one."""
    return value_mib if bound_mib is None else min(value_mib, max(bound_mib, 0))


def _bounded_shared(
    shared: list[GpuInfo],
    per_gpu_mib: Mapping[int, int],
    mine: Mapping[str, str],
    unit_mib: int | None,
) -> list[GpuInfo]:
    """The shared GPUs, each ``free_mib`` at most its ``gpu-N.memory.free-mib`` label
    (``per_gpu_mib``), and its units bounded by the largest slice one shared GPU can take (our
    label ``gpu.shared.memory.free-mib`` in ``mine``, over ``unit_mib``): ``units_left`` when
    unknown, else ``units_cap`` (its live memory stays the live reading's, capped by its own
    label). A label that is absent or not a whole number bounds nothing."""
    shared = [_capped(g, per_gpu_mib.get(g.index)) for g in shared]
    shared_best_mib = json_int(mine.get(SHARED_MEMORY_FREE))
    if shared_best_mib is None or unit_mib is None:
        return shared
    most = max(shared_best_mib, 0) // unit_mib
    return [replace(g, units_left=most) if g.units_left is None
            else g if g.units_left <= most else replace(g, units_cap=most)
            for g in shared]  # fmt: skip


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
