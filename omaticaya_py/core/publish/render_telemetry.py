"""Render the telemetry annotation: a snapshot and its health -> the ``Telemetry`` model.

Pure functions, no I/O. The model and its JSON form are defined once, in
``core.schema.telemetry``; this is the writer's side, called by ``core.publish.render.render`` and by
the agent for a patch that carries the annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ... import __version__
from ..allocation.slice_enforcement import mps_status
from ..allocation.slice_use import gpu_slices
from ..model.labelvalues import MAX_ANNOTATIONS_BYTES, is_valid_key
from ..model.sharing import Sharing, is_shared, unit_count
from ..model.snapshot import GpuReading, NodeSnapshot
from ..model.topology import NodeTopology
from ..model.window import PeakWindow
from ..rules.attribution import (
    ContainerDevices,
    GpuAttribution,
    gpu_out_of_band_mib,
    holder_memory_mib,
    out_of_band_mib,
)
from ..rules.health import NodeHealth, Unit
from ..schema import (
    TELEMETRY,
    TELEMETRY_VERSION,
    GpuTelemetry,
    MigTelemetry,
    PodTelemetry,
    Telemetry,
)
from ..schema.telemetry import LinkTelemetry, XidTelemetry
from .budget import UnitMark

__all__ = [
    "TelemetryOptions",
    "UnitKey",
    "published_marks",
    "telemetry",
    "telemetry_annotation",
    "telemetry_document",
    "telemetry_marks",
]

#: a unit of the telemetry: ``(GPU index, MIG device index)``, ``-1`` for the GPU itself
UnitKey = tuple[int, int]


@dataclass(frozen=True, slots=True)
class TelemetryOptions:
    """What the telemetry carries besides the reading and its health.

    - ``lease`` (``"namespace/name"``): the ``coordination.k8s.io`` Lease that carries the
      agent's liveness (then no ``refresh_s``: the document is rewritten only with a label
      change); ``refresh_s``: the publisher's promise to rewrite it within that many seconds
      of ``read_at`` (published with ``expires_at``).
    - ``window``: the peak signal per GPU (``core.model.window``), published with its
      ``window_s``.
    - ``attribution``: who uses each GPU or MIG device, by UUID (``core.rules.attribution``;
      ``None``: not attributed, the keys are absent).
    - ``sharing``: the GPUs served as memory units (``core.model.sharing``): each such GPU
      without MIG is ``shared`` with its ``share_units``, its holders carry their slice
      (``limit_mib``), their own use and ``over_limit``, and the document its
      ``share_unit_mib``.
    - ``mps``: each shared GPU's enforcement by CUDA MPS, by UUID (``"up"`` or the reason it
      is not: the agent's ``MpsWatch`` at render time; ``None``: enforcement off, no GPU has
      the field; ``core.allocation.slice_enforcement.mps_status``).
    """

    refresh_s: float | None = None
    lease: str | None = None
    window: PeakWindow | None = None
    attribution: Mapping[str, GpuAttribution] | None = None
    sharing: Sharing | None = None
    mps: Mapping[str, str] | None = None


def telemetry_document(
    snapshot: NodeSnapshot, health: NodeHealth, options: TelemetryOptions | None = None
) -> Telemetry:
    """The telemetry model (``core.schema.telemetry``) of a snapshot and its health, with
    ``options`` (``TelemetryOptions``; ``None``: none). Utilisation, the GPM percentages
    (``sm_active_pct``, ``tensor_active_pct``, ``dram_bw_pct``: absent without GPM) and power
    are rounded to 0.1."""
    o = options or TelemetryOptions()
    mig_units = {(u.gpu_index, u.mig_index): u for u in health.units if u.is_mig}
    topology = snapshot.topology
    islands = topology.islands() if topology is not None else {}
    gpus = tuple(_placed(_gpu(snapshot, g, health, mig_units, o), topology, islands)
                 for g in snapshot.gpus)  # fmt: skip
    any_shared = any(is_shared(g, o.sharing) for g in snapshot.gpus)
    refresh_s = o.refresh_s
    return Telemetry(
        version=TELEMETRY_VERSION,
        agent=__version__,
        read_at=_rfc3339(snapshot.read_at),
        source=snapshot.source,
        health=str(health.state),
        driver=snapshot.driver_version,
        cuda=".".join(map(str, snapshot.cuda_driver_version))
        if snapshot.cuda_driver_version
        else None,
        gpus=gpus,
        error=snapshot.error,
        lease=o.lease,
        refresh_s=refresh_s,
        expires_at=None
        if refresh_s is None
        else _rfc3339(snapshot.read_at + timedelta(seconds=refresh_s)),
        window_s=o.window.window_s if o.window is not None else None,
        share_unit_mib=o.sharing.unit_mib if any_shared and o.sharing is not None else None,
        links=_links(snapshot.topology),
    )


def _placed(entry: GpuTelemetry, topology: NodeTopology | None,
            islands: Mapping[int, str]) -> GpuTelemetry:  # fmt: skip
    """``entry`` with its GPU's topology facts (``GpuTopology``: PCI address, NUMA node, PCIe
    root; its NVLink island from ``islands``), when the topology knows that GPU."""
    g = topology.gpu(entry.index) if topology is not None else None
    if g is None:
        return entry
    island = islands.get(entry.index)
    return entry.model_copy(update={"pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node,
                                    "pcie_root": g.pcie_root, "nvlink_island": island})  # fmt: skip


def _links(topology: NodeTopology | None) -> tuple[LinkTelemetry, ...] | None:
    """Each pair of the topology (lower index first); ``None`` without one."""
    if topology is None:
        return None
    return tuple(LinkTelemetry(a=a, b=b, level=link.level, nvlinks=link.nvlinks, p2p=link.p2p)
                 for (a, b), link in sorted(topology.pairs.items()))  # fmt: skip


def _migs(
    g: GpuReading, mig_units: Mapping[tuple[int, int | None], Unit], o: TelemetryOptions
) -> tuple[MigTelemetry, ...] | None:
    """The MIG devices of ``g`` (``None``: MIG off)."""
    if not g.mig_enabled:
        return None
    return tuple(
        MigTelemetry(
            index=m.index,
            uuid=m.uuid,
            profile=m.profile,
            gpu_instance_id=m.gpu_instance_id,
            memory_total_mib=m.memory_total_mib,
            memory_free_mib=m.memory_free_mib,
            memory_used_mib=m.memory_used_mib,
            process_count=m.process_count,
            health=str(mig_units[(g.index, m.index)].state),
            reasons=mig_units[(g.index, m.index)].reasons,
            error=m.error or None,
            **_users(o.attribution, m.uuid),
        )
        for m in g.mig_devices
    )


def _gpu(
    snapshot: NodeSnapshot, g: GpuReading, health: NodeHealth,
    mig_units: Mapping[tuple[int, int | None], Unit], o: TelemetryOptions,
) -> GpuTelemetry:  # fmt: skip
    """One GPU's entry of the telemetry."""
    gh = health.gpus[g.index]
    shared = is_shared(g, o.sharing)
    unit_mib = o.sharing.unit_mib if o.sharing is not None else 0
    window = o.window
    peak = window.summary(window.key(g.index, g.uuid)) if window is not None else None
    migs = _migs(g, mig_units, o)
    return GpuTelemetry(
        index=g.index,
        uuid=g.uuid,
        product=g.product,
        memory_total_mib=g.memory_total_mib,
        memory_free_mib=g.memory_free_mib,
        memory_used_mib=g.memory_used_mib,
        utilization_pct=_pct(g.utilization_pct),
        sm_active_pct=_pct(g.sm_active_pct),
        tensor_active_pct=_pct(g.tensor_active_pct),
        dram_bw_pct=_pct(g.dram_bw_pct),
        temperature_c=g.temperature_c,
        power_w=None if g.power_w is None else round(g.power_w, 1),
        ecc_uncorrected_volatile=g.ecc_uncorrected_volatile,
        ecc_corrected_volatile=g.ecc_corrected_volatile,
        remapped_rows_pending=g.remapped_rows_pending,
        remapped_rows_failure=g.remapped_rows_failure,
        process_count=g.process_count,
        health=str(gh.state),
        reasons=gh.reasons,
        error=g.error or None,
        mig_enabled=True if g.mig_enabled else None,
        mig_devices=migs,
        **(
            _mig_users(g, o.attribution) if migs is not None
            else _users(o.attribution, g.uuid, unit_mib if shared else None)
        ),
        shared=True if shared else None,
        share_units=unit_count(g.memory_total_mib, unit_mib) if shared else None,
        mps=mps_status(g, shared, o.mps),
        memory_free_min_mib=peak.memory_free_min_mib if peak else None,
        utilization_p95_pct=peak.utilization_p95_pct if peak else None,
        xids=_xids(snapshot, gh.xid_at_s),
    )


