"""The fit rule (``scheduler.fit``) pinned where a mutation run found no test (``scripts/mutation``):
each gate's whole verdict (not only pass/fail), the policies prioritize judges by, the detail the
problem sink hears, the window at its exact edges (the liveness rule is inclusive there), the
in-flight reason at the exact fit, slices' texts and choices, which whole GPUs an exclusive pod
gets. Table-driven; each row names what it pins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.rules.liveness import LeaseState, LivenessClock, Seen, node_liveness
from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.fit import (
    INF,
    PASS_UNSCORED,
    JudgingContext,
    Reason,
    Verdict,
    build_record,
    by_links,
    choose_gpus,
    fresh_window,
    judge,
    judge_all,
    judge_each,
    judge_safely,
    place_slices,
    reason_text,
    room_failure,
    room_on,
    scores,
    slice_room,
    wanted_text,
)
from omaticaya_py.scheduler.inflight import Placement, pending
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.nodeview import NodeView

NOW = 1_800_000_000.0
P = "example.com"
NEED = Need(30000)
REF = "omaticaya/lease-n"


def node(*free: int, read_age_s: float = 5.0, **kw: Any) -> NodeGpuState:
    gpus = tuple(GpuInfo(i, f, True) for i, f in enumerate(free))
    return NodeGpuState(**{"name": "n", "known": True, "health": "Healthy",
                           "read_at": NOW - read_age_s, "expires_at": NOW - read_age_s + 330,
                           "gpus": gpus, "free_total_mib": sum(free), **kw})  # fmt: skip


def view(state: NodeGpuState, **kw: Any) -> NodeView:
    return NodeView(**{f: getattr(state, f) for f in NodeGpuState.__dataclass_fields__}, **kw)


def ctx(**kw: Any) -> JudgingContext:
    return JudgingContext(**{"now": NOW, "ttl_s": 300, "grace_s": 60, "now_mono": 0.0,
                             "max_skew_s": 300, "prefix": P, **kw})  # fmt: skip


def record(state: NodeGpuState, live: tuple[Placement, ...] = (), c: JudgingContext | None = None
           ) -> Any:  # fmt: skip
    return build_record(state, live, c or ctx(), version=0, until=INF)


def reserved(mib: int, gpus: tuple[int, ...] = (0,)) -> Placement:
    return Placement("ns/r", "r", "n", mib, len(gpus), placed_at=NOW, gpus=gpus, bound=False)


STALE = {"read_age_s": 600.0}
AHEAD = {"read_age_s": -400.0}


def why(code: Reason, **fields: Any) -> Any:
    return reason_text(code, **{"prefix": P, **fields})


# ----------------------------------------------------------------- each gate's verdict ----

GATES = [
    ("a bad pod fails with its own words", node(70000), Need(0, 1, "bad annotation"), {},
     Verdict(False, why(Reason.BAD_POD, why="bad annotation"))),
    ("not in the cache", None, NEED, {}, Verdict(False, why(Reason.NOT_IN_CACHE))),
    ("not in the cache, unknown allowed: passes unscored", None, NEED,
     {"unknown_policy": "allow"}, PASS_UNSCORED),
    ("no labels", NodeGpuState(name="n"), NEED, {}, Verdict(False, why(Reason.NO_TELEMETRY))),
    ("labels, no telemetry annotation", replace(node(70000), read_at=None), NEED, {},
     Verdict(False, why(Reason.UNUSABLE_TELEMETRY, why="no telemetry annotation"))),
    ("a problem in the telemetry", replace(node(70000), problem="bad JSON"), NEED, {},
     Verdict(False, why(Reason.UNUSABLE_TELEMETRY, why="bad JSON"))),
    ("ahead of the clock: unusable, the problem named", node(70000, **AHEAD), NEED, {},
     Verdict(False, why(Reason.UNUSABLE_TELEMETRY,
                        why=node_liveness(node(70000, **AHEAD), LivenessClock(NOW, 60, None, 300),
                                          ttl_s=300, prefix=P).why),
             problem="telemetry read_at ahead of the clock")),
    ("ahead, unknown allowed: passes unscored, the problem still named", node(70000, **AHEAD),
     NEED, {"unknown_policy": "allow"},
     Verdict(True, problem="telemetry read_at ahead of the clock")),
    ("stale: the reason names the prefix's annotation", node(70000, **STALE), NEED, {},
     Verdict(False, why(Reason.STALE,
                        why=f"{P}/telemetry expired at 2027-01-15T07:55:30Z, grace 60s"))),
    ("stale, score-zero: passes unscored", node(70000, **STALE), NEED,
     {"stale_policy": "score-zero"}, PASS_UNSCORED),
    ("stale, allow: judged on its last reading", node(70000, **STALE), NEED,
     {"stale_policy": "allow"}, Verdict(True, fits=True, free_mib=70000)),
    ("unhealthy", replace(node(70000), health="Unhealthy"), NEED, {},
     Verdict(False, why(Reason.UNHEALTHY, health="Unhealthy"))),
    ("no health label reads Unknown", replace(node(70000), health=None), NEED, {},
     Verdict(False, why(Reason.UNHEALTHY, health="Unknown"))),
    ("fits", node(70000, 40000), NEED, {}, Verdict(True, fits=True, free_mib=110000)),
    ("no room", node(20000), NEED, {},
     Verdict(False, why(Reason.NO_ROOM, wanted="pod needs a GPU with 30000 MiB free"))),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "need", "kw", "verdict"), GATES,
                         ids=[g[0] for g in GATES])  # fmt: skip
def test_each_gate_gives_its_whole_verdict(case, state, need, kw, verdict):
    c = ctx(**kw)
    got = judge(record(state, c=c) if state is not None else None, need, c)
    assert got == verdict, case
    assert (got.reason.code if got.reason else None) == (verdict.reason.code if verdict.reason
                                                         else None), case  # fmt: skip


# ---------------------------------------------------------- prioritize's policies ----

SCORING = [
    ("unknown never scores, whatever the unknown policy", None, {"unknown_policy": "allow"},
     Verdict(False, why(Reason.NOT_IN_CACHE))),
    ("stale, the request allows: scored on its last reading", node(70000, **STALE),
     {"stale_policy": "allow"}, Verdict(True, fits=True, free_mib=70000)),
    ("stale, the node allows: scored", view(node(70000, **STALE), policy="allow"), {},
     Verdict(True, fits=True, free_mib=70000)),
    ("stale, score-zero: not scored (fails)", node(70000, **STALE),
     {"stale_policy": "score-zero"}, Verdict(False, why(Reason.STALE, why=node_liveness(
         node(70000, **STALE), LivenessClock(NOW, 60), ttl_s=300, prefix=P).why))),
    ("stale, the node rejects over the request's allow", view(node(70000, **STALE),
     policy="reject"), {"stale_policy": "allow"}, Verdict(False, why(Reason.STALE, why=node_liveness(
         node(70000, **STALE), LivenessClock(NOW, 60), ttl_s=300, prefix=P).why))),
    ("ahead, unknown allowed: no score", node(70000, **AHEAD), {"unknown_policy": "allow"},
     Verdict(False, why(Reason.UNUSABLE_TELEMETRY, why=node_liveness(
         node(70000, **AHEAD), LivenessClock(NOW, 60, None, 300), ttl_s=300, prefix=P).why),
         problem="telemetry read_at ahead of the clock")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "kw", "verdict"), SCORING, ids=[s[0] for s in SCORING])
def test_prioritize_judges_by_its_own_policies(case, state, kw, verdict):
    c = ctx(scoring=True, **kw)
    assert judge(record(state, c=c) if state is not None else None, NEED, c) == verdict, case


# ------------------------------------------------------------- the problem sink ----


def test_the_problem_sink_hears_the_reason_or_nothing_and_a_cut_exception():
    heard: list[tuple[str, str | None, str]] = []
    c = ctx(on_problem=lambda *a: heard.append(a))
    judge_all([("ahead", record(node(70000, **AHEAD))), ("fresh", record(node(70000)))], NEED, c,
              flagged={"fresh"})  # fmt: skip
    ahead = judge(record(node(70000, **AHEAD)), NEED, c)
    assert heard == [("ahead", "telemetry read_at ahead of the clock", ahead.reason),
                     ("fresh", None, "")]  # fmt: skip
    heard.clear()
    judge_all([("ahead", record(node(70000, **AHEAD)))], NEED,
              replace(c, unknown_policy="allow"))  # fmt: skip
    assert heard == [("ahead", "telemetry read_at ahead of the clock", "")]
    heard.clear()

    class Boom:
        state = node(70000)
        win = (INF, -INF, -INF)

        @property
        def fits(self) -> Any:  # what the room rule reads first
            raise ValueError("x" * 300)

    fits, passed, failed = judge_all([("boom", Boom())], NEED, c)  # type: ignore[list-item]
    assert failed["boom"].code is Reason.JUDGING_FAILED and not fits and not passed
    assert heard == [("boom", "judging raised ValueError", ": " + "x" * 200)]


def test_a_node_judged_fresh_by_its_window_is_told_only_when_flagged():
    heard: list[Any] = []
    c = ctx(on_problem=lambda *a: heard.append(a))
    judge_all([("a", record(node(70000))), ("b", record(node(70000)))], NEED, c, flagged={"b"})
    assert heard == [("b", None, "")]


# --------------------------------------------------------- the window at its edges ----

R = NOW - 5  # read_at of node(): valid 330 s, grace 60 s: fresh up to R + 390 inclusive
EDGES = [
    ("the wall clock at the window's end", node(70000), {"now": R + 390}, None),
    ("past it", node(70000), {"now": R + 390.001}, None),
    ("the wall clock at the skew's start", node(70000, read_age_s=-300), {"now": NOW}, None),
    ("the monotonic clock at the window's end", view(node(70000), seen=Seen(10.0, True)),
     {"now": NOW + 10_000, "now_mono": 400.0}, None),
    ("the monotonic clock past it", view(node(70000), seen=Seen(10.0, True)),
     {"now": NOW + 10_000, "now_mono": 400.001}, None),
    ("the Lease at its end (renewed + 40 + 60)", replace(node(70000), lease=REF),
     {"now": NOW + 100}, LeaseState("agent", NOW, 40)),
    ("the Lease past it", replace(node(70000), lease=REF), {"now": NOW + 100.001},
     LeaseState("agent", NOW, 40)),
    ("the Lease by the watch at its end", replace(node(70000), lease=REF),
     {"now": NOW + 50, "now_mono": 120.0}, LeaseState("agent", NOW, 40, Seen(20.0, True))),
    ("the Lease by the watch past it", replace(node(70000), lease=REF),
     {"now": NOW + 50, "now_mono": 120.001}, LeaseState("agent", NOW, 40, Seen(20.0, True))),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "kw", "lease"), EDGES, ids=[e[0] for e in EDGES])
def test_the_window_is_the_liveness_rule_at_its_edges(case, state, kw, lease):
    leases = {REF: lease}.get if lease is not None else None
    c = ctx(leases=leases, **kw)
    rec = record(state, c=c)
    fresh = node_liveness(state, LivenessClock(c.now, 60, c.now_mono, 300), ttl_s=300,
                          seen=getattr(state, "seen", None), leases=leases,
                          prefix=P).kind == "fresh"  # fmt: skip
    assert (fresh_window(rec, c) is not None) == fresh, case


def test_a_node_without_usable_telemetry_is_never_fresh_by_its_window():
    for state in (replace(node(70000), health="Unhealthy"), replace(node(70000), problem="x"),
                  replace(node(70000), read_at=None), NodeGpuState(name="n")):  # fmt: skip
        assert fresh_window(record(state), ctx()) is None, state
    assert fresh_window(record(node(70000)), ctx(now_mono=None)) is None  # not watched


# ------------------------------------------------------------------------ room ----

ROOM = [
    ("the reservation took an exact fit: in flight", node(30000), (reserved(10000),), NEED,
     Reason.IN_FLIGHT),
    ("never had room: no room", node(29999), (reserved(10000),), NEED, Reason.NO_ROOM),
    ("the exact fit, nothing reserved: fits", node(30000), (), NEED, None),
    ("slices: the reservation took the room: in flight",
     replace(node(), shared=(GpuInfo(0, 20 * 1024, True, units_left=20),), share_unit_mib=1024),
     (Placement("ns/r", "r", "n", 0, 0, placed_at=NOW, slices=(10,), gpus=(0,), bound=False),),
     Need(0, 1, slices=(15,)), Reason.IN_FLIGHT),
    ("slices: never had room: no room",
     replace(node(), shared=(GpuInfo(0, 10 * 1024, True, units_left=20),), share_unit_mib=1024),
     (Placement("ns/r", "r", "n", 0, 0, placed_at=NOW, slices=(5,), gpus=(0,), bound=False),),
     Need(0, 1, slices=(15,)), Reason.NO_ROOM),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "live", "need", "code"), ROOM, ids=[r[0] for r in ROOM])
def test_in_flight_or_no_room(case, state, live, need, code):
    v = judge(record(state, live), need, ctx())
    assert (v.reason.code if v.reason is not None else None) is code, (case, v)


def test_shared_gpus_without_a_unit_have_no_room():
    state = replace(node(), shared=(GpuInfo(0, 80000, True),), share_unit_mib=None)
    assert slice_room(state, Need(0, 1, slices=(1,))) is None
    assert slice_room(replace(state, share_unit_mib=1024), Need(0, 1, slices=(1,))) == 80000


def test_no_slice_places_nothing():
    assert place_slices((GpuInfo(0, 80000, True),), [], "binpack", 1024) == ((), 0)


def test_spread_puts_a_slice_on_the_gpu_with_the_most_room():
    gpus = (GpuInfo(0, 80000, True), GpuInfo(1, 40000, True), GpuInfo(2, 60000, True))
    assert place_slices(gpus, [1024], "spread", 1024) == ((0,), 80000)
    assert place_slices(gpus, [1024], "binpack", 1024) == ((1,), 40000)


def test_the_rule_without_the_cache_takes_off_what_the_reading_does_not_show():
    """``judge_each`` hands each node's reading to ``inflight``: a reservation the reading
    already shows (its pod a holder) no longer takes the room."""
    state = replace(node(40000), holders=frozenset({"ns/r"}))
    shown = replace(reserved(30000), started_at=NOW - 60, bound=True, placed_at=NOW - 60)
    asked: list[Any] = []

    def inflight(name: str, st: Any) -> Any:
        asked.append((name, st))
        return pending([shown], st, now=NOW, settle_s=600)

    fits, _, failed = judge_each([("n", state)], NEED, ctx(), inflight)
    assert asked == [("n", state)] and fits == {"n": 40000} and failed == {}


def test_a_slice_takes_its_units_from_the_gpu_it_goes_to():
    gpus = (GpuInfo(0, 80000, True, units_left=3), GpuInfo(1, 80000, True, units_left=4))
    # at 1 MiB a unit: the first slice (3 units) fills GPU 0's units; the second goes to GPU 1
    assert place_slices(gpus, [3, 3], "binpack", 1) == ((0, 1), 3)


WANTED = [
    (Need(30720), "pod needs a GPU with 30720 MiB free"),
    (Need(1024, 3), "pod needs 3 GPUs with 1024 MiB free"),
    (Need(0, 1, slices=(20,)), "pod needs 20 units of omaticaya.io/gpu-memory on one shared GPU "
     "with the slice free"),
    (Need(0, 1, slices=(10, 20, 5)), "pod needs slices of 20 + 10 + 5 units of "
     "omaticaya.io/gpu-memory (each on one shared GPU) with the slice free"),
]  # fmt: skip


@pytest.mark.parametrize(("need", "text"), WANTED)
def test_how_a_reason_names_the_need(need, text):
    assert wanted_text(need) == text


CHOICES = [
    ("exclusive: the most free first", (50000, 70000), Need(1000, 1, exclusive=True), (1,)),
    ("exclusive: equal free, the lower index", (70000, 70000), Need(1000, 1, exclusive=True), (0,)),
    ("exclusive: two of three", (50000, 70000, 60000), Need(1000, 2, exclusive=True), (1, 2)),
    ("binpack: the least room that fits", (50000, 70000), Need(1000, 1), (0,)),
    ("an exact fit fits", (1000, 900), Need(1000, 1), (0,)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "free", "need", "gpus"), CHOICES, ids=[c[0] for c in CHOICES])
def test_which_gpus_a_pod_gets(case, free, need, gpus):
    assert choose_gpus(node(*free), need, "binpack") == gpus, case


# ------------------------------------------------- the second mutation run's survivors ----

UNIT = 1024


def shared(*units: int, free_mib: int = 80000) -> NodeGpuState:
    """A fresh node with no whole GPU and a shared GPU per ``units`` (units left each, 1 GiB a
    unit)."""
    return replace(node(), shared=tuple(GpuInfo(i, free_mib, True, units_left=u)
                                        for i, u in enumerate(units)), share_unit_mib=UNIT)  # fmt: skip


def test_judging_passes_the_context_policy_to_the_room_rule():
    """A slice's score is the room of the GPU it goes to: spread takes the roomiest, binpack
    the tightest, through ``judge`` and the kept verdicts' fast path alike."""
    state, need = shared(20, 10), Need(0, 1, slices=(5,))
    for policy, room in (("spread", 20 * UNIT), ("binpack", 10 * UNIT)):
        c = ctx(policy=policy)
        assert judge(record(state, c=c), need, c) == Verdict(True, fits=True, free_mib=room)
        assert fresh_window(record(state, c=c), c) is not None  # judge_all's fast path
        assert judge_all([("n", record(state, c=c))], need, c) == ({"n": room}, [], {}), policy


