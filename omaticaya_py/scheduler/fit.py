"""The fit rule (pure): whether a pod's need fits on a node, and why not, for every verb.

One rule judges a node for the filter, prioritize, the narrowing to one node, the kept
verdicts (``cache``) and preemption (``preempt``; ``room_on``: a node as it would be once its
victims are gone): ``judge`` over a ``NodeRecord`` (the node's GPU state as the Node cache
parsed it, and ``left``: that state less the reservations still counting,
``inflight.adjust``), with a ``JudgingContext`` built once per request. The kept
verdicts are a cache in front of it: ``judge_all`` takes ``fresh_window``'s answer (the
liveness rule as a window on the record) instead of ``core.liveness.node_liveness`` for a node
that is fresh and healthy, and the rest of the rule (``room``) is the same function.

In order, a node:

- not in the Node cache, without Omaticaya labels, or without usable telemetry, is *unknown*;
  a published time more than ``max_skew_s`` ahead of the clock makes it unknown too
  (``Verdict.problem`` set). Unknown: the unknown policy (``nodeview``: reject, else it passes
  unscored);
- whose agent is not reporting (``core.liveness.node_liveness``) is *stale*: the stale policy
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

from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import lru_cache, partial
from itertools import repeat
from operator import add, mul, sub, truediv
from typing import Any

from ..core.liveness import AHEAD, DEFAULT_MAX_CLOCK_SKEW_S, STALE, LeaseOf, node_liveness
from ..core.schema import GpuInfo, NodeGpuState
from ..core.sharing import device_order
from .inflight import Placement, adjust
from .need import Need
from .nodeview import effective, legacy_default, seen_of

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "TEXTS",
    "JudgingContext",
    "NodeRecord",
    "Reason",
    "ReasonText",
    "Verdict",
    "build_record",
    "choose_gpus",
    "fresh_window",
    "judge",
    "judge_all",
    "judge_each",
    "judge_safely",
    "place_slices",
    "reason_text",
    "room",
    "room_on",
    "scores",
    "slice_room",
    "window",
]

MAX_PRIORITY = 10
MIN_PRIORITY = 0
BAD_HEALTH = frozenset({"Unhealthy", "Unknown"})
INF = float("inf")


# ---------------------------------------------------------------------- reasons ----


class Reason(StrEnum):
    """Why a node failed the filter: the value is the ``reason`` label of
    ``omaticaya_extender_decisions_total``."""

    NOT_SYNCED = "not-synced"
    NOT_IN_CACHE = "not-in-cache"
    NO_TELEMETRY = "no-telemetry"
    UNUSABLE_TELEMETRY = "unusable-telemetry"
    STALE = "stale"
    UNHEALTHY = "unhealthy"
    NO_ROOM = "no-room"
    IN_FLIGHT = "in-flight"
    OTHER_NODE = "other-node"
    BAD_POD = "bad-pod"
    JUDGING_FAILED = "judging-failed"


#: the text kube-scheduler shows in the pod's FailedScheduling event, per code. Fields:
#: ``prefix`` (the label prefix), ``wanted`` (the pod's need, ``wanted_text``), ``why`` (the
#: detail: an age, a problem, the pod's own error), ``health`` (the node's ``gpu.health``)
TEXTS: Mapping[Reason, str] = {
    Reason.NOT_SYNCED: "node(s) not checked: the omaticaya extender's node cache is not synced yet",
    Reason.NOT_IN_CACHE: "node(s) not yet in the omaticaya extender's cache",
    Reason.NO_TELEMETRY: "node(s) had no GPU telemetry ({prefix} labels missing: no agent)",
    Reason.UNUSABLE_TELEMETRY: "node(s) had unusable GPU telemetry ({why})",
    Reason.STALE: "node(s) had stale GPU telemetry ({why}: agent not reporting)",
    Reason.UNHEALTHY: "node(s) had GPU health {health} ({prefix})",
    Reason.NO_ROOM: "node(s) had no room: {wanted} ({prefix})",
    Reason.IN_FLIGHT: "node(s) had room taken by in-flight pods: {wanted}, and pods placed "
                      "there are not in its telemetry yet ({prefix})",  # fmt: skip
    Reason.OTHER_NODE: "node(s) fit, another was chosen ({prefix})",
    Reason.BAD_POD: "{why}",
    Reason.JUDGING_FAILED: "node(s) could not be judged by the omaticaya extender ({why})",
}


class ReasonText(str):
    """The text of a failure as kube-scheduler shows it, carrying its ``code``."""

    code: Reason

    def __new__(cls, code: Reason, text: str) -> ReasonText:
        obj = super().__new__(cls, text)
        obj.code = code
        return obj


def reason_text(code: Reason, **fields: Any) -> ReasonText:
    """``TEXTS[code]`` with ``fields`` filled in. Raises ``KeyError`` for a field the text
    names and ``fields`` lacks."""
    return ReasonText(code, TEXTS[code].format(**fields))


def wanted_text(need: Need) -> str:
    """How a reason names the need: ``pod needs 2 GPUs with 40960 MiB free``, or for slices
    ``pod needs 20 units of omaticaya.io/gpu-memory on one shared GPU with the slice free``
    (several containers: ``slices of 20 + 10 units of ... (each on one shared GPU)``)."""
    if not need.slices:
        gpus = "a GPU" if need.count == 1 else f"{need.count} GPUs"
        return f"pod needs {gpus} with {need.memory_mib} MiB free"
    units, resource = sorted(need.slices, reverse=True), need.resource
    if len(units) == 1:
        what = f"{units[0]} units of {resource} on one shared GPU"
    else:
        what = (f"slices of {' + '.join(str(u) for u in units)} units of {resource} (each on "
                "one shared GPU)")  # fmt: skip
    return f"pod needs {what} with the slice free"


@lru_cache(maxsize=64)
def _room_failures(need: Need, prefix: str) -> tuple[Verdict, Verdict]:
    """(no room, room taken by in-flight pods) for ``need``: made once per need."""
    wanted = wanted_text(need)
    return (Verdict(False, reason_text(Reason.NO_ROOM, wanted=wanted, prefix=prefix)),
            Verdict(False, reason_text(Reason.IN_FLIGHT, wanted=wanted, prefix=prefix)))  # fmt: skip


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

#: told of each node judged: (name, problem, detail). ``problem``: a short fixed name for
#: counting (a published time ahead of the clock, judging raised), ``None``: none this time
ProblemOf = Callable[[str, "str | None", str], None]


@dataclass(frozen=True, slots=True)
class JudgingContext:
    """What judging needs besides the node and the need, built once per request: the clocks
    (``now``: epoch s; ``now_mono``: monotonic s, what the watches' ``Seen`` times are on;
    ``None``: not watched), the liveness windows (``ttl_s``, ``grace_s``, ``max_skew_s``: as
    ``ExtenderSettings``), the label ``prefix``, the policies (``stale_policy``,
    ``unknown_policy``, ``fail_open``: ``nodeview``), ``leases`` (a synced Lease watch, or
    ``None``), ``on_problem`` (hears of each node's problem) and ``scoring``: prioritize's
    judging (an unknown node gets no score; a stale one only under ``allow``)."""

    now: float
    ttl_s: float
    grace_s: float
    now_mono: float | None = None
    max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
    prefix: str = "omaticaya.io"
    stale_policy: str | None = None
    unknown_policy: str | None = None
    fail_open: bool = False
    leases: LeaseOf | None = None
    on_problem: ProblemOf | None = None
    scoring: bool = False

    @classmethod
    def of(cls, settings: Any, now: float, now_mono: float | None = None,
           leases: LeaseOf | None = None, on_problem: ProblemOf | None = None
           ) -> JudgingContext:  # fmt: skip
        """The context of ``settings`` (``ExtenderSettings``) at ``now`` with the request's
        ``leases`` (a synced Lease watch) and ``on_problem``."""
        s = settings
        return cls(now, s.ttl_s, s.grace_s, now_mono, s.max_clock_skew_s, s.prefix,
                   s.stale_policy, s.unknown_policy, s.fail_open, leases, on_problem)  # fmt: skip

    def policies(self, state: NodeGpuState | None) -> tuple[str, str]:
        """(unknown policy, stale policy) for ``state``'s node: its override, else the
        context's (``scoring``: unknown rejects, stale rejects unless the node's is allow)."""
        if self.scoring:
            allow = effective(state, self.stale_policy or "") == "allow"
            return "reject", "allow" if allow else "reject"
        return (effective(state, legacy_default(self.unknown_policy, self.fail_open)),
                effective(state, legacy_default(self.stale_policy, self.fail_open)))  # fmt: skip


# ---------------------------------------------------------------------- records ----

#: (wall_from, wall_until, mono_until): fresh while wall_from <= now <= wall_until and the
#: monotonic clock <= mono_until
Window = tuple[float, float, float]
NO_WINDOW: Window = (INF, -INF, -INF)


def window(published_s: float, valid_s: float, seen: Any, grace_s: float, skew_s: float) -> Window:
    """``core.liveness.judge_liveness`` as a window: the published time is not ahead once the
    wall clock reaches ``published_s - skew_s``; its age is the time since ``seen`` changed it
    (monotonic), or, before a change was seen, the larger of that and the publisher's age."""
    limit = valid_s + grace_s
    wall_from = published_s - skew_s
    if seen is None:
        return wall_from, published_s + limit, INF
    if seen.changed:
        return wall_from, INF, seen.at_s + limit
    return wall_from, published_s + limit, seen.at_s + limit