def _pct(value: float | None) -> float | None:
    """A percentage as the annotation carries it: rounded to 0.1; ``None`` stays absent."""
    return None if value is None else round(value, 1)


def _users(
    attribution: Mapping[str, GpuAttribution] | None, uuid: str | None, unit_mib: int | None = None
) -> dict[str, Any]:
    """``pods`` and ``memory_out_of_band_mib`` of one device (nothing when not attributed);
    ``unit_mib`` for a shared GPU: each holder's slice, own use and over-use."""
    if attribution is None or not uuid or (att := attribution.get(uuid)) is None:
        return {}
    memory = holder_memory_mib(att) if unit_mib is None else None
    slices = {s.key: s for s in gpu_slices(att, uuid, unit_mib)} if unit_mib else {}
    pods = []
    for h in att.holders:
        s = slices.get((h.namespace, h.pod, h.container))
        pods.append(
            PodTelemetry(
                namespace=h.namespace, pod=h.pod, container=h.container,
                memory_used_mib=memory if s is None else s.used_mib,
                limit_mib=None if s is None else s.limit_mib,
                over_limit=True if s is not None and s.over else None,
            )
        )
    return {
        "pods": tuple(pods),
        "memory_out_of_band_mib": out_of_band_mib(att),
    }


def _mig_users(g: GpuReading, attribution: Mapping[str, GpuAttribution] | None) -> dict[str, Any]:
    """A MIG GPU's out-of-band memory: the sum over its MIG devices (when attributed)."""
    oob = gpu_out_of_band_mib(g, attribution) if attribution is not None else None
    return {"memory_out_of_band_mib": oob} if oob is not None else {}