def test_in_flight_or_no_room_is_judged_under_the_context_policy():
    """Slices of 3, 2, 2 and 2 units on GPUs of 6 and 3 fit under binpack, never under spread:
    under spread the node never had room (NO_ROOM), whatever binpack would say."""
    state, need = shared(6, 3), Need(0, 1, slices=(3, 2, 2, 2))
    live = (Placement("ns/r", "r", "n", 0, 0, placed_at=NOW, slices=(1,), gpus=(0,),
                      bound=False),)  # fmt: skip
    codes = {}
    for policy in ("binpack", "spread"):
        c = ctx(policy=policy)
        v = judge(record(state, live, c), need, c)
        codes[policy] = v.reason.code if v.reason is not None else None
    assert codes == {"binpack": Reason.IN_FLIGHT, "spread": Reason.NO_ROOM}


ROOM_PATHS = [
    ("no memory asked: an assigned GPU has no room", (GpuInfo(0, 0, True, assigned=True),), {},
     Need(0, 1), False),
    ("no memory asked: a GPU no container holds", (GpuInfo(0, 0, True),), {}, Need(0, 1), True),
    ("a MIG need is judged on its MIG devices, never on whole GPUs", (GpuInfo(0, 70000, True),),
     {"mig": (GpuInfo(0, 10000, True, profile="1g.10gb", mig_index=0),)},
     Need(20000, 1, profile="1g.10gb"), False),
    ("slices alone: a stray memory_mib asks for no whole GPU", (),
     {"shared": (GpuInfo(0, 80000, True, units_left=20),), "share_unit_mib": UNIT},
     Need(1000, 1, slices=(5,)), True),
]  # fmt: skip


