"""Health rules: pure functions from a snapshot (and recent Xid events) to per-GPU health.

A GPU is Unhealthy while any of these holds, and Healthy again as soon as none does:
- its reading failed (``GpuReading.error``: GpuIsLost, Unknown, ...)      reason ``lost`` / ``read-error``
- remapped rows pending (``nvmlDeviceGetRemappedRows``)                  reason ``remap-pending``
- remapped rows failure                                                   reason ``remap-failure``
- uncorrectable volatile ECC count > 0 (a double-bit error since the driver loaded) ``ecc-dbe``
- a fatal Xid (not in the ignore list) within ``xid_quiet_s``             reason ``xid-<N>``
NotSupported fields are ``None`` in the snapshot and never count as faults.

Schedulable units: a GPU without MIG is one unit; a GPU with MIG on is one unit per MIG device
(``MigReading``), each Unhealthy while its parent GPU is (an Xid or ECC fault of the GPU is a
fault of every instance on it) or while it cannot be read itself (``mig-lost`` /
``mig-read-error``). A MIG-enabled GPU with no MIG device, or one that cannot be read (its MIG
devices cannot be listed), has no unit.

The node summary is Healthy (every GPU and unit healthy), Degraded (some units healthy),
Unhealthy (none) or Unknown (NVML could not be read, or it reports no GPU).

Xid events are matched to GPUs by UUID where the event carries one (indices shift when a GPU
disappears between two NVML sessions), else by index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ..model.snapshot import GpuReading, MigReading, NodeSnapshot, XidEvent

__all__ = [
    "GpuHealth",
    "Health",
    "NodeHealth",
    "Unit",
    "XidLedger",
    "XidPolicy",
    "assess",
    "assess_gpu",
    "schedulable_units",
]


class Health(StrEnum):
    """Values of the ``gpu.health`` and ``gpu-N.health`` labels."""

    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Health of one GPU: ``reasons`` is empty when healthy, else short tokens like ``xid-79``.

    ``xid_at_s``: ``(xid, at_s)`` of the latest event of each fatal Xid code in the window, on
    the reader's clock, in code order (the telemetry publishes them as times, so that a
    restarted agent's window runs on from them: ``core.rules.xid_seed``); bookkeeping, not part of
    equality."""

    index: int
    reasons: tuple[str, ...] = ()
    xid_at_s: tuple[tuple[int, float], ...] = field(default=(), compare=False)

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def state(self) -> Health:
        return Health.HEALTHY if not self.reasons else Health.UNHEALTHY


@dataclass(frozen=True, slots=True)
class Unit:
    """A schedulable unit: a whole GPU (``mig_index`` None) or one MIG device of a GPU.

    ``uuid`` is the GPU's (``GPU-...``) or the MIG device's (``MIG-...``); ``profile`` the MIG
    profile (``1g.10gb``), None for a whole GPU. Memory in MiB from ``nvmlDeviceGetMemoryInfo``
    on its handle; ``utilization_pct`` only for a whole GPU (NVML has none per MIG device);
    ``reasons`` empty when healthy (the parent GPU's reasons come first).
    """

    gpu_index: int
    mig_index: int | None = None
    uuid: str | None = None
    profile: str | None = None
    memory_total_mib: int | None = None
    memory_free_mib: int | None = None
    utilization_pct: float | None = None
    process_count: int | None = None
    reasons: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def state(self) -> Health:
        return Health.HEALTHY if not self.reasons else Health.UNHEALTHY

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """Node summary, each GPU's health keyed by GPU index, and the schedulable units."""

    state: Health
    gpus: Mapping[int, GpuHealth]
    units: tuple[Unit, ...] = ()

    @property
    def healthy_indices(self) -> frozenset[int]:
        return frozenset(i for i, g in self.gpus.items() if g.healthy)

    @property
    def healthy_units(self) -> tuple[Unit, ...]:
        return tuple(u for u in self.units if u.healthy)


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """Which Xid codes are fatal and for how long (``quiet_s``, seconds on the reader's clock).

    The default ignore list (13, 31, 43, 45, 68, 109) holds application faults, as NVIDIA's
    device plugin treats them; ``all_fatal`` ignores the list.
    """

    ignore: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
    all_fatal: bool = False
    quiet_s: float = 600.0

    def fatal(self, xid: int) -> bool:
        return self.all_fatal or xid not in self.ignore


class XidLedger:
    """The fatal Xid events of the last ``policy.quiet_s`` seconds, per GPU: the latest event of
    each (GPU, Xid), which is all the health rules need (a GPU is Unhealthy while its latest
    fatal Xid is within the window), so a flood of one Xid costs one entry, not one per event.
    At most ``MAX_ENTRIES`` (GPU, Xid) pairs are kept, the oldest dropped beyond.

    The only state the health rules need; the agent feeds it each snapshot's events and passes
    ``recent(now_s)`` to ``assess``. At start it is seeded (``seed``) with the events the
    Node's own telemetry still names (``core.rules.xid_seed``: NVML does not replay old events);
    ``seeded`` and ``seed_refused`` count the events taken and the GPUs whose entry was refused.
    """

    #: (GPU, Xid) pairs kept at most: 8 GPUs x every Xid code NVIDIA documents, with room
    MAX_ENTRIES = 4096

    def __init__(self, policy: XidPolicy) -> None:
        self.policy = policy
        self._latest: dict[tuple[str | int, int], XidEvent] = {}
        self.seeded = 0
        self.seed_refused = 0

    def _keep(self, events: Iterable[XidEvent]) -> int:
        kept = 0
        for e in events:
            if not self.policy.fatal(e.xid):
                continue
            kept += 1
            key = (e.uuid if e.uuid is not None else e.index, e.xid)
            held = self._latest.get(key)
            if held is None or e.at_s >= held.at_s:
                self._latest[key] = e
        if len(self._latest) > self.MAX_ENTRIES:
            newest = sorted(self._latest.items(), key=lambda kv: kv[1].at_s)[-self.MAX_ENTRIES :]
            self._latest = dict(newest)
        return kept

    def record(self, events: Iterable[XidEvent]) -> None:
        """Keep the fatal ones of a snapshot's ``events`` (the latest per GPU and Xid)."""
        self._keep(events)

    def seed(self, events: Iterable[XidEvent], refused: int = 0) -> None:
        """Add events from an earlier agent's telemetry (the fatal ones), and count ``refused``
        GPU entries."""
        self.seeded += self._keep(events)
        self.seed_refused += refused

    def recent(self, now_s: float) -> tuple[XidEvent, ...]:
        """The kept events newer than ``now_s - policy.quiet_s``, oldest first."""
        horizon = now_s - self.policy.quiet_s
        self._latest = {k: e for k, e in self._latest.items() if e.at_s > horizon}
        return tuple(sorted(self._latest.values(), key=lambda e: e.at_s))

    def reset(self) -> None:
        self._latest.clear()