class NodeRecord:
    """What judging one node needs: ``state`` (the Node cache's object), ``left`` (``state``
    less the reservations still counting), ``raw`` and ``fits`` (the free MiB of the healthy
    GPUs of ``state`` and of ``left``, most free first), ``free`` (``left``'s free MiB on
    healthy GPUs), ``win`` (its telemetry's fresh ``Window``; ``NO_WINDOW`` when the telemetry
    is unusable or the health bad: never fresh), ``version`` (the ledger's version it was built
    at), ``until`` (when a reservation stops counting by age: rebuilt then), and the Lease it
    was last judged by with that Lease's window (``lease``, ``lease_win``)."""

    __slots__ = ("state", "version", "until", "left", "raw", "fits", "free", "win", "lease",
                 "lease_win")  # fmt: skip

    def __init__(self, state: NodeGpuState, left: NodeGpuState, win: Window, version: int,
                 until: float) -> None:  # fmt: skip
        self.state, self.left, self.win = state, left, win
        self.raw = _sorted_free(state)
        self.fits = _sorted_free(left) if left is not state else self.raw
        self.free = left.free_total_mib
        self.version, self.until = version, until
        self.lease: Any = None
        self.lease_win: Window = NO_WINDOW


def _sorted_free(state: NodeGpuState) -> tuple[int, ...]:
    return tuple(sorted((g.free_mib for g in state.gpus if g.healthy), reverse=True))


