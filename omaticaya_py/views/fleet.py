"""Nodes -> rows of ``omaticaya top``: pure (no I/O), table-tested in tests/views/test_views.py.

Everything comes from the Node's labels and its telemetry annotation, parsed by
``core.schema`` (``parse_node`` for the node's state and problem, ``parse_gpu_readings`` for
each GPU), and, for a node whose telemetry names a Lease, from that Lease: fresh or stale is
the extender's rule (``core.rules.liveness.node_liveness``). A Node's content is untrusted: nothing
here raises on it; a Node whose telemetry cannot be used (a time ahead of the clock included)
shows ``Invalid`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..core import schema
from ..core.rules.liveness import (
    AHEAD,
    DEFAULT_MAX_CLOCK_SKEW_S,
    STALE,
    LeaseState,
    LivenessClock,
    Seen,
    node_liveness,
)
from .rows import (
    SORTS,
    GpuRow,
    NodeRow,
    SliceRow,
    filter_rows,
    short_uuid,
    sort_rows,
    to_json,
)

__all__ = [
    "GRACE_S",
    "SORTS",
    "TTL_S",
    "GpuRow",
    "SliceRow",
    "LeaseView",
    "NodeRow",
    "RowContext",
    "filter_rows",
    "fleet_rows",
    "node_row",
    "short_uuid",
    "sort_rows",
    "to_json",
]

#: a reading past its ``expires_at`` by more than this is stale (the extender's default grace)
GRACE_S = 60.0
#: for an agent that publishes no ``expires_at``: a ``read_at`` older than this + the grace
TTL_S = 300.0
#: health shown for a Node whose telemetry cannot be used
INVALID = "Invalid"


class LeaseView(Protocol):
    """The agents' Leases as ``node_row`` reads them (``views.leases.TopLeases``)."""

    def watched(self, ref: str) -> bool:
        """Whether Lease ``"<namespace>/<name>"``'s namespace is read (else: judge by read_at)."""
        ...

    def lease(self, ref: str) -> LeaseState | None:
        """The Lease, ``None`` when a read namespace has no such Lease."""
        ...


def _label_gpus(name: str, mine: Mapping[str, str]) -> tuple[GpuRow, ...]:
    per = schema.per_gpu(mine)
    rows = []
    for index in sorted(per):
        got = per[index]
        util = schema.json_int(got.get(schema.names.GPU_UTILIZATION))
        rows.append(
            GpuRow(
                node=name,
                index=index,
                free_mib=schema.json_int(got.get(schema.names.GPU_MEMORY_FREE)),
                util_pct=float(util) if util is not None else None,
                temperature_c=schema.json_int(got.get(schema.names.GPU_TEMPERATURE)),
                health=got.get(schema.names.GPU_HEALTH),
                mig=got.get(schema.names.GPU_MIG_ENABLED) == "true",
            )
        )
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class RowContext:
    """What a Node's row is judged with: ``now``, the wall clock (epoch seconds); ``prefix``,
    the labels' and the telemetry's; ``grace_s`` and ``ttl_s``, the staleness rule's
    (``GRACE_S``, ``TTL_S``); ``leases``, the agents' Leases (``None``: judged by ``read_at``
    alone); ``now_mono``, the monotonic clock of the ``seen`` given with each Node and of the
    Leases' (``None``: no observation used); ``max_skew_s``, how far ahead of ``now`` a
    published time may be, seconds."""

    now: float
    prefix: str = "omaticaya.io"
    grace_s: float = GRACE_S
    ttl_s: float = TTL_S
    leases: LeaseView | None = None
    now_mono: float | None = None
    max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S


def node_row(
    name: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    context: RowContext,
    *,
    seen: Seen | None = None,
) -> NodeRow:
    """The row of one Node, judged as ``context`` says (``seen``: when ``read_at`` was seen to
    take its value, on ``context.now_mono``). Never raises on the Node's content."""
    prefix = context.prefix
    state = schema.parse_node(name, labels, annotations, prefix)
    p = prefix + "/"
    mine = {
        k[len(p) :]: v
        for k, v in schema.json_mapping(labels).items()
        if isinstance(k, str) and k.startswith(p) and isinstance(v, str)
    }
    if not state.known:
        return NodeRow(
            name=name,
            health=INVALID if state.problem else "-",
            known=False,
            problem=state.problem,
        )
    readings = schema.parse_gpu_readings(annotations, prefix)
    gpu_rows = tuple(_gpu_row(name, r) for r in readings) if readings else _label_gpus(name, mine)
    problem, stale, stale_why = _liveness(state, context, seen)
    health = state.health or "Unknown"
    if problem:
        health = INVALID
    count = schema.json_int(mine.get(schema.names.GPU_COUNT))
    healthy = schema.json_int(mine.get(schema.names.HEALTHY_COUNT))
    if count is None and gpu_rows:
        count = len(gpu_rows)
    if healthy is None and gpu_rows:
        healthy = sum(1 for g in gpu_rows if g.health == "Healthy")
    temps = [g.temperature_c for g in gpu_rows if g.temperature_c is not None]
    return NodeRow(
        name=name,
        health=health,
        gpus=count,
        healthy=healthy,
        free_mib=_free_mib(mine, state),
        total_mib=_total_mib(mine, gpu_rows),
        free_total_mib=schema.json_int(mine.get(schema.names.MEMORY_FREE_TOTAL)),
        util_pct=_util_pct(mine, gpu_rows),
        idle=schema.json_int(mine.get(schema.names.IDLE_COUNT)),
        temperature_c=max(temps) if temps else None,
        product=mine.get(schema.names.PRODUCT),
        age_s=context.now - state.read_at if state.read_at is not None else None,
        stale=stale,
        stale_why=stale_why,
        problem=problem,
        gpu_rows=gpu_rows,
    )