@pytest.mark.parametrize(("case", "gpus", "kw", "need", "ok"), ROOM_PATHS,
                         ids=[r[0] for r in ROOM_PATHS])  # fmt: skip
def test_the_sorted_free_shortcut_is_only_for_memory_on_whole_gpus(case, gpus, kw, need, ok):
    state = replace(node(), gpus=gpus, free_total_mib=sum(g.free_mib for g in gpus), **kw)
    assert judge(record(state), need, ctx()).ok is ok, case


def test_a_bad_need_is_never_judged_by_its_window():
    heard: list[Any] = []
    c = ctx(on_problem=lambda *a: heard.append(("problem", a)))
    bad = Need(0, 1, "bad annotation")
    judged = judge_all([("n", record(node(70000)))], bad, c, flagged={"n"},
                       on_fast=lambda *a: heard.append(("fast", a)))  # fmt: skip
    assert judged == ({}, [], {"n": why(Reason.BAD_POD, why="bad annotation")})
    assert heard == [("problem", ("n", None, why(Reason.BAD_POD, why="bad annotation")))]


def test_the_fast_path_does_not_run_the_liveness_rule_again(monkeypatch):
    from omaticaya_py.scheduler import fit

    ran: list[Any] = []
    real = fit.node_liveness
    monkeypatch.setattr(fit, "node_liveness", lambda *a, **k: ran.append(a) or real(*a, **k))
    c = ctx()
    assert judge_all([("n", record(node(70000)))], NEED, c) == ({"n": 70000}, [], {})
    assert ran == []
    assert judge(record(node(70000)), NEED, c).fits and len(ran) == 1  # judge itself runs it


