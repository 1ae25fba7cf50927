"""GPU memory handed out counts until a reading shows it: one rule for the extender and the
device plugin.

Both hand out GPU memory before any reading can show it in use: the extender reserves a pod's
need on a node at filter time (``scheduler.inflight``), the device plugin gives a container a
slice at ``Allocate`` (``deviceplugin.slicer``). Until the GPU's live free memory shows it,
each subtracts what it handed out from that free memory, or it would hand the same MiB out
twice. ``still_counting`` says, for the grants on one free-memory figure, which still count.

A grant is shown, and counts no more, when

- the kubelet's books name its holder in a reading taken after it could run (``Grant.held``:
  its memory still counts in the drop the later ones must account for: it may not be in use
  yet), or
- the reading was taken after it could use its memory (``Grant.read_after``), and the free
  memory has dropped from what it was when the grant was made (``baseline_free_mib``) by at
  least this grant plus every earlier one (oldest first) on the same figure.

The rule is conservative: once one grant is not shown, no later one is (their memory cannot be
told apart), and memory freed by another process at the same time hides a drop: such grants
wait for the caller's age limit (``settle_s``), which ages them out. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Grant", "still_counting"]


@dataclass(frozen=True, slots=True)
class Grant:
    """One grant of GPU memory as the rule sees it: ``mib`` handed out, the free MiB of the
    figure it is judged on when it was made (``baseline_free_mib``; ``None``: unknown, never
    shown by a drop), whether the reading was taken after the grant could use its memory
    (``read_after``: the pod's ``status.startTime`` before the reading's ``read_at``; the
    device plugin's slices are handed out before the readings it judges them on), and
    ``held``: the reading's holders (the kubelet's PodResources) name its pod."""

    mib: int
    baseline_free_mib: int | None
    read_after: bool = True
    held: bool = False


def still_counting(grants: Sequence[Grant], free_now_mib: int | None) -> list[bool]:
    """For each of ``grants`` (oldest first, all on one free-memory figure), whether it still
    counts against ``free_now_mib`` (the figure's live free MiB now; ``None``: no reading, every
    grant counts). See the module's docstring."""
    if free_now_mib is None:
        return [True] * len(grants)
    out: list[bool] = []
    ahead = 0  # memory of the earlier grants the drop must show as well
    settling = True
    for g in grants:
        if g.held:
            ahead += g.mib
            out.append(False)
            continue
        shown = (
            settling
            and g.read_after
            and g.baseline_free_mib is not None
            and g.baseline_free_mib - free_now_mib >= ahead + g.mib
        )
        ahead += g.mib
        settling = settling and shown
        out.append(not shown)
    return out
