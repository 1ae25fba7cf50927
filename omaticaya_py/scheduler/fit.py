"""The fit rule (pure): whether a pod's need fits on a node, and why not, for every verb.

One rule judges a node for the filter, prioritize, the narrowing to one node, the kept
verdicts (``cache``) and preemption (``preempt``; ``room_on``: a node as it would be once its
victims are gone): ``judge`` over a ``NodeRecord`` (the node's GPU state as the Node cache
parsed it, and ``left``: that state less the reservations still counting,
``inflight.adjust``), with a ``JudgingContext`` built once per request. The kept
verdicts are a cache in front of it: ``judge_all`` takes ``fresh_window``'s answer (the
liveness rule as a window on the record) instead of ``core.rules.liveness.node_liveness`` for a node
that is fresh and healthy, and the rest of the rule (``room``) is the same function.

In order, a node:

- not in the Node cache, without Omaticaya labels, or without usable telemetry, is *unknown*;
  a published time more than ``max_skew_s`` ahead of the clock makes it unknown too
  (``Verdict.problem`` set). Unknown: the unknown policy (``nodeview``: reject, else it passes
  unscored);
- whose agent is not reporting (``core.rules.liveness.node_liveness``) is *stale*: the stale policy
  (reject; ``score-zero``: it passes unscored; ``allow``: judged on its last reading);
- with ``gpu.health`` Unhealthy or Unknown fails;
- has room (``room``) when ``Need.count`` healthy GPUs each have ``Need.memory_mib`` free in
  ``left`` (scored by the free MiB of its healthy GPUs), or, for slices, when each slice fits on
  one healthy shared GPU (``slice_room``: scored by the room of the GPU the largest slice goes
  to). Without room it fails: ``IN_FLIGHT`` when the state before the reservations had room,
  else ``NO_ROOM``.

Why a node fails is a ``Reason`` code; the text kube-scheduler shows is made from the code in
one place (``TEXTS``, ``reason_text``) and carries its code (``ReasonText.code``), which the
metrics, the logs and ``FailedAndUnresolvableNodes`` read.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import repeat
from operator import add, mul, sub, truediv
from typing import Any

from ..core.allocation.placement import (
    DEFAULT_POLICY,
    Need,
    choose_gpus,
    place,
    place_slices,
    slice_room,
)
from ..core.allocation.policy import policy_sign
from ..core.rules.liveness import AHEAD, STALE, LivenessClock, node_liveness
from ..core.schema import NodeGpuState
from .inflight import Placement, adjust
from .nodeview import seen_of
from .reasons import TEXTS, Reason, ReasonText, reason_text, wanted_text
from .records import (
    BAD_HEALTH,
    NO_WINDOW,
    JudgingContext,
    NodeRecord,
    ProblemOf,
    Window,
    build_record,
    fresh_window,
    window,
)

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "NO_WINDOW",
    "TEXTS",
    "JudgingContext",
    "NodeRecord",
    "ProblemOf",
    "Reason",
    "ReasonText",
    "Verdict",
    "Window",
    "build_record",
    "choose_gpus",
    "fresh_window",
    "judge",
    "judge_all",
    "by_links",
    "judge_each",
    "judge_safely",
    "place_slices",
    "reason_text",
    "room",
    "room_failure",
    "room_on",
    "link_scores",
    "scores",
    "slice_room",
    "usable",
    "wanted_text",
    "window",
]

MAX_PRIORITY = 10
MIN_PRIORITY = 0
INF = float("inf")


@lru_cache(maxsize=64)
def _room_failures(need: Need, prefix: str) -> tuple[Verdict, Verdict]:
    """(no room, room taken by in-flight pods) for ``need``: made once per need."""
    wanted = wanted_text(need)
    return (Verdict(False, reason_text(Reason.NO_ROOM, wanted=wanted, prefix=prefix)),
            Verdict(False, reason_text(Reason.IN_FLIGHT, wanted=wanted, prefix=prefix)))  # fmt: skip


def room_failure(need: Need, prefix: str, taken: bool = False) -> ReasonText:
    """The reason of a usable, healthy node without room for ``need`` (``room``'s failure):
    ``IN_FLIGHT`` when ``taken`` (the state before the reservations had room), else
    ``NO_ROOM``."""
    return _room_failures(need, prefix)[taken].reason  # type: ignore[return-value]  # has one


# ---------------------------------------------------------------------- verdict ----


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's result: ``ok`` (passes), ``reason`` (why not, with its code; ``None`` when it
    passes), ``fits`` (passes on known data: it gets a score), ``free_mib`` (what it is scored
    by: the free MiB of its healthy GPUs less the reservations, or for slices the room of the
    GPU the largest slice goes to), ``problem`` (a short fixed name for counting, when the
    node's data is unusable at judging time: a time ahead of the clock, or judging raised)."""

    ok: bool
    reason: ReasonText | None = None
    fits: bool = False
    free_mib: int = 0
    problem: str | None = None


PASS_UNSCORED = Verdict(True)

# ---------------------------------------------------------------------- the rule ----


def room(rec: NodeRecord, need: Need, prefix: str, policy: str = DEFAULT_POLICY) -> Verdict:
    """The room part of the rule on a usable, healthy node, by the placement model
    (``core.allocation.placement.place`` under ``policy``): fits (scored by ``Taken.room_mib``), or fails
    with ``IN_FLIGHT`` (``rec.state`` had room, the reservations took it) or ``NO_ROOM``. A
    need of ``count`` GPUs with memory, no device and no slice, is read off the sorted free
    MiB (the same answer as ``place``, for thousands of nodes)."""
    if need.memory_mib > 0 and not (need.slices or need.exclusive or need.profile):
        k, mem = need.count - 1, need.memory_mib
        f = rec.fits
        if len(f) > k and f[k] >= mem:
            return Verdict(True, fits=True, free_mib=rec.free)
        r = rec.raw
        taken = len(r) > k and r[k] >= mem
    else:
        placed = place(rec.left, need, policy)
        if placed is not None:
            return Verdict(True, fits=True, free_mib=placed.room_mib)
        taken = rec.left is not rec.state and place(rec.state, need, policy) is not None
    return _room_failures(need, prefix)[taken]


def room_on(state: NodeGpuState, live: Sequence[Placement], need: Need,
            prefix: str = "omaticaya.io", policy: str = DEFAULT_POLICY) -> Verdict:  # fmt: skip
    """``room`` on a record made for ``state`` with the reservations ``live`` still counting
    (taken off as the filter takes them, ``inflight.adjust``): the rule without the liveness
    part, which preemption judges a node by as it would be once its victims are gone
    (``victims.choose_victims``)."""
    return room(NodeRecord(state, adjust(state, live), NO_WINDOW, 0, INF), need, prefix, policy)


def usable(rec: NodeRecord | None, need: Need, ctx: JudgingContext, *,
           fresh: bool = False) -> Verdict | None:  # fmt: skip
    """What makes a node usable, before its room: ``None`` when ``rec``'s node is judged by its
    room, else its verdict (fails, or passes unscored by a policy): a bad pod, a node not in the
    cache, without telemetry or with unusable telemetry, not live (``core.rules.liveness``), with bad
    health. ``fresh``: the record's window (``fresh_window``) already says the node is live, so
    the liveness rule is not run again. Both ``judge`` and the kept verdicts' fast path
    (``judge_all``) call it: a precondition added here holds on both."""
    if need.error:
        return Verdict(False, reason_text(Reason.BAD_POD, why=need.error))
    unknown_is, stale_is = ctx.policies(rec.state if rec is not None else None)
    unknown = None if unknown_is == "reject" else PASS_UNSCORED
    if rec is None:
        return unknown or Verdict(False, reason_text(Reason.NOT_IN_CACHE))
    state = rec.state
    if not state.known:
        return unknown or Verdict(False, reason_text(Reason.NO_TELEMETRY, prefix=ctx.prefix))
    if state.read_at is None or state.problem:
        why = state.problem or "no telemetry annotation"
        return unknown or Verdict(False, reason_text(Reason.UNUSABLE_TELEMETRY, why=why))
    if not fresh:
        clock = LivenessClock(ctx.now, ctx.grace_s, ctx.now_mono, ctx.max_skew_s)
        alive = node_liveness(state, clock, ttl_s=ctx.ttl_s, seen=seen_of(state),
                              leases=ctx.leases, prefix=ctx.prefix)  # fmt: skip
        if alive.kind == AHEAD:
            if unknown is not None:
                return Verdict(True, problem=alive.problem)
            why = reason_text(Reason.UNUSABLE_TELEMETRY, why=alive.why)
            return Verdict(False, why, problem=alive.problem)
        if alive.kind == STALE and stale_is != "allow":
            if stale_is != "reject":
                return PASS_UNSCORED
            return Verdict(False, reason_text(Reason.STALE, why=alive.why))
    if state.health in BAD_HEALTH or state.health is None:
        health = state.health or "Unknown"
        return Verdict(False, reason_text(Reason.UNHEALTHY, health=health, prefix=ctx.prefix))
    return None


def judge(rec: NodeRecord | None, need: Need, ctx: JudgingContext) -> Verdict:
    """The rule for one node (``rec`` ``None``: not in the Node cache); see the module's
    docstring: ``usable``, then ``room``."""
    verdict = usable(rec, need, ctx)
    if verdict is not None or rec is None:
        return verdict or Verdict(False, reason_text(Reason.NOT_IN_CACHE))
    return room(rec, need, ctx.prefix, ctx.policy)


#: the ``Verdict.problem`` of a node on which judging raised: ``judging raised <type>``
JUDGING_RAISED = "judging raised"


def judge_safely(name: str, judging: Callable[[], Verdict], ctx: JudgingContext) -> Verdict:
    """``judging()`` of the node ``name`` (``judge`` bound to it): whatever a node carries, an
    exception while judging it is that node's failure (``JUDGING_FAILED``), never the
    request's; ``ctx.on_problem(name, problem, detail)`` hears of the verdict's ``problem``
    (``None`` when it has none)."""
    try:
        verdict = judging()
        detail = verdict.reason or ""
    except Exception as exc:  # noqa: BLE001 - one node's data must not fail the others
        problem = f"{JUDGING_RAISED} {type(exc).__name__}"
        verdict = Verdict(False, reason_text(Reason.JUDGING_FAILED, why=problem), problem=problem)
        detail = f": {str(exc)[:200]}"
    if ctx.on_problem is not None:
        ctx.on_problem(name, verdict.problem, detail)
    return verdict


#: (fitting {name: free MiB} in input order, passed without a score, failed {name: reason})
Judged = tuple[dict[str, int], list[str], dict[str, ReasonText]]

#: told of a node judged fresh by its window: (name, record, wall_until, mono_until, Lease)
OnFast = Callable[[str, NodeRecord, float, float, Any], None]


def _tally(verdicts: Iterable[tuple[str, Verdict]]) -> Judged:
    fits: dict[str, int] = {}
    passed: list[str] = []
    failed: dict[str, ReasonText] = {}
    for name, v in verdicts:
        if v.fits:
            fits[name] = v.free_mib
        elif v.ok:
            passed.append(name)
        else:
            failed[name] = v.reason  # type: ignore[assignment]  # a failure has one
    return fits, passed, failed


def judge_all(items: Iterable[tuple[str, NodeRecord | None]], need: Need, ctx: JudgingContext,
              flagged: Container[str] = (), on_fast: OnFast | None = None) -> Judged:  # fmt: skip
    """``judge`` of each ``(name, record)`` (through ``judge_safely``), the record's window
    standing in for the liveness rule where it says fresh (``fresh_window``). ``flagged``:
    names with a judging problem on record (``ctx.on_problem`` is told when one judges well by
    its window); ``on_fast`` hears of each node judged by its window (``cache.Verdicts``)."""
    on_problem, prefix = ctx.on_problem, ctx.prefix

    def verdicts() -> Iterator[tuple[str, Verdict]]:
        for name, rec in items:
            fresh = fresh_window(rec, ctx) if not need.error else None
            if fresh is None:
                yield name, judge_safely(name, partial(judge, rec, need, ctx), ctx)
                continue
            if on_fast is not None:
                on_fast(name, rec, *fresh)  # type: ignore[arg-type]
            if on_problem is not None and name in flagged:
                on_problem(name, None, "")
            verdict = usable(rec, need, ctx, fresh=True)
            yield name, verdict or room(rec, need, prefix, ctx.policy)  # type: ignore[arg-type]

    return _tally(verdicts())


#: the reservations still counting on a node: (name, state) -> placements
InFlightOf = Callable[[str, "NodeGpuState | None"], Sequence[Placement]]


def judge_each(states: Iterable[tuple[str, NodeGpuState | None]], need: Need,
               ctx: JudgingContext, inflight: InFlightOf | None = None) -> Judged:  # fmt: skip
    """``judge`` of each ``(name, state)`` on a record made for this request (its ``inflight``
    reservations taken off), by the liveness rule itself: the rule without the cache (no
    ledger, preemption). Equal to ``judge_all`` over kept records (tests/scheduler/test_fit_rule.py)."""

    def one(name: str, state: NodeGpuState | None) -> Verdict:
        if state is None:
            return judge(None, need, ctx)
        live = inflight(name, state) if inflight is not None else ()
        return judge(build_record(state, live, ctx, version=0, until=INF), need, ctx)

    return _tally((name, judge_safely(name, partial(one, name, state), ctx))
                  for name, state in states)  # fmt: skip


# ---------------------------------------------------------------------- scores ----


def by_links(need: Need) -> bool:
    """Whether nodes are ranked for ``need`` by the links between the GPUs it gets: two or more
    whole GPUs of the device plugin's resource (``Need.exclusive``, no MIG profile)."""
    return need.exclusive and need.profile is None and need.whole_count >= 2


def link_scores(records: Iterable[tuple[str, NodeRecord | None]], need: Need,
                policy: str) -> dict[str, int]:  # fmt: skip
    """For a need ranked by links (``by_links``), each node's score of the set of GPUs the
    placement model gives it there (``core.model.topology.NodeTopology.set_score`` of
    ``place``'s ``Taken.gpus`` on what is left of it): a 4-GPU pod goes where 4 connected GPUs
    are free rather than 4 scattered ones. Nodes whose telemetry publishes no topology, or
    where the need does not fit, are left out (they rank as 0); ``{}`` for any other need."""
    if not by_links(need):
        return {}
    out: dict[str, int] = {}
    for name, rec in records:
        topology = rec.state.topology if rec is not None else None
        if rec is None or topology is None:
            continue
        taken = place(rec.left, need, policy)
        if taken is not None:
            out[name] = topology.set_score(taken.gpus)
    return out


def scores(free: Mapping[str, int], policy: str,
           links: Mapping[str, int] | None = None) -> dict[str, int]:  # fmt: skip
    """Scores 1..``MAX_PRIORITY`` of the fitting nodes by ``free`` MiB, linear between the
    least and the most free among them (all equal: ``MAX_PRIORITY``): ``binpack`` gives 10 to
    the least free, ``spread`` to the most. In ``map``: no Python code runs per node. With
    ``links`` (``link_scores``) that differ between the fitting nodes, by them instead, the
    best connected scoring the most, whatever the policy (a node without one counts 0)."""
    if not free:
        return {}
    if links:
        ranked = {name: links.get(name, 0) for name in free}
        if len(set(ranked.values())) > 1:
            return scores(ranked, "spread")
    lo, hi = min(free.values()), max(free.values())
    if hi == lo:
        return dict.fromkeys(free, MAX_PRIORITY)
    binpack = policy_sign(policy) > 0  # binpack: the least free scores the most
    if set(map(type, free.values())) == {int}:  # MiB: the steps of the same sum, found once
        cuts = _cuts(lo, hi, binpack)
        steps = map(bisect_right, repeat(cuts), free.values())
        if binpack:
            return dict(zip(free, map(sub, repeat(MAX_PRIORITY), steps), strict=True))
        return dict(zip(free, map(add, repeat(1), steps), strict=True))
    frac: Iterator[float] = map(truediv, map(sub, free.values(), repeat(lo)), repeat(hi - lo))
    if binpack:
        frac = map(sub, repeat(1.0), frac)
    top = MAX_PRIORITY - 1
    return dict(zip(free, map(add, repeat(1), map(round, map(mul, frac, repeat(top)))),
                    strict=True))  # fmt: skip


def _step(f: int, lo: int, hi: int, binpack: bool) -> int:
    """``scores``' sum for ``f`` MiB free, less 1: ``round((MAX_PRIORITY - 1) * x)`` of ``x``
    the share of the way from ``lo`` to ``hi`` (binpack: from ``hi`` to ``lo``), in floats."""
    frac = (f - lo) / (hi - lo)
    return round((1.0 - frac if binpack else frac) * (MAX_PRIORITY - 1))


def _cuts(lo: int, hi: int, binpack: bool) -> list[int]:
    """The whole MiB where ``_step`` moves, for ``bisect_right``: ``_step(f)`` is the number of
    cuts at or below ``f`` (spread), or ``MAX_PRIORITY - 1`` less it (binpack). ``_step`` is
    monotonic in ``f`` (each float operation of it is), so each cut is found by bisection on
    the integers from ``lo`` to ``hi``: the same sums as computing each node's, in ~200
    evaluations instead of one per node."""
    cuts = []
    for level in range(1, MAX_PRIORITY):
        a, b = lo, hi + 1  # the first f in [lo, hi] past the step, or hi + 1: none
        while a < b:
            mid = (a + b) // 2
            step = _step(mid, lo, hi, binpack)
            if (step <= MAX_PRIORITY - 1 - level) if binpack else (step >= level):
                b = mid
            else:
                a = mid + 1
        cuts.append(a)
    return cuts
