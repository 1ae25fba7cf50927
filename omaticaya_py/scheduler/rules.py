"""Pure placement rules: filter and prioritize over the nodes' GPU state, for a pod's need
(``need``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.liveness import AHEAD, DEFAULT_MAX_CLOCK_SKEW_S, STALE, LeaseOf, node_liveness
from ..core.schema import NodeGpuState
from .inflight import Placement, adjust
from .need import MAX_GPU_COUNT, MAX_MEMORY_MIB, Need, parse_need
from .slices import slice_reasons, slice_room
from .staleness import effective, legacy_default

__all__ = [
    "MAX_GPU_COUNT",
    "MAX_MEMORY_MIB",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "InFlightOf",
    "LeaseOf",
    "Need",
    "ProblemOf",
    "Verdict",
    "filter_nodes",
    "judge",
    "parse_need",
    "prioritize_nodes",
]

#: the in-flight placements that count against a node: (name, state) -> placements
InFlightOf = Callable[[str, "NodeGpuState | None"], Sequence[Placement]]

#: told of each node judged: (name, problem, detail). ``problem``: a short fixed name for
#: counting (a published time ahead of the clock, judging raised), ``None``: none this time
ProblemOf = Callable[[str, "str | None", str], None]

MAX_PRIORITY = 10
MIN_PRIORITY = 0

BAD_HEALTH = frozenset({"Unhealthy", "Unknown"})


# ------------------------------------------------------------------------------ rules ----


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's filter result: ``ok`` (passes), ``reason`` (why not: ends up in the pod's
    FailedScheduling event), ``fits`` (passes on known data: it gets a score), ``free_mib``
    (the node's free memory on healthy GPUs less the in-flight pods': what it is scored by),
    ``problem`` (a short fixed name for counting, when the node's data is unusable at judging
    time: a time ahead of the clock, or judging raised)."""

    ok: bool
    reason: str = ""
    fits: bool = False
    free_mib: int = 0
    problem: str | None = None


def _gpus_text(count: int) -> str:
    return "a GPU" if count == 1 else f"{count} GPUs"


def judge(
    state: NodeGpuState | None,
    need: Need,
    *,
    now: float,
    ttl_s: float,
    grace_s: float,
    fail_open: bool,
    prefix: str = "omaticaya.io",
    stale_policy: str | None = None,
    unknown_policy: str | None = None,
    inflight: Sequence[Placement] = (),
    leases: LeaseOf | None = None,
    now_mono: float | None = None,
    max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
    left: NodeGpuState | None = None,
) -> Verdict:
    """The filter rule for one node (``state`` ``None``: the node is not in the cache).

    Stale and unknown nodes follow their policy (``scheduler.staleness``: the node's override,
    else ``stale_policy``/``unknown_policy``, else ``fail_open``'s score-zero or reject). The
    room check subtracts the ``inflight`` placements (``scheduler.inflight``) GPU by GPU, or
    uses ``left`` (``state`` with them already subtracted: ``nodeindex.NodeRecord.left``).
    A need of slices (``Need.slices``) fits when each slice fits on one healthy shared GPU
    (``slices.slice_room``: the verdict's ``free_mib`` is that GPU's room).
    Fresh or stale is ``core.liveness.node_liveness`` (``now``: wall clock, ``now_mono``:
    monotonic, against the state's ``seen``); with ``leases`` (a synced Lease watch), a node
    whose telemetry names a Lease is judged by that Lease. A published time more than
    ``max_skew_s`` ahead of ``now`` is unusable telemetry (``Verdict.problem`` set)."""
    if need.error:
        return Verdict(False, need.error)
    unknown_is = effective(state, legacy_default(unknown_policy, fail_open))
    stale_is = effective(state, legacy_default(stale_policy, fail_open))
    unknown = None if unknown_is == "reject" else Verdict(True)
    stale = None if stale_is == "reject" else Verdict(True)
    if state is None:
        return unknown or Verdict(False, "node(s) not yet in the omaticaya extender's cache")
    if not state.known:
        return unknown or Verdict(
            False, f"node(s) had no GPU telemetry ({prefix} labels missing: no agent)"
        )
    if state.read_at is None or state.problem:
        why = state.problem or "no telemetry annotation"
        return unknown or Verdict(False, f"node(s) had unusable GPU telemetry ({why})")
    alive = node_liveness(
        state, seen=getattr(state, "seen", None), leases=leases, prefix=prefix, now_s=now,
        now_mono_s=now_mono, ttl_s=ttl_s, grace_s=grace_s, max_skew_s=max_skew_s,
    )  # fmt: skip
    if alive.kind == AHEAD:
        if unknown is not None:
            return Verdict(True, problem=alive.problem)
        return Verdict(
            False, f"node(s) had unusable GPU telemetry ({alive.why})", problem=alive.problem
        )
    if alive.kind == STALE and stale_is != "allow":
        return stale or Verdict(
            False, f"node(s) had stale GPU telemetry ({alive.why}: agent not reporting)"
        )
    if state.health in BAD_HEALTH or state.health is None:
        return Verdict(False, f"node(s) had GPU health {state.health or 'Unknown'} ({prefix})")
    if left is None:
        left = adjust(state, inflight) if inflight else state
    if need.slices:
        room = slice_room(left, need)
        if room is not None:
            return Verdict(True, fits=True, free_mib=room)
        no_room, taken = slice_reasons(need, prefix)
        return Verdict(False, taken if left is not state and slice_room(state, need) is not None
                       else no_room)  # fmt: skip
    fitting = sum(1 for g in left.gpus if g.healthy and g.free_mib >= need.memory_mib)
    if fitting < need.count:
        wanted = f"pod needs {_gpus_text(need.count)} with {need.memory_mib} MiB free"
        if left is not state and need.count <= sum(
            1 for g in state.gpus if g.healthy and g.free_mib >= need.memory_mib
        ):
            return Verdict(
                False,
                f"node(s) had room taken by in-flight pods: {wanted}, and pods placed there "
                f"are not in its telemetry yet ({prefix})",
            )
        return Verdict(False, f"node(s) had no room: {wanted} ({prefix})")
    return Verdict(True, fits=True, free_mib=left.free_total_mib)