def assess_gpu(
    gpu: GpuReading, fatal_xids: Iterable[int] = (), xid_at_s: Iterable[tuple[int, float]] = ()
) -> GpuHealth:
    """Health of one GPU from its reading and the fatal Xids seen on it within the window
    (``xid_at_s``: each event's ``(xid, at_s)``, kept as the latest per code)."""
    reasons: list[str] = []
    if gpu.error is not None:
        reasons.append("lost" if gpu.error.endswith("GpuIsLost") else "read-error")
    if gpu.remapped_rows_pending:
        reasons.append("remap-pending")
    if gpu.remapped_rows_failure:
        reasons.append("remap-failure")
    if (gpu.ecc_uncorrected_volatile or 0) > 0:
        reasons.append("ecc-dbe")
    reasons.extend(f"xid-{x}" for x in sorted(set(fatal_xids)))
    latest: dict[int, float] = {}
    for code, at_s in xid_at_s:
        latest[code] = max(at_s, latest.get(code, at_s))
    return GpuHealth(
        index=gpu.index, reasons=tuple(reasons), xid_at_s=tuple(sorted(latest.items()))
    )


def _mig_reasons(mig: MigReading) -> tuple[str, ...]:
    if mig.error is None:
        return ()
    return ("mig-lost",) if mig.error.endswith("GpuIsLost") else ("mig-read-error",)


def schedulable_units(
    snapshot: NodeSnapshot, gpus: Mapping[int, GpuHealth]
) -> tuple[Unit, ...]:
    """The units a pod can be given, in GPU then MIG slot order (see the module docstring).

    ``gpus`` is each GPU's health by index (``assess``'s ``NodeHealth.gpus``)."""
    out: list[Unit] = []
    for g in snapshot.gpus:
        parent = gpus[g.index].reasons
        if g.mig_enabled:
            if g.error is not None:
                continue  # its MIG devices cannot be listed: none is schedulable
            out.extend(
                Unit(
                    gpu_index=g.index,
                    mig_index=m.index,
                    uuid=m.uuid,
                    profile=m.profile,
                    memory_total_mib=m.memory_total_mib,
                    memory_free_mib=m.memory_free_mib,
                    process_count=m.process_count,
                    reasons=parent + _mig_reasons(m),
                )
                for m in g.mig_devices
            )
            continue
        out.append(
            Unit(
                gpu_index=g.index,
                uuid=g.uuid,
                memory_total_mib=g.memory_total_mib,
                memory_free_mib=g.memory_free_mib,
                utilization_pct=g.utilization_pct,
                process_count=g.process_count,
                reasons=parent,
            )
        )
    return tuple(out)


def assess(
    snapshot: NodeSnapshot,
    recent_xids: Iterable[XidEvent] = (),
    policy: XidPolicy | None = None,
) -> NodeHealth:
    """Health of every GPU and of the node.

    ``recent_xids`` are Xid events within the quiet window (``XidLedger.recent``); those not
    fatal under ``policy`` are skipped, so raw events may be passed too.
    """
    policy = policy or XidPolicy()
    index_of = {g.uuid: g.index for g in snapshot.gpus if g.uuid}
    by_gpu: dict[int, list[XidEvent]] = {}
    for event in recent_xids:
        if policy.fatal(event.xid) and snapshot.clock_s - event.at_s < policy.quiet_s:
            index = index_of.get(event.uuid, -1) if event.uuid is not None else event.index
            by_gpu.setdefault(index, []).append(event)
    gpus = {
        g.index: assess_gpu(
            g,
            [e.xid for e in by_gpu.get(g.index, ())],
            [(e.xid, e.at_s) for e in by_gpu.get(g.index, ())],
        )
        for g in snapshot.gpus
    }
    units = schedulable_units(snapshot, gpus)
    if snapshot.error is not None or not gpus:
        state = Health.UNKNOWN
    else:
        # every GPU counts (a faulty GPU with MIG devices is not "Healthy" for having them)
        # and every unit counts (one MIG device unreadable on a healthy GPU)
        parts = [g.healthy for g in gpus.values()] + [u.healthy for u in units if u.is_mig]
        healthy_units = sum(1 for u in units if u.healthy)
        if all(parts):
            state = Health.HEALTHY
        elif healthy_units == 0:
            state = Health.UNHEALTHY
        else:
            state = Health.DEGRADED
    return NodeHealth(state=state, gpus=gpus, units=units)
