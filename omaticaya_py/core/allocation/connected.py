"""The best connected set of whole GPUs among the equally roomy: rule 2 of
``core.allocation.placement.first_whole`` (pure).

Free memory first, then links. Free memory counts in whole ``MEMORY_GRAIN_MIB`` (GiB): the
candidates are the healthy devices with as many GiB free as the least free of the ``count``
most free, less a slack of an eighth of it (``ROOMY_SLACK``: 9 GiB on an idle H100). A CUDA
context or a monitoring process (hundreds of MiB) never breaks an NVLink pair; a neighbour's
job of GiBs takes its GPU out while others have the room. Of their sets of ``count``:

1. the highest score with ``chosen`` (the sum of its pairs' ``links(a, b)``, the devices
   already chosen included; ``core.model.topology.NodeTopology.pair_score``);
2. on a tie, the one that leaves the other candidates best connected (the sum of their pairs'
   scores: a 1-GPU pod goes where it breaks the fewest links, as NVIDIA's best-effort policy
   keeps the rest of the node partitionable);
3. then the most GiB free in all;
4. then the lowest indices (then MIG indices).

Every key is one the extender can compute as the device plugin does: the extender reads free
memory rounded down to the labels' step (1 GiB by default), the plugin reads it exact, so
nothing here compares MiB. Above ``MAX_LINK_SETS`` sets the set is grown one device at a time
instead, each the candidate with the highest score to those chosen so far (the lowest index on
a tie), starting from ``chosen`` or the candidate best connected to the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import combinations
from typing import TypeVar

from ..schema import GpuInfo

__all__ = ["MAX_LINK_SETS", "MEMORY_GRAIN_MIB", "ROOMY_SLACK", "connected_set", "gib_free",
           "roomy_floor"]

#: the grain free memory is compared in when links choose: GPUs with as many whole GiB free
#: count as equally roomy (idle GPUs differ by a few MiB, a GPU with a neighbour's process on
#: it by GiBs). The labels' default step (``OMATICAYA_MEMORY_STEP_MIB``), so that the extender,
#: which reads free memory rounded down to it, and the device plugin, which reads it exact, rank
#: alike
MEMORY_GRAIN_MIB = 1024
#: a candidate may have this share less free than the least free of the most free: 1/8
ROOMY_SLACK = 8
#: above this many candidate sets, a connected set is grown one GPU at a time instead
MAX_LINK_SETS = 5000

T = TypeVar("T")


def gib_free(g: GpuInfo) -> int:
    """Whole ``MEMORY_GRAIN_MIB`` free on ``g`` (-1 when its free memory is unknown)."""
    return g.free_mib // MEMORY_GRAIN_MIB if g.free_mib >= 0 else -1


def roomy_floor(least_gib: int) -> int:
    """The fewest whole GiB free a candidate may have, when the least free of the ``count``
    most free has ``least_gib``: an eighth (``ROOMY_SLACK``) less, rounded in its favour."""
    return least_gib - max(0, least_gib) // ROOMY_SLACK


def connected_set(ranked: Sequence[T], count: int, info: Callable[[T], GpuInfo],
                  chosen: Sequence[T], links: Callable[[T, T], int]) -> list[T]:  # fmt: skip
    """``count`` devices of ``ranked`` (most free first: ``placement.whole_key``'s order; its
    first ``count`` all healthy) by the module's rule, in ``ranked``'s order. ``info``: each
    device's ``GpuInfo``; ``chosen``: devices already handed out to the container (their links
    count); ``links``: a pair's score."""
    floor = roomy_floor(min(gib_free(info(d)) for d in ranked[:count]))
    pool = [d for d in ranked if info(d).healthy and gib_free(info(d)) >= floor]
    if len(pool) == count:
        return pool
    rank = {id(d): k for k, d in enumerate(ranked)}
    score = _pair_scores([*chosen, *pool], links)
    if math.comb(len(pool), count) > MAX_LINK_SETS:
        grown = _grow(pool, count, chosen, score, lambda d: info(d).index)
        return sorted(grown, key=lambda d: rank[id(d)])
    fixed = sum(score(a, b) for a, b in combinations(chosen, 2))
    with_chosen = {id(d): sum(score(d, c) for c in chosen) for d in pool}

    def key(picked: Iterable[T]) -> tuple[int, int, int, tuple[tuple[int, int], ...]]:
        picked = tuple(picked)
        inside = set(map(id, picked))
        rest = [d for d in pool if id(d) not in inside]
        own = fixed + sum(with_chosen[id(d)] for d in picked)
        own += sum(score(a, b) for a, b in combinations(picked, 2))
        left = sum(score(a, b) for a, b in combinations(rest, 2))
        free = sum(gib_free(info(d)) for d in picked)
        where = tuple(sorted((info(d).index, info(d).mig_index or 0) for d in picked))
        return (-own, -left, -free, where)

    best = min(combinations(pool, count), key=key)
    return sorted(best, key=lambda d: rank[id(d)])


def _pair_scores(devices: Sequence[T], links: Callable[[T, T], int]) -> Callable[[T, T], int]:
    """``links`` over ``devices``, each pair asked once."""
    table: dict[tuple[int, int], int] = {}
    for a, b in combinations(devices, 2):
        table[(id(a), id(b))] = table[(id(b), id(a))] = links(a, b)
    return lambda a, b: table.get((id(a), id(b)), 0)


def _grow(pool: Sequence[T], count: int, chosen: Sequence[T], score: Callable[[T, T], int],
          index: Callable[[T], int]) -> list[T]:  # fmt: skip
    """``count`` of ``pool``, grown one at a time by the highest score to ``chosen`` and those
    grown so far (the lowest ``index`` on a tie); the first is the one best connected to the
    whole pool when nothing is chosen."""
    near = list(chosen)
    rest = list(pool)
    picked: list[T] = []
    while rest and len(picked) < count:
        against = near or rest
        best = max(rest, key=lambda d: (sum(score(d, c) for c in against if c is not d),
                                        -index(d)))  # fmt: skip
        picked.append(best)
        near.append(best)
        rest.remove(best)
    return picked