def build_record(state: NodeGpuState, live: Sequence[Placement], ctx: JudgingContext, *,
                 version: int, until: float) -> NodeRecord:  # fmt: skip
    """The record of ``state`` with ``live`` (the reservations still counting on its node:
    ``inflight.pending``; the first stops counting by age at ``until``, epoch s) at the
    ledger's ``version`` of the node; windows by ``ctx``'s ``ttl_s``, ``grace_s`` and
    ``max_skew_s``."""
    win = NO_WINDOW
    if (state.known and state.read_at is not None and not state.problem
            and state.health is not None and state.health not in BAD_HEALTH):  # fmt: skip
        read_at = state.read_at
        valid = state.expires_at - read_at if state.expires_at is not None else ctx.ttl_s
        win = window(read_at, valid, seen_of(state), ctx.grace_s, ctx.max_skew_s)
    return NodeRecord(state, adjust(state, live), win, version, until)


def fresh_window(rec: NodeRecord | None, ctx: JudgingContext) -> tuple[float, float, Any] | None:
    """``(wall_until, mono_until, Lease or None)`` when ``rec``'s node is usable, healthy and
    fresh at ``ctx``'s clocks by its window (its telemetry's, or the Lease's it names when
    ``ctx.leases`` is set): what ``node_liveness`` says, read from the record; ``None``
    otherwise (then ``judge`` decides)."""
    if rec is None or ctx.now_mono is None:
        return None
    now, mono = ctx.now, ctx.now_mono
    ref = rec.state.lease if ctx.leases is not None else None
    w = rec.win
    if ref is None:
        return (w[1], w[2], None) if w[0] <= now <= w[1] and mono <= w[2] else None
    lease = ctx.leases(ref)  # type: ignore[misc]
    if lease is None or not lease.holder:
        return None
    if lease is not rec.lease:
        rec.lease = lease
        rec.lease_win = window(lease.renewed_at, lease.duration_s, lease.seen, ctx.grace_s,
                               ctx.max_skew_s)  # fmt: skip
    lw = rec.lease_win
    fresh = w[0] <= now and lw[0] <= now <= lw[1] and mono <= lw[2]
    return (lw[1], lw[2], lease) if fresh else None