#: the ``Verdict.problem`` of a node on which judging raised: ``judging raised <type>``
JUDGING_RAISED = "judging raised"


#: judge one node: (state, its in-flight placements) -> verdict (``judge`` with the request's
#: arguments bound)
Judging = Callable[["NodeGpuState | None", Sequence[Placement]], Verdict]


def judge_safely(
    name: str,
    state: NodeGpuState | None,
    judging: Judging,
    inflight: InFlightOf | None,
    on_problem: ProblemOf | None,
) -> Verdict:
    """``judging`` of the node ``name`` with its in-flight placements: whatever a node carries,
    an exception while judging it (its placements included) is that node's failure, with the
    reason, never the request's; ``on_problem(name, problem, detail)`` hears of the verdict's
    ``problem`` (``None`` when it has none)."""
    try:
        verdict = judging(state, inflight(name, state) if inflight is not None else ())
        detail = verdict.reason
    except Exception as exc:  # noqa: BLE001 - one node's data must not fail the others
        problem = f"{JUDGING_RAISED} {type(exc).__name__}"
        why = f"node(s) could not be judged by the omaticaya extender ({problem})"
        verdict = Verdict(False, why, problem=problem)
        detail = f": {str(exc)[:200]}"
    if on_problem is not None:
        on_problem(name, verdict.problem, detail)
    return verdict


def filter_nodes(
    need: Need | None,
    states: Iterable[tuple[str, NodeGpuState | None]],
    *,
    now: float,
    ttl_s: float,
    grace_s: float,
    fail_open: bool,
    prefix: str = "omaticaya.io",
    stale_policy: str | None = None,
    unknown_policy: str | None = None,
    inflight: InFlightOf | None = None,
    leases: LeaseOf | None = None,
    now_mono: float | None = None,
    max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
    on_problem: ProblemOf | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(names that pass, {name: reason} for those that fail), in input order. Each node is
    judged alone: one on which judging raises fails with that reason (``judge_safely``), and
    ``on_problem`` hears of every node's ``Verdict.problem``."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    if need is None:
        return [name for name, _ in states], failed

    def judging(state: NodeGpuState | None, placed: Sequence[Placement]) -> Verdict:
        return judge(
            state, need, now=now, ttl_s=ttl_s, grace_s=grace_s, fail_open=fail_open,
            prefix=prefix, stale_policy=stale_policy, unknown_policy=unknown_policy,
            inflight=placed, leases=leases, now_mono=now_mono, max_skew_s=max_skew_s,
        )  # fmt: skip

    for name, state in states:
        v = judge_safely(name, state, judging, inflight, on_problem)
        if v.ok:
            passed.append(name)
        else:
            failed[name] = v.reason
    return passed, failed


def prioritize_nodes(
    need: Need | None,
    states: Iterable[tuple[str, NodeGpuState | None]],
    *,
    strategy: str,
    now: float,
    ttl_s: float,
    grace_s: float,
    prefix: str = "omaticaya.io",
    stale_policy: str | None = None,
    inflight: InFlightOf | None = None,
    leases: LeaseOf | None = None,
    now_mono: float | None = None,
    max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
    on_problem: ProblemOf | None = None,
) -> list[dict[str, Any]]:
    """A HostPriorityList: ``[{"Host": name, "Score": 0..10}]`` in input order.

    Fitting nodes score 1..10 by the free memory on their healthy GPUs, linearly between the
    least and the most free among them (all equal: 10); ``binpack`` gives 10 to the least free,
    ``spread`` to the most, after the in-flight pods' memory is taken off. A stale node under
    the ``allow`` policy is scored on its last reading. Others (or every node for a pod
    without a need): 0."""
    items = list(states)
    if need is None or need.error:
        return [{"Host": name, "Score": MIN_PRIORITY} for name, _ in items]
    free: dict[str, int] = {}

    def judging(state: NodeGpuState | None, placed: Sequence[Placement]) -> Verdict:
        return judge(
            state, need, now=now, ttl_s=ttl_s, grace_s=grace_s, fail_open=False, prefix=prefix,
            stale_policy="allow" if effective(state, stale_policy or "") == "allow" else "reject",
            inflight=placed, leases=leases, now_mono=now_mono, max_skew_s=max_skew_s,
        )  # fmt: skip

    for name, state in items:
        v = judge_safely(name, state, judging, inflight, on_problem)
        if v.fits and state is not None:
            free[name] = v.free_mib
    out = []
    lo, hi = (min(free.values()), max(free.values())) if free else (0, 0)
    span = hi - lo
    for name, _ in items:
        if name not in free:
            score = MIN_PRIORITY
        elif span == 0:
            score = MAX_PRIORITY
        else:
            frac = (free[name] - lo) / span  # 0: least free, 1: most free
            if strategy == "binpack":
                frac = 1.0 - frac
            score = 1 + round(frac * (MAX_PRIORITY - 1))
        out.append({"Host": name, "Score": score})
    return out
