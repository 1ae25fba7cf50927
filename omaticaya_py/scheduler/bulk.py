"""The bulk path of the kept verdicts (``cache.Verdicts._bulk``): which nodes of a large
request ``judge_all`` would judge on its fast path with a record holding no reservation, found
with ``map`` over columns (no Python code per node) instead of one record per node.

A node qualifies when it is a ``NodeView`` with ``Facts`` (``nodeview.facts_of``: usable
telemetry and good health, made when the Node cache stored it) under its own name, fresh by its
window (``records.window``, with the index's grace and skew), naming no Lease when the request
watches Leases, and with no placement held on it (``Ledger.on_node``). On such a node
``fit.usable`` finds nothing: a precondition added to ``usable`` must be added to ``facts_of``
too (tests/scheduler/test_extender_scale_bulk.py checks they agree).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import compress, repeat
from operator import add, and_, eq, ge, is_, is_not, le, not_, sub
from typing import Any

from ..core.schema import NodeGpuState
from .fit import JudgingContext
from .ledger import Ledger

__all__ = ["FreshColumns", "fresh_columns", "tell_judged"]


@dataclass(frozen=True, slots=True)
class FreshColumns:
    """The qualifying nodes of a request as columns, in the request's order: ``names``, their
    ``states``, the wall and monotonic ends of their windows (``wall_until``, ``mono_until``,
    epoch and monotonic seconds), their free MiB per GPU most first (``desc``, padded with -1)
    and over healthy GPUs (``free_total``), their ledger ``versions`` (empty: no ledger);
    ``every``: all of the request's nodes qualified."""

    names: list[str]
    states: list[Any]
    wall_until: list[float]
    mono_until: list[float]
    desc: list[tuple[int, ...]]
    free_total: list[int]
    versions: Sequence[int]
    every: bool


def _qualify(names: list[str], facts: list[Any], win: JudgingContext, ctx: JudgingContext,
             ledger: Ledger | None) -> tuple[list[bool] | None, list[float], list[float],
                                             Sequence[int]]:  # fmt: skip
    """(the mask of qualifying nodes, ``None``: all; their windows' wall and monotonic ends;
    their ledger versions)."""
    own, published, valid, wall_base, mono_base, _, _, _, lease = zip(*facts, strict=True)
    limit = list(map(add, valid, repeat(win.grace_s)))
    wall_until = list(map(add, wall_base, limit))
    mono_until = list(map(add, mono_base, limit))
    now, mono = ctx.now, ctx.now_mono or 0.0  # fresh_columns asks only with a monotonic clock
    checks = [map(eq, own, names),  # judged as records are: fresh_window's bounds
              map(le, map(sub, published, repeat(win.max_skew_s)), repeat(now)),
              map(ge, wall_until, repeat(now)), map(ge, mono_until, repeat(mono))]  # fmt: skip
    if ctx.leases is not None:  # judged by the Lease it names
        checks.append(map(is_, lease, repeat(None)))
    versions: Sequence[int] = ()
    if ledger is not None:
        versions = list(map(ledger.versions.get, names, repeat(0)))
        held = set(filter(ledger.on_node, compress(names, versions)))
        if held:  # a record there takes the reservations off
            checks.append(map(not_, map(held.__contains__, names)))
    mask: list[bool] | None = None
    for check in checks:
        flags = list(check)
        if False in flags:
            mask = flags if mask is None else list(map(and_, mask, flags))
    return mask, wall_until, mono_until, versions


def fresh_columns(todo: dict[str, NodeGpuState | None], win: JudgingContext,
                  ctx: JudgingContext, ledger: Ledger | None) -> FreshColumns | None:  # fmt: skip
    """The nodes of ``todo`` (name -> the Node cache's state) that qualify (the module's
    docstring), judged by ``win``'s grace and skew at ``ctx``'s clocks; ``None`` when none does
    or the request has no monotonic clock (``fit.judge`` never asks then)."""
    names = list(todo)
    if not names or ctx.now_mono is None:
        return None
    states = list(todo.values())
    facts: list[Any] = list(map(getattr, states, repeat("facts"), repeat(None)))
    if None in facts:
        have = list(map(is_not, facts, repeat(None)))
        names, states = list(compress(names, have)), list(compress(states, have))
        facts = list(compress(facts, have))
        if not names:
            return None
    mask, wall_until, mono_until, versions = _qualify(names, facts, win, ctx, ledger)
    desc = [f[5] for f in facts]
    free_total = [f[7] for f in facts]
    every = mask is None and len(names) == len(todo)
    if mask is not None:
        names, states = list(compress(names, mask)), list(compress(states, mask))
        wall_until, mono_until = list(compress(wall_until, mask)), list(compress(mono_until, mask))
        desc, free_total = list(compress(desc, mask)), list(compress(free_total, mask))
        versions = list(compress(versions, mask)) if versions else ()
        if not names:
            return None
    return FreshColumns(names, states, wall_until, mono_until, desc, free_total, versions, every)


def tell_judged(ctx: JudgingContext, flagged: Container[str], judged: Collection[str],
                names: Sequence[str]) -> None:  # fmt: skip
    """Tell ``ctx.on_problem`` that each flagged node among those ``judged`` (``names``, in
    order) judged well, as ``judge_all`` tells its fast path's nodes."""
    on_problem = ctx.on_problem
    if on_problem is None or not flagged:
        return
    if isinstance(flagged, Mapping | AbstractSet):
        told = [n for n in flagged if n in judged]
    else:
        told = [n for n in names if n in flagged]
    for name in told:
        on_problem(name, None, "")