def test_a_node_that_raises_gets_the_whole_failed_verdict():
    def boom() -> Verdict:
        raise KeyError("k")

    problem = "judging raised KeyError"
    assert judge_safely("n", boom, ctx()) == Verdict(
        False, why(Reason.JUDGING_FAILED, why=problem), problem=problem
    )


def test_the_clock_skew_allowed_is_the_context_one():
    """Published 200 s ahead: within the default 300 s, not within the context's 100 s."""
    state, c = node(70000, read_age_s=-200), ctx(max_skew_s=100)
    alive = node_liveness(state, LivenessClock(NOW, 60, 0.0, 100), ttl_s=300, prefix=P)
    assert judge(record(state, c=c), NEED, c) == Verdict(
        False, why(Reason.UNUSABLE_TELEMETRY, why=alive.why), problem=alive.problem
    )
    assert judge(record(state, c=ctx()), NEED, ctx()).fits


ROOM_ON = [
    ("fits, scored by the node's free MiB", node(70000, 40000), (), NEED, "binpack",
     Verdict(True, fits=True, free_mib=110000)),
    ("a reservation still counting takes the room", node(30000), (reserved(10000),), NEED,
     "binpack", Verdict(False, reason_text(Reason.IN_FLIGHT, prefix="omaticaya.io",
                                           wanted=wanted_text(NEED)))),
    ("never had room: the default prefix named", node(20000), (), NEED, "binpack",
     Verdict(False, reason_text(Reason.NO_ROOM, prefix="omaticaya.io",
                                wanted=wanted_text(NEED)))),
    ("spread: the slice's room is the roomiest GPU's", shared(20, 10), (),
     Need(0, 1, slices=(5,)), "spread", Verdict(True, fits=True, free_mib=20 * UNIT)),
    ("binpack: the tightest GPU's", shared(20, 10), (), Need(0, 1, slices=(5,)), "binpack",
     Verdict(True, fits=True, free_mib=10 * UNIT)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "live", "need", "policy", "verdict"), ROOM_ON,
                         ids=[r[0] for r in ROOM_ON])  # fmt: skip