def _gpu_row(node: str, r: schema.GpuTelemetry) -> GpuRow:
    """The row of GPU reading ``r`` of Node ``node``."""
    return GpuRow(
        node=node,
        index=r.index,
        uuid=r.uuid,
        free_mib=r.memory_free_mib,
        total_mib=r.memory_total_mib,
        util_pct=r.utilization_pct,
        temperature_c=r.temperature_c,
        health=r.health,
        reasons=r.reasons,
        processes=r.process_count,
        mig=bool(r.mig_enabled),  # None: not known to be MIG
        pods=holders(r),
        out_of_band_mib=r.memory_out_of_band_mib,
        shared=r.shared is True,
        slices=slices(r),
        mps=mps(r),
    )


def _total_mib(mine: Mapping[str, str], gpu_rows: Sequence[GpuRow]) -> int | None:
    """The node's memory per GPU, MiB: its label, else the least of its GPUs'."""
    total = schema.json_int(mine.get(schema.names.MEMORY_TOTAL))
    if total is None:
        totals = [g.total_mib for g in gpu_rows if g.total_mib is not None]
        total = min(totals) if totals else None
    return total


def _free_mib(mine: Mapping[str, str], state: schema.NodeGpuState) -> int | None:
    """The node's free memory, MiB: its label, else the most of a healthy GPU's."""
    free = schema.json_int(mine.get(schema.names.MEMORY_FREE))
    if free is None:
        frees = [g.free_mib for g in state.gpus if g.healthy]
        free = max(frees) if frees else None
    return free


def _util_pct(mine: Mapping[str, str], gpu_rows: Sequence[GpuRow]) -> float | None:
    """The node's utilisation, percent: the mean of its healthy whole GPUs', else its label."""
    healthy_whole = [g for g in gpu_rows if g.health == "Healthy" and not g.mig]
    utils = [g.util_pct for g in healthy_whole if g.util_pct is not None]
    if utils:
        return sum(utils) / len(utils)
    label_util = schema.json_int(mine.get(schema.names.UTILIZATION))
    return float(label_util) if label_util is not None else None


def _liveness(
    state: schema.NodeGpuState, context: RowContext, seen: Seen | None
) -> tuple[str | None, bool, str | None]:
    """``(problem, stale, why stale)`` of a known Node, by ``node_liveness`` (a Lease the
    ``context`` does not read: judged by ``read_at``); a time ahead of the clock is a
    problem."""
    problem = state.problem
    if state.read_at is None or problem:
        return problem, False, None
    leases = context.leases
    lookup = None
    if leases is not None and state.lease is not None and leases.watched(state.lease):
        lookup = leases.lease
    clock = LivenessClock(context.now, context.grace_s, context.now_mono, context.max_skew_s)
    alive = node_liveness(state, clock, ttl_s=context.ttl_s, seen=seen, leases=lookup,
                          prefix=context.prefix)  # fmt: skip
    if alive.kind == AHEAD:
        problem = alive.why
    stale = alive.kind == STALE
    return problem, stale, alive.why if stale else None


def fleet_rows(
    nodes: Iterable[Any],
    context: RowContext,
    *,
    include_unknown: bool = False,
    seen: Callable[[str], Seen | None] | None = None,
) -> list[NodeRow]:
    """Rows of Nodes (anything with ``name``, ``labels``, ``annotations``: ``NodeMeta``), by
    name, judged as ``context`` says; Nodes with no Omaticaya data at all only with
    ``include_unknown``. ``seen``: by Node name, as ``node_row``'s."""
    rows = []
    for node in nodes:
        name = str(getattr(node, "name", "") or "")
        row = node_row(
            name,
            getattr(node, "labels", None),
            getattr(node, "annotations", None),
            context,
            seen=seen(name) if seen is not None else None,
        )
        if row.known or row.problem or include_unknown:
            rows.append(row)
    return sorted(rows, key=lambda r: r.name)


def slices(g: schema.GpuTelemetry) -> tuple[SliceRow, ...]:
    """The slices held on shared GPU ``g`` (holders with a ``limit_mib``), in the telemetry's
    order; ``()`` for a GPU not shared."""
    if g.shared is not True:
        return ()
    return tuple(
        SliceRow(f"{p.namespace}/{p.pod}", p.container, p.limit_mib, p.memory_used_mib,
                 p.over_limit is True)  # fmt: skip
        for p in g.pods or ()
        if p.namespace and p.pod and p.limit_mib is not None
    )


#: the longest ``mps`` value shown (untrusted: any controller can write the annotation)
MAX_MPS_CHARS = 40


def mps(g: schema.GpuTelemetry) -> str | None:
    """Shared GPU ``g``'s MPS enforcement as its telemetry says it (``"up"`` or why not, cut
    to ``MAX_MPS_CHARS``); ``None`` for a GPU not shared or an agent that says nothing."""
    if g.shared is not True or not g.mps:
        return None
    return g.mps[:MAX_MPS_CHARS]


def holders(g: schema.GpuTelemetry) -> tuple[str, ...]:
    """``namespace/pod`` of each container holding GPU ``g`` or one of its MIG devices, once
    each, in the telemetry's order."""
    pods = list(g.pods or ())
    for m in g.mig_devices or ():
        pods.extend(m.pods or ())
    names = (f"{p.namespace}/{p.pod}" for p in pods if p.namespace and p.pod)
    return tuple(dict.fromkeys(names))
