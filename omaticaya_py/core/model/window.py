"""The peak signal: per GPU, the least free memory and the p95 utilisation over a window.

Free memory that dips every few minutes is not free: a pod placed on it in a quiet second meets
the next peak. The agent adds every reading of each whole GPU to a ``PeakWindow`` (keyed by
UUID, timed by the reader's clock) and publishes, in the telemetry annotation, the minimum free
memory and the 95th-percentile utilisation over the last ``window_s`` seconds, once the samples
cover at least half the window (before that a summary would be a guess). Pure, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .snapshot import NodeSnapshot

__all__ = ["PeakWindow", "WindowSummary", "p95"]


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One GPU over the window: ``memory_free_min_mib`` (the least free memory read, MiB;
    ``None`` if no reading had it), ``utilization_p95_pct`` (nearest-rank 95th percentile of
    the utilisation readings, %; ``None`` if none), ``covered_s`` (seconds from the oldest
    sample kept to the newest)."""

    memory_free_min_mib: int | None
    utilization_p95_pct: float | None
    covered_s: float


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile of ``values`` (not empty): the smallest value with at
    least 95 % of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class PeakWindow:
    """Samples of each GPU over the last ``window_s`` seconds (``window_s`` > 0).

    ``add(snapshot)`` keeps each readable whole GPU's free memory and utilisation at
    ``snapshot.clock_s``; ``summary(key)`` gives its ``WindowSummary``, or ``None`` while the
    samples cover less than half the window. A GPU is keyed by UUID (``gpu-<index>`` when NVML
    gave none); one not seen in a snapshot keeps its samples until they age out. A clock that
    goes back (a trace replayed from the start) starts every window afresh."""

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._samples: dict[str, deque[tuple[float, int | None, float | None]]] = {}
        self._now_s: float | None = None

    @staticmethod
    def key(index: int, uuid: str | None) -> str:
        """The key of a GPU: its UUID, or ``gpu-<index>``."""
        return uuid or f"gpu-{index}"

    def add(self, snapshot: NodeSnapshot) -> None:
        """Record each GPU of ``snapshot`` that was read (no error, MIG off) at its clock."""
        now_s = snapshot.clock_s
        if self._now_s is not None and now_s < self._now_s:
            self._samples.clear()
        self._now_s = now_s
        for g in snapshot.gpus:
            if g.error is not None or g.mig_enabled:
                continue
            if g.memory_free_mib is None and g.utilization_pct is None:
                continue
            samples = self._samples.setdefault(self.key(g.index, g.uuid), deque())
            samples.append((now_s, g.memory_free_mib, g.utilization_pct))
        horizon_s = now_s - self.window_s
        for key in list(self._samples):
            samples = self._samples[key]
            while samples and samples[0][0] < horizon_s:
                samples.popleft()
            if not samples:
                del self._samples[key]

    def summary(self, key: str) -> WindowSummary | None:
        """The window of GPU ``key``, or ``None`` when it covers under half of ``window_s``."""
        samples = self._samples.get(key)
        if not samples or self._now_s is None:
            return None
        covered_s = self._now_s - samples[0][0]
        if covered_s < self.window_s / 2:
            return None
        free = [f for _, f, _ in samples if f is not None]
        util = [u for _, _, u in samples if u is not None]
        return WindowSummary(
            memory_free_min_mib=min(free) if free else None,
            utilization_p95_pct=round(p95(util), 1) if util else None,
            covered_s=covered_s,
        )
