"""Pure in-flight rules: pods placed on a node whose memory the node's telemetry does not show yet.

Live labels lag reality by up to one agent interval: ten pods bound in the same second all see
the same free memory. The extender keeps every pod placed through it (``Placement``) until the
node's reading shows it, and subtracts the pending ones from the node's GPUs before it filters
and scores (``adjust``), as Koordinator's assign cache does for CPU.

A placement stops counting (``pending`` leaves it out) when

- ``settle_s`` seconds have passed since it was placed (``placed_at``: the pod's PodScheduled
  transition, which survives an extender restart), or
- the node's telemetry was read after the pod started (``started_at``: the pod's
  ``status.startTime``) and the node's free memory, against what it was when the extender
  learned of the placement (``baseline_free_mib``), dropped by at least this placement's need
  plus that of every earlier placement on the node that started before the reading too (the
  rule is conservative: a placement whose memory cannot be told apart waits for ``settle_s``).

A deleted, failed or finished pod is never a placement (the pod watch drops it).

``adjust`` takes each pending placement's ``count`` GPUs from the node, GPU by GPU, as the
filter would have seen them: the healthy GPUs with the most free memory left (the ones that
were offering room), clamped at zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..core.schema import GpuInfo, NodeGpuState


@dataclass(frozen=True, slots=True)
class Placement:
    """One pod bound to ``node`` that needs ``count`` GPUs with ``memory_mib`` free each."""

    key: str  # namespace/name
    uid: str
    node: str
    memory_mib: int
    count: int = 1
    placed_at: float = 0.0
    started_at: float | None = None
    baseline_free_mib: int | None = None

    @property
    def total_mib(self) -> int:
        return self.memory_mib * self.count


def pending(
    placements: Iterable[Placement],
    state: NodeGpuState | None,
    *,
    now: float,
    settle_s: float,
    exclude_uid: str = "",
) -> list[Placement]:
    """The placements that still count against ``state``'s node (oldest first)."""
    live = sorted(
        (p for p in placements if p.uid != exclude_uid and now - p.placed_at < settle_s),
        key=lambda p: (p.started_at if p.started_at is not None else float("inf"), p.placed_at),
    )
    if state is None or state.read_at is None:
        return live
    read_at, free_now = state.read_at, state.free_total_mib
    shown = 0  # memory of earlier placements the reading must show as well
    out: list[Placement] = []
    settling = True
    for p in live:
        seen = (
            settling
            and p.started_at is not None
            and read_at > p.started_at
            and p.baseline_free_mib is not None
            and p.baseline_free_mib - free_now >= shown + p.total_mib
        )
        if seen:
            shown += p.total_mib
            continue
        settling = False  # later ones cannot be told apart from this one: they wait
        out.append(p)
    return out


def adjust(state: NodeGpuState, placements: Sequence[Placement]) -> NodeGpuState:
    """``state`` with each placement's need taken from its GPUs (healthy, most free first)."""
    if not placements or not state.gpus:
        return state
    free = {g.index: g.free_mib for g in state.gpus}
    healthy = [g.index for g in state.gpus if g.healthy]
    for p in placements:
        for index in sorted(healthy, key=lambda i: -free[i])[: p.count]:
            free[index] = max(0, free[index] - p.memory_mib)
    gpus = tuple(GpuInfo(g.index, free[g.index], g.healthy) for g in state.gpus)
    return replace(state, gpus=gpus, free_total_mib=sum(g.free_mib for g in gpus if g.healthy))
