"""What judging a node needs besides the pod (pure): the request's context, and each node's
record (its GPU state less the reservations still counting, and its telemetry's fresh window).

``JudgingContext`` is built once per request; a ``NodeRecord`` once per node change
(``build_record``), kept by the Node index (``cache``). ``fresh_window`` reads the liveness rule
(``core.rules.liveness.node_liveness``) off the record's window, for ``fit.judge_all``'s fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.allocation.placement import DEFAULT_POLICY
from ..core.rules.liveness import DEFAULT_MAX_CLOCK_SKEW_S, LeaseOf
from ..core.schema import NodeGpuState
from .inflight import Placement, adjust
from .nodeview import BAD_HEALTH, effective, legacy_default, seen_of

__all__ = ["BAD_HEALTH", "NO_WINDOW", "JudgingContext", "NodeRecord", "ProblemOf", "Window",
           "ages_s", "build_record", "fresh_window", "window"]  # fmt: skip

INF = float("inf")

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
    #: the placement policy (``core.allocation.placement.POLICIES``), the device plugin's too
    policy: str = DEFAULT_POLICY

    @classmethod
    def of(cls, settings: Any, now: float, now_mono: float | None = None,
           leases: LeaseOf | None = None, on_problem: ProblemOf | None = None
           ) -> JudgingContext:  # fmt: skip
        """The context of ``settings`` (``ExtenderSettings``) at ``now`` with the request's
        ``leases`` (a synced Lease watch) and ``on_problem``."""
        s = settings
        return cls(now, s.ttl_s, s.grace_s, now_mono, s.max_clock_skew_s, s.prefix,
                   s.stale_policy, s.unknown_policy, s.fail_open, leases, on_problem,
                   policy=s.placement_policy)  # fmt: skip

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
    """``core.rules.liveness.judge_liveness`` as a window: the published time is not ahead once the
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
    facts = getattr(state, "facts", None)  # a NodeView's, made when the Node cache stored it
    if facts is not None:
        return facts.free_desc[: facts.healthy]
    return tuple(sorted((g.free_mib for g in state.gpus if g.healthy), reverse=True))


def build_record(state: NodeGpuState, live: Sequence[Placement], ctx: JudgingContext, *,
                 version: int, until: float) -> NodeRecord:  # fmt: skip
    """The record of ``state`` with ``live`` (the reservations still counting on its node:
    ``inflight.pending``; the first stops counting by age at ``until``, on ``ages_s``'s clock) at the
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


def ages_s(ctx: JudgingContext) -> float:
    """The clock reservations age on, now: the request's monotonic clock (the extender's own:
    a step of the wall clock or a server's skew never ages or revives one), or its wall clock
    when it has none (judging without watches)."""
    return ctx.now_mono if ctx.now_mono is not None else ctx.now
