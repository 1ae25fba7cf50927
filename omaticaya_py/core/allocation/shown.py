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
wait for the caller's age limit (``settle_s``), which ages them out.

A book of grants (the device plugin's slices on one GPU) is looked at again and again: the
grants a look shows leave it (``look``), and the ones left are rebased, their baselines less
the memory shown, so that what a later grant's drop must cover stays what it was (two slices
handed out at the same baseline, one in use: the other still counts at every later look).
``still_in_book`` replays such a book from the grants alone, each added at its own baseline,
for the extender, which keeps every grant. ``still_pending`` is the look both kubelet plugins
take at their books of slices (the device plugin's ``Allocate``, the DRA driver's prepare):
one rule, whatever each keeps beside a slice. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import compress
from typing import Any, Protocol, TypeVar, cast

__all__ = ["BookedSlice", "Grant", "look", "still_counting", "still_in_book", "still_pending"]


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


def look(grants: Sequence[Grant], free_now_mib: int | None) -> tuple[list[bool], int]:
    """A look at a book of ``grants`` (oldest first) at ``free_now_mib``: ``(still counting,
    MiB shown)``, the flags of ``still_counting`` and the memory of the grants its drop showed
    (a held grant shows by the books, not by a drop: it stays in the book, ahead of the later
    ones). The grants shown by a drop are a prefix of those not held; the caller drops them and
    takes their memory off the baselines of the ones it keeps (``rebase``)."""
    flags = still_counting(grants, free_now_mib)
    shown = sum(g.mib for g, still in zip(grants, flags, strict=True) if not still and not g.held)
    return flags, shown


def rebase(g: Grant, shown_mib: int) -> Grant:
    """``g`` kept in a book from which grants of ``shown_mib`` were dropped as shown: its
    baseline less that memory (its drop must still cover them: they were ahead of it)."""
    if not shown_mib or g.baseline_free_mib is None:
        return g
    return Grant(g.mib, g.baseline_free_mib - shown_mib, g.read_after, g.held)


def still_in_book(grants: Sequence[Grant], free_now_mib: int | None) -> list[bool]:
    """For each of ``grants`` (oldest first, one free-memory figure), whether it still counts
    in a book kept as the device plugin keeps its slices: each grant added when it was made,
    after a look at the free memory then (its baseline), the grants that look showed gone and
    the rest rebased (``look``, ``rebase``); then a look at ``free_now_mib``."""
    book: list[tuple[int, Grant]] = []

    def prune(free_mib: int | None) -> None:
        nonlocal book
        flags, shown = look([g for _, g in book], free_mib)
        book = [(k, rebase(g, shown)) for (k, g), still in zip(book, flags, strict=True)
                if still or g.held]  # fmt: skip

    for k, g in enumerate(grants):
        if book and g.baseline_free_mib is not None:
            prune(g.baseline_free_mib)
        book.append((k, g))
    flags, _ = look([g for _, g in book], free_now_mib)
    counting = {k for (k, _), still in zip(book, flags, strict=True) if still}
    return [k in counting for k in range(len(grants))]


class BookedSlice(Protocol):
    """A slice in a plugin's book (a frozen dataclass): its ``mib``, when it was handed out
    (``at_s``, the plugin's monotonic clock) and its GPU's free MiB then, less the memory of the
    earlier slices shown since (``baseline_free_mib``; ``None``: unknown)."""

    @property
    def mib(self) -> int: ...

    @property
    def at_s(self) -> float: ...

    @property
    def baseline_free_mib(self) -> int | None: ...


S = TypeVar("S", bound=BookedSlice)


def still_pending(slices: Sequence[S], free_now_mib: int | None, now_s: float,
                  settle_s: float) -> tuple[S, ...]:  # fmt: skip
    """The slices of one GPU (oldest first) that still count against its live free memory
    ``free_now_mib`` (MiB; ``None``: unknown, all count) at ``now_s``: those under ``settle_s``
    old (``OMATICAYA_SHARE_SETTLE_S``) that the "counts until shown" rule still counts (each a
    ``Grant`` read after it was handed out: ``look``). Callers keep the result as the GPU's
    slices, so that every slice still counting was counting when each later one was handed
    out: a slice shows only once the drop from its baseline covers it and every earlier one,
    and none shows after one that does not (memory that cannot be told apart waits). The
    slices kept are rebased by the memory of those shown (``rebase``): the drop they must show
    still covers it. Used by ``deviceplugin.slices`` and ``dra.prepare`` alike."""
    live = [s for s in slices if now_s - s.at_s < settle_s]
    flags, shown = look([Grant(s.mib, s.baseline_free_mib, read_after=True) for s in live],
                        free_now_mib)  # fmt: skip
    return tuple(_rebased(s, shown) for s in compress(live, flags))


def _rebased(s: S, shown_mib: int) -> S:
    if not shown_mib or s.baseline_free_mib is None:
        return s
    return cast(S, replace(cast(Any, s), baseline_free_mib=s.baseline_free_mib - shown_mib))