# ---------------------------------------------------------------------- the rule ----


def room(rec: NodeRecord, need: Need, prefix: str) -> Verdict:
    """The room part of the rule on a usable, healthy node: fits (scored by ``free_mib``), or
    fails with ``IN_FLIGHT`` (``rec.state`` had room, the reservations took it) or
    ``NO_ROOM``."""
    if need.slices:
        free = slice_room(rec.left, need)
        if free is not None:
            return Verdict(True, fits=True, free_mib=free)
        taken = rec.left is not rec.state and slice_room(rec.state, need) is not None
    else:
        k, mem = need.count - 1, need.memory_mib
        f = rec.fits
        if len(f) > k and f[k] >= mem:
            return Verdict(True, fits=True, free_mib=rec.free)
        r = rec.raw
        taken = len(r) > k and r[k] >= mem
    return _room_failures(need, prefix)[taken]


def room_on(state: NodeGpuState, live: Sequence[Placement], need: Need,
            prefix: str = "omaticaya.io") -> Verdict:  # fmt: skip
    """``room`` on a record made for ``state`` with the reservations ``live`` still counting
    (taken off as the filter takes them, ``inflight.adjust``): the rule without the liveness
    part, which preemption judges a node by as it would be once its victims are gone
    (``victims.choose_victims``)."""
    return room(NodeRecord(state, adjust(state, live), NO_WINDOW, 0, INF), need, prefix)


def judge(rec: NodeRecord | None, need: Need, ctx: JudgingContext) -> Verdict:
    """The rule for one node (``rec`` ``None``: not in the Node cache); see the module's
    docstring. Liveness by ``core.liveness.node_liveness`` on the state's ``seen``."""
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
    alive = node_liveness(
        state, seen=seen_of(state), leases=ctx.leases, prefix=ctx.prefix,
        now_s=ctx.now, now_mono_s=ctx.now_mono, ttl_s=ctx.ttl_s, grace_s=ctx.grace_s,
        max_skew_s=ctx.max_skew_s,
    )  # fmt: skip
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
    return room(rec, need, ctx.prefix)


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
            yield name, room(rec, need, prefix)  # type: ignore[arg-type]

    return _tally(verdicts())


#: the reservations still counting on a node: (name, state) -> placements
InFlightOf = Callable[[str, "NodeGpuState | None"], Sequence[Placement]]


def judge_each(states: Iterable[tuple[str, NodeGpuState | None]], need: Need,
               ctx: JudgingContext, inflight: InFlightOf | None = None) -> Judged:  # fmt: skip
    """``judge`` of each ``(name, state)`` on a record made for this request (its ``inflight``
    reservations taken off), by the liveness rule itself: the rule without the cache (no
    ledger, preemption). Equal to ``judge_all`` over kept records (tests/test_fit_cache.py)."""

    def one(name: str, state: NodeGpuState | None) -> Verdict:
        if state is None:
            return judge(None, need, ctx)
        live = inflight(name, state) if inflight is not None else ()
        return judge(build_record(state, live, ctx, version=0, until=INF), need, ctx)

    return _tally((name, judge_safely(name, partial(one, name, state), ctx))
                  for name, state in states)  # fmt: skip


