"""The agent's shared state: the last tick's result and the counters ``/metrics`` reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import Histogram

from ..core.attribution import GpuAttribution
from ..core.health import NodeHealth
from ..core.patch import MergePatch
from ..core.render import Desired
from ..core.snapshot import NodeSnapshot

__all__ = ["SnapshotCache", "TickResult"]


@dataclass(frozen=True)
class TickResult:
    """What one tick saw and did: ``patch`` is the merge patch computed (``None``: nothing
    changed), ``sent`` whether it reached the API server; ``attribution``: who uses each GPU
    or MIG device, by UUID (empty when not attributed)."""

    snapshot: NodeSnapshot
    health: NodeHealth
    desired: Desired
    patch: MergePatch | None
    sent: bool
    attribution: Mapping[str, GpuAttribution] = field(default_factory=dict)


class SnapshotCache:
    """The last tick's results and the times of the last good read and patch.

    Written by the tick thread, read by ``/metrics`` and the probes; each attribute is replaced
    whole, so readers never see a half-written value. Times are ``time.monotonic()`` seconds,
    except ``last_patch_wall_s`` (Unix time).
    """

    def __init__(self) -> None:
        self.last: TickResult | None = None
        self.last_read_ok_s: float | None = None
        self.last_api_ok_s: float | None = None
        self.last_patch_wall_s: float | None = None
        self.patches_sent = 0
        self.patches_held = 0  # ticks whose patch the write budget held back
        self.lease_renewals = 0
        self.lease_failures = 0
        self.lease_fallbacks = 0  # 403 on the Lease: heartbeat back on the Node annotation
        self.labels_changed = 0
        self.ticks = 0
        self.tick_errors = 0
        self.tick_seconds = Histogram(
            "omaticaya_tick_duration_seconds",
            "Wall time of one tick: read, render, diff and patch.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=None,
        )

    def store(self, result: TickResult, now_s: float) -> None:
        """Keep ``result`` as the last one; a reading without a library error counts as a
        good read at ``now_s``."""
        self.last = result
        if result.snapshot.error is None:
            self.last_read_ok_s = now_s
