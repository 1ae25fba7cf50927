"""The rows of ``omaticaya top`` (one per node, and per GPU), and what is done with them once
made: sorted, filtered, as JSON. Pure; ``fleet`` makes them from the Nodes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "SORTS", "GpuRow", "NodeRow", "SliceRow", "filter_rows", "short_uuid", "sort_rows", "to_json",
]

#: ``--sort`` keys
SORTS = ("name", "free", "util", "age")


@dataclass(frozen=True, slots=True)
class SliceRow:
    """A container's slice of a shared GPU, from the telemetry: ``pod`` (``namespace/pod``),
    its limit and the memory its own processes hold (MiB; ``None``: not known), ``over``
    while it holds more than its slice."""

    pod: str
    container: str | None
    limit_mib: int
    used_mib: int | None = None
    over: bool = False


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU of a node (``--gpus``): from the telemetry, else the ``gpu-N.*`` labels."""

    node: str
    index: int
    uuid: str | None = None
    free_mib: int | None = None
    total_mib: int | None = None
    util_pct: float | None = None
    temperature_c: int | None = None
    health: str | None = None
    reasons: tuple[str, ...] = ()
    processes: int | None = None
    mig: bool = False
    #: ``namespace/pod`` of each container holding the GPU (its MIG devices), from the telemetry
    pods: tuple[str, ...] = ()
    #: memory of processes in no pod, MiB (``None``: not known)
    out_of_band_mib: int | None = None
    #: served as memory units (``OMATICAYA_SHARED_GPUS``), and the slices held on it
    shared: bool = False
    slices: tuple[SliceRow, ...] = ()
    #: a shared GPU's enforcement by CUDA MPS, from the telemetry's ``mps``: ``"up"`` (each
    #: slice capped at its limit) or the reason it is not (``mps-daemon-down``, ...);
    #: ``None``: not shared, or not said (enforcement off, an agent before issue 39)
    mps: str | None = None

    @property
    def enforced(self) -> bool:
        """A shared GPU whose slices MPS caps now (its daemon up)."""
        return self.shared and self.mps == "up"


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node of ``omaticaya top``.

    ``health``: the ``gpu.health`` label (``Invalid`` when the telemetry cannot be used, ``-``
    with no Omaticaya data); ``free_mib``: the most free memory on one healthy unit
    (``gpu.memory.free-mib``, else the freest healthy GPU of the telemetry); ``util_pct``: the
    mean utilisation of the healthy whole GPUs in the telemetry, else ``gpu.utilization-pct``;
    ``age_s``: seconds since ``read_at``; ``stale``: the agent is not reporting, by the
    extender's rule (``core.rules.liveness.node_liveness``: its Lease when the telemetry names one and
    the Leases are read, else ``expires_at`` + the grace, or the TTL + the grace), ``stale_why``
    saying why."""

    name: str
    health: str
    gpus: int | None = None
    healthy: int | None = None
    free_mib: int | None = None
    total_mib: int | None = None
    free_total_mib: int | None = None
    util_pct: float | None = None
    idle: int | None = None
    temperature_c: int | None = None
    product: str | None = None
    age_s: float | None = None
    stale: bool = False
    stale_why: str | None = None
    known: bool = True
    problem: str | None = None
    gpu_rows: tuple[GpuRow, ...] = field(default=())

    @property
    def unhealthy(self) -> bool:
        """Anything short of every GPU healthy with usable data."""
        return (
            self.health != "Healthy"
            or self.problem is not None
            or any(g.health not in (None, "Healthy") for g in self.gpu_rows)
        )


def short_uuid(uuid: str | None) -> str | None:
    """``GPU-178dd196-7fda-...`` -> ``178dd196`` (``nvidia-smi -L``'s first group)."""
    if not uuid:
        return None
    body = uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid
    return body.split("-", 1)[0][:8] or None


def _missing_last(value: float | None, descending: bool) -> tuple[int, float]:
    if value is None:
        return (1, 0.0)
    return (0, -value if descending else value)


def sort_rows(rows: Iterable[NodeRow], by: str = "name") -> list[NodeRow]:
    """``name`` A-Z; ``free``: most free memory on one GPU first; ``util``: busiest first;
    ``age``: oldest reading first. Missing values last, ties by name."""
    if by not in SORTS:
        raise ValueError(f"sort by one of {', '.join(SORTS)}, not {by!r}")
    ordered = sorted(rows, key=lambda r: r.name)
    if by == "free":
        return sorted(ordered, key=lambda r: _missing_last(r.free_mib, True))
    if by == "util":
        return sorted(ordered, key=lambda r: _missing_last(r.util_pct, True))
    if by == "age":
        return sorted(ordered, key=lambda r: _missing_last(r.age_s, True))
    return ordered


def filter_rows(
    rows: Iterable[NodeRow], *, unhealthy: bool = False, stale: bool = False
) -> list[NodeRow]:
    """``unhealthy``: nodes not all Healthy (or with unusable telemetry); ``stale``: nodes whose
    reading is stale. Both: either."""
    if not unhealthy and not stale:
        return list(rows)
    return [r for r in rows if (unhealthy and r.unhealthy) or (stale and r.stale)]


def to_json(rows: Iterable[NodeRow]) -> dict[str, Any]:
    """``{"nodes": [...]}``: each row's fields (``gpus`` holding the per-GPU rows, each with
    its ``uuid_short`` and ``enforced``: a shared GPU whose MPS daemon is up)."""
    out = []
    for row in rows:
        doc = asdict(row)
        doc["gpu_count"] = doc.pop("gpus")
        doc["gpus"] = [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "node"}
            for g in doc.pop("gpu_rows")
        ]
        for g, r in zip(doc["gpus"], row.gpu_rows, strict=True):
            g["uuid_short"] = short_uuid(r.uuid)
            g["enforced"] = r.enforced
        doc["unhealthy"] = row.unhealthy
        if doc["age_s"] is not None:
            doc["age_s"] = round(doc["age_s"], 1)
        if doc["util_pct"] is not None:
            doc["util_pct"] = round(doc["util_pct"], 1)
        out.append(doc)
    return {"nodes": out}