def _xids(
    snapshot: NodeSnapshot, xid_at_s: tuple[tuple[int, float], ...]
) -> tuple[XidTelemetry, ...] | None:
    """Each fatal Xid's latest event as a wall-clock time: ``read_at`` less how long before
    the read it came (on the reader's clock); ``None`` when there is none."""
    if not xid_at_s:
        return None
    return tuple(
        XidTelemetry(
            xid=code,
            at=_rfc3339(snapshot.read_at - timedelta(seconds=snapshot.clock_s - at_s), "milliseconds"),
        )
        for code, at_s in xid_at_s
    )


def _rfc3339(stamp: datetime, timespec: str = "seconds") -> str:
    return stamp.astimezone(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def telemetry(snapshot: NodeSnapshot, health: NodeHealth, **options: Any) -> str:
    """The telemetry annotation's value: ``telemetry_document`` of ``snapshot`` and ``health``
    with ``TelemetryOptions(**options)``, as compact JSON with sorted keys (the shape is in
    ``core.schema.telemetry``)."""
    return telemetry_document(snapshot, health, TelemetryOptions(**options)).to_json()


def telemetry_annotation(
    snapshot: NodeSnapshot, health: NodeHealth, prefix: str, **options: Any
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``({"<prefix>/telemetry": json}, [])``, or ``({}, [(key, start of value)])`` when the key is
    invalid or the JSON too large for the Node's annotations (256 KiB). ``options``: the fields
    of ``TelemetryOptions``."""
    key = f"{prefix}/{TELEMETRY}"
    value = telemetry(snapshot, health, **options)
    if is_valid_key(key) and len(value) < MAX_ANNOTATIONS_BYTES:
        return {key: value}, []
    return {}, [(key, value[:80])]


def _holders(
    attribution: Mapping[str, GpuAttribution] | None, uuid: str | None
) -> frozenset[tuple[str, str, str]]:
    """The ``(namespace, pod, container)`` holding one device, as ``_users`` publishes them."""
    if attribution is None or not uuid or (att := attribution.get(uuid)) is None:
        return frozenset()
    return frozenset(_holder(h) for h in att.holders)


def _holder(h: ContainerDevices | PodTelemetry) -> tuple[str, str, str]:
    return (h.namespace or "", h.pod or "", h.container or "")


def telemetry_marks(
    snapshot: NodeSnapshot,
    attribution: Mapping[str, GpuAttribution] | None = None,
    sharing: Sharing | None = None,
    mps: Mapping[str, str] | None = None,
) -> dict[UnitKey, UnitMark]:
    """What the telemetry of ``snapshot`` (with ``attribution``, ``sharing`` and ``mps``) would
    say of each GPU and MIG device that no label shows (``core.publish.budget.telemetry_change``): exact
    free memory, holders, the holders over their slice and a shared GPU's MPS enforcement,
    keyed ``(gpu index, mig index or -1)``.
    Equal to ``published_marks`` of that telemetry, parsed, without building or encoding it (a
    quiet tick encodes no JSON)."""
    out: dict[UnitKey, UnitMark] = {}
    for g in snapshot.gpus:
        if g.mig_enabled:
            out[(g.index, -1)] = UnitMark(g.memory_free_mib)
            for m in g.mig_devices:
                out[(g.index, m.index)] = UnitMark(m.memory_free_mib, _holders(attribution, m.uuid))
        else:
            over = frozenset(
                s.key
                for s in gpu_slices((attribution or {}).get(g.uuid or ""), g.uuid, sharing.unit_mib)
                if s.over
            ) if is_shared(g, sharing) and sharing is not None else frozenset()
            out[(g.index, -1)] = UnitMark(
                g.memory_free_mib, _holders(attribution, g.uuid), over,
                mps_status(g, is_shared(g, sharing), mps),
            )
    return out


def published_marks(doc: Telemetry) -> dict[UnitKey, UnitMark]:
    """``telemetry_marks`` as read back from a telemetry document (the one on the Node;
    untrusted: the first entry of an index wins, like ``parse_gpu_readings``)."""
    out: dict[UnitKey, UnitMark] = {}
    for g in doc.gpus:
        out.setdefault(
            (g.index, -1),
            UnitMark(
                g.memory_free_mib,
                frozenset(_holder(h) for h in g.pods or ()),
                frozenset(_holder(h) for h in g.pods or () if h.over_limit),
                g.mps,
            ),
        )
        for m in g.mig_devices or ():
            out.setdefault(
                (g.index, m.index),
                UnitMark(m.memory_free_mib, frozenset(_holder(h) for h in m.pods or ())),
            )
    return out
