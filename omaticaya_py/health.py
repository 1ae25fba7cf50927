"""Health rules: pure functions from a snapshot (and recent Xid events) to per-GPU health.

A GPU is Unhealthy while any of these holds, and Healthy again as soon as none does:
- its reading failed (``GpuReading.error``: GpuIsLost, Unknown, ...)      reason ``lost`` / ``read-error``
- remapped rows pending (``nvmlDeviceGetRemappedRows``)                  reason ``remap-pending``
- remapped rows failure                                                   reason ``remap-failure``
- uncorrectable volatile ECC count > 0 (a double-bit error since the driver loaded) ``ecc-dbe``
- a fatal Xid (not in the ignore list) within ``xid_quiet_s``             reason ``xid-<N>``
NotSupported fields are ``None`` in the snapshot and never count as faults.

The node summary is Healthy (all GPUs healthy), Degraded (some), Unhealthy (none) or Unknown
(NVML could not be read, or it reports no GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from .snapshot import GpuReading, NodeSnapshot, XidEvent

__all__ = ["Health", "GpuHealth", "NodeHealth", "XidPolicy", "XidLedger", "assess", "assess_gpu"]


class Health(StrEnum):
    """Values of the ``gpu.health`` and ``gpu-N.health`` labels."""

    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Health of one GPU: ``reasons`` is empty when healthy, else short tokens like ``xid-79``."""

    index: int
    reasons: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def state(self) -> Health:
        return Health.HEALTHY if not self.reasons else Health.UNHEALTHY


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """Node summary plus each GPU's health, keyed by GPU index."""

    state: Health
    gpus: Mapping[int, GpuHealth]

    @property
    def healthy_indices(self) -> frozenset[int]:
        return frozenset(i for i, g in self.gpus.items() if g.healthy)


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
    """The fatal Xid events of the last ``policy.quiet_s`` seconds, per GPU.

    The only state the health rules need; the agent feeds it each snapshot's events and passes
    ``recent(now_s)`` to ``assess``.
    """

    def __init__(self, policy: XidPolicy) -> None:
        self.policy = policy
        self._events: list[XidEvent] = []

    def record(self, events: Iterable[XidEvent]) -> None:
        self._events.extend(e for e in events if self.policy.fatal(e.xid))

    def recent(self, now_s: float) -> tuple[XidEvent, ...]:
        horizon = now_s - self.policy.quiet_s
        self._events = [e for e in self._events if e.at_s > horizon]
        return tuple(self._events)

    def reset(self) -> None:
        self._events.clear()


def assess_gpu(gpu: GpuReading, fatal_xids: Iterable[int] = ()) -> GpuHealth:
    """Health of one GPU from its reading and the fatal Xids seen on it within the window."""
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
    return GpuHealth(index=gpu.index, reasons=tuple(reasons))


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
    by_gpu: dict[int, list[int]] = {}
    for event in recent_xids:
        if policy.fatal(event.xid) and snapshot.clock_s - event.at_s < policy.quiet_s:
            by_gpu.setdefault(event.index, []).append(event.xid)
    gpus = {g.index: assess_gpu(g, by_gpu.get(g.index, ())) for g in snapshot.gpus}
    if snapshot.error is not None or not gpus:
        state = Health.UNKNOWN
    else:
        healthy = sum(1 for g in gpus.values() if g.healthy)
        if healthy == len(gpus):
            state = Health.HEALTHY
        elif healthy == 0:
            state = Health.UNHEALTHY
        else:
            state = Health.DEGRADED
    return NodeHealth(state=state, gpus=gpus)