# ---------------------------------------------------------------------- scores ----


def scores(free: Mapping[str, int], strategy: str) -> dict[str, int]:
    """Scores 1..``MAX_PRIORITY`` of the fitting nodes by ``free`` MiB, linear between the
    least and the most free among them (all equal: ``MAX_PRIORITY``): ``binpack`` gives 10 to
    the least free, ``spread`` to the most. In ``map``: no Python code runs per node."""
    if not free:
        return {}
    lo, hi = min(free.values()), max(free.values())
    if hi == lo:
        return dict.fromkeys(free, MAX_PRIORITY)
    frac: Iterator[float] = map(truediv, map(sub, free.values(), repeat(lo)), repeat(hi - lo))
    if strategy == "binpack":
        frac = map(sub, repeat(1.0), frac)
    top = MAX_PRIORITY - 1
    return dict(zip(free, map(add, repeat(1), map(round, map(mul, frac, repeat(top)))),
                    strict=True))  # fmt: skip


# ---------------------------------------------------------------------- GPUs ----

#: (GPU index per slice, in the slices' order; the room of the GPU the largest went to, MiB)
Placed = tuple[tuple[int, ...], int]


def place_slices(gpus: Sequence[GpuInfo], mibs: Sequence[int], strategy: str,
                 unit_mib: int) -> Placed | None:  # fmt: skip
    """Each slice of ``mibs`` (MiB, whole units of ``unit_mib``, in container order: the order
    the kubelet asks the device plugin for them) on one healthy GPU of ``gpus`` whose room
    (``GpuInfo.room_mib``: the least of its live free memory and its units left) takes it after
    the earlier ones: ``binpack`` the least room that fits, ``spread`` the most (ties: the lower
    index), as the device plugin chooses. ``None`` when a slice fits on none."""
    books = {g.index: g for g in gpus if g.healthy}
    chosen: list[int] = []
    largest_room = 0
    largest = max(range(len(mibs)), key=lambda k: (mibs[k], -k), default=0)
    for i, mib in enumerate(mibs):
        fit = [(r, index) for index, g in books.items() if (r := g.room_mib(unit_mib)) >= mib]
        if not fit:
            return None
        f, index = min(fit) if strategy == "binpack" else min(fit, key=lambda t: (-t[0], t[1]))
        if i == largest:
            largest_room = f
        g = books[index]
        left = None if g.units_left is None else g.units_left - mib // unit_mib
        books[index] = replace(g, free_mib=g.free_mib - mib, units_left=left)
        chosen.append(index)
    return tuple(chosen), largest_room


def slice_room(state: NodeGpuState, need: Need) -> int | None:
    """The node's room for ``need``'s slices on ``state.shared``: the room of the GPU the
    largest slice goes to under best fit; ``None`` when they do not all fit (or the node shares
    no GPU)."""
    if not state.shared or not state.share_unit_mib:
        return None
    placed = place_slices(state.shared, need.slice_mibs(state.share_unit_mib), "binpack",
                          state.share_unit_mib)  # fmt: skip
    return None if placed is None else placed[1]


def choose_gpus(state: NodeGpuState, need: Need, strategy: str) -> tuple[int, ...]:
    """The ``need.count`` GPUs of ``state`` (free memory after the reservations) a pod needing
    ``need.memory_mib`` on each would be given: healthy, with that much free. ``need.exclusive``
    (whole devices from the device plugin): the ones the plugin hands out,
    ``core.sharing.device_order`` (most free first), since the plugin does not know the pod's
    need; else ``binpack`` the ones with the least room that fits, ``spread`` the most. ``()``
    when fewer than ``need.count`` fit."""
    fit = [g for g in state.gpus if g.healthy and g.free_mib >= need.memory_mib]
    if len(fit) < need.count:
        return ()
    if need.exclusive:
        fit.sort(key=lambda g: device_order(g.healthy, g.free_mib, g.index))
    else:
        fit.sort(key=lambda g: (g.free_mib if strategy == "binpack" else -g.free_mib, g.index))
    return tuple(sorted(g.index for g in fit[: need.count]))