def test_room_on_is_the_room_rule_on_a_node_as_preemption_sees_it(case, state, live, need,
                                                                  policy, verdict):  # fmt: skip
    got = room_on(state, live, need, policy=policy)
    assert got == verdict, case
    assert (got.reason.code if got.reason else None) == (verdict.reason.code if verdict.reason
                                                         else None), case  # fmt: skip
    if verdict.reason is not None:
        assert room_on(state, live, need, P).reason == reason_text(
            verdict.reason.code, prefix=P, wanted=wanted_text(need)
        ), case


@pytest.mark.parametrize(("case", "need", "ranked"), [
    ("two whole GPUs of the plugin's resource", Need(0, count=2, exclusive=True), True),
    ("one whole GPU: no pair to rank", Need(0, count=1, exclusive=True), False),
    ("two GPUs by annotation: nothing handed out", Need(1000, count=2), False),
    ("two MIG devices: their links are their GPU's", Need(0, count=2, exclusive=True, profile="1g.10gb"), False),
])  # fmt: skip
def test_which_needs_are_ranked_by_links(case, need, ranked):
    assert by_links(need) is ranked, case


@pytest.mark.parametrize(("policy", "want"), [
    ("spread", {"a": 1, "b": 3, "c": 10}),  # 1 + round(9 * 0.25) = 3
    ("binpack", {"a": 10, "b": 8, "c": 1}),  # 1 + round(9 * 0.75) = 8
])  # fmt: skip
def test_scores_of_float_free_are_the_linear_formula(policy, want):
    assert scores({"a": 0.0, "b": 2.5, "c": 10.0}, policy) == want


def test_links_that_differ_rank_before_free_memory_whatever_the_policy():
    free = {"a": 100, "b": 200, "c": 300}
    # a's set scores 50, c's 10, b publishes none (0): the best connected first, even binpacking
    assert scores(free, "binpack", links={"a": 50, "c": 10}) == {"a": 10, "b": 1, "c": 3}
    assert scores(free, "spread", links={"a": 50, "c": 10}) == {"a": 10, "b": 1, "c": 3}


def test_links_that_are_all_equal_leave_the_policy_to_free_memory():
    free = {"a": 100, "b": 200, "c": 300}
    same = {"a": 7, "b": 7, "c": 7}
    assert scores(free, "binpack", links=same) == scores(free, "binpack") == {"a": 10, "b": 5, "c": 1}
    assert scores(free, "spread", links=same) == {"a": 1, "b": 5, "c": 10}


def test_room_failure_is_no_room_unless_the_room_was_taken_in_flight():
    wanted = wanted_text(NEED)
    assert room_failure(NEED, P) == reason_text(Reason.NO_ROOM, wanted=wanted, prefix=P)
    assert room_failure(NEED, P, taken=True) == reason_text(Reason.IN_FLIGHT, wanted=wanted, prefix=P)
