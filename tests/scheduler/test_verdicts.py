"""The kept verdicts (``scheduler.cache``): after every kind of change a request judges only
the nodes that changed, and its answer is the one the fit rule gives without the cache
(``fit.judge_each``: a record made per request, liveness by the rule itself).

Each case is a sequence of steps on a small cluster (a Node rewritten, a reservation made, time
passing a node's window or its reservation's expiry, a Lease renewed or released, the clock
going back, a node leaving the cache); after each step the kept verdicts are compared with a
the rule without the cache over the same Nodes, and the nodes judged again are counted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.rules.liveness import LeaseState
from omaticaya_py.core.schema import NodeGpuState
from omaticaya_py.scheduler.cache import NodeIndex, Verdicts, VerdictsByNeed
from omaticaya_py.scheduler.fit import JudgingContext, judge_each
from omaticaya_py.scheduler.inflight import pending
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import Need
from tests.scheduler.ledger_support import NOW, node, res

NAMES = [f"n{i}" for i in range(6)]
NEED = Need(40960)
REF = "omaticaya/omaticaya-node-n5"


class World:
    """A Node cache, a ledger, Leases and the clocks, changed step by step."""

    def __init__(self) -> None:
        self.states: dict[str, NodeGpuState] = {n: node(n, 70000, 50000 - 10000 * i)
                                                for i, n in enumerate(NAMES)}  # fmt: skip
        self.states["n5"] = replace(self.states["n5"], lease=REF)
        self.leases: dict[str, LeaseState] = {REF: LeaseState("agent", NOW - 5, 40)}
        self.ledger = Ledger(settle_s=60, assume_s=30)
        self.now, self.mono = NOW, 0.0
        self.index = NodeIndex(self.states.get, self.ledger, settle_s=60, ttl_s=300, grace_s=60,
                               skew_s=300)  # fmt: skip

    def ctx(self, **more: Any) -> JudgingContext:
        return JudgingContext(self.now, 300, 60, now_mono=self.mono, max_skew_s=300,
                              leases=self.leases.get, **more)  # fmt: skip

    def fresh(self) -> tuple[dict[str, int], list[str], dict[str, str]]:
        """The rule without the cache, over the same Nodes and reservations."""

        def inflight(name: str, state: Any) -> Any:
            return pending(self.ledger.on_node(name), state, now=self.mono, settle_s=60,
                           assume_s=30)  # fmt: skip

        return judge_each([(n, self.states.get(n)) for n in NAMES], NEED, self.ctx(), inflight)


def _rewrite(w: World) -> None:
    w.states["n1"] = node("n1", 20000, 20000)


def _reserve(w: World) -> None:
    w.ledger.reserve(res("u", "n0", (0,), mib=40000, at=w.mono))  # ages on the monotonic clock


def _window_ends(w: World) -> None:
    w.states["n2"] = node("n2", 70000, read_age_s=300)  # expires_at = now + 25 s
    w.now += 1
    w.mono += 1


def _later(w: World) -> None:
    w.now += 30  # n2's window (expires_at + grace) is not over yet; the reservation's is
    w.mono += 30


def _much_later(w: World) -> None:
    w.now += 100  # past n2's window (read_at + 325 s + grace) and the Lease's
    w.mono += 100


def _lease_renewed(w: World) -> None:
    w.leases[REF] = LeaseState("agent", w.now - 1, 40)


def _lease_released(w: World) -> None:
    w.leases[REF] = LeaseState("", w.now - 1, 40)


def _clock_back(w: World) -> None:
    w.now -= 5


def _gone(w: World) -> None:
    del w.states["n3"]


def _nothing(w: World) -> None:
    pass


# (case, steps, nodes judged again at each step after the first request)
CASES = [
    ("nothing changed: nothing judged again", [_nothing, _nothing], [0, 0]),
    ("a Node rewritten: that node", [_rewrite, _nothing], [1, 0]),
    ("a reservation: that node", [_reserve, _nothing], [1, 0]),
    ("a reservation stops counting by age: that node", [_reserve, _later], [1, 1]),
    ("windows end: those nodes, then judged every time (stale)",
     [_window_ends, _nothing, _much_later, _nothing], [1, 0, 2, 2]),
    ("a Lease renewed, then released: that node", [_lease_renewed, _lease_released, _nothing],
     [1, 1, 1]),
    ("the clock goes back: every node", [_clock_back], [6]),
    ("a node leaves the cache: judged every time (not in the cache)", [_gone, _nothing], [1, 1]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "steps", "judged"), CASES, ids=[c[0] for c in CASES])
def test_kept_verdicts_equal_a_fresh_judging_and_judge_only_what_changed(case, steps, judged):
    w = World()
    kept = Verdicts(w.index, NEED)
    assert kept.judge(NAMES, w.ctx()) == w.fresh(), case
    assert kept.judged == len(NAMES)
    for step, want in zip(steps, judged, strict=True):
        step(w)
        before = kept.judged
        got = kept.judge(NAMES, w.ctx())
        assert got == w.fresh(), (case, step.__name__)
        assert kept.judged - before == want, (case, step.__name__)


def test_a_request_for_some_names_answers_for_those_only():
    w = World()
    kept = Verdicts(w.index, NEED)
    kept.judge(NAMES, w.ctx())
    _rewrite(w)
    fits, passed, failed = kept.judge(["n4", "n1", "n0"], w.ctx())
    assert list(fits) == ["n4", "n0"] and passed == [] and list(failed) == ["n1"]


def test_verdicts_are_kept_per_need_for_the_last_few():
    w = World()
    by_need = VerdictsByNeed(w.index, keep=2)
    first = by_need(Need(1000))
    assert by_need(Need(1000)) is first
    by_need(Need(2000))
    by_need(Need(3000))
    assert by_need(Need(1000)) is not first  # the least recently used went


def test_a_reservation_on_a_node_not_asked_about_counts_when_it_is(monkeypatch):
    w = World()
    kept = Verdicts(w.index, NEED)
    kept.judge(NAMES, w.ctx())
    _reserve(w)  # on n0
    kept.judge(["n1", "n2"], w.ctx())  # n0 not asked: forgotten, not judged
    assert kept.judge(NAMES, w.ctx()) == w.fresh()


@pytest.mark.parametrize("changes", [3, 10])  # within the ledger's memory, and past it
def test_more_changes_between_requests_than_the_ledger_remembers(monkeypatch, changes):
    import omaticaya_py.scheduler.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "MAX_CHANGES", 4)
    w = World()
    kept = Verdicts(w.index, NEED)
    kept.judge(NAMES, w.ctx())
    for i in range(changes):
        w.ledger.reserve(res(f"u{i}", NAMES[i % 3], (0,), mib=20000))
    before = kept.judged
    assert kept.judge(NAMES, w.ctx()) == w.fresh()
    assert kept.judged - before == 3  # the three nodes reserved on


LEDGER_CHANGES = [
    ("nothing since", 0, [], 0, []),
    ("two since", 0, ["a", "b"], 0, ["a", "b"]),
    ("since the first of three", 1, ["a", "b", "c"], 1, ["b", "c"]),
    ("more than it keeps (4)", 0, ["a", "b", "c", "d", "e"], 0, None),
    ("never looked", 0, ["a"], -1, None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "first", "nodes", "seq", "want"), LEDGER_CHANGES,
                         ids=[c[0] for c in LEDGER_CHANGES])  # fmt: skip
def test_ledger_changed_since(monkeypatch, case, first, nodes, seq, want):
    import omaticaya_py.scheduler.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "MAX_CHANGES", 4)
    ledger = Ledger()
    start, _ = ledger.changed_since(0)
    for i, n in enumerate(nodes):
        ledger.reserve(res(f"u{i}", n))
    now, got = ledger.changed_since(start + first if seq >= 0 else seq)
    assert now == start + len(nodes) and got == want, case


def test_a_flagged_node_asked_about_and_kept_fresh_is_told_its_problem_is_over():
    w = World()
    kept = Verdicts(w.index, NEED)
    told: list[str] = []
    kept.judge(NAMES, w.ctx())  # every node kept, none flagged yet
    flagged = {"n0": "ahead", "n4": "ahead"}  # flagged since by another request
    ctx = w.ctx(on_problem=lambda name, problem, detail: told.append(name))
    kept.judge(["n0", "n1"], ctx, flagged)
    assert told == ["n0"]  # n4 was not asked about


def test_what_is_kept_of_deleted_nodes_goes_at_the_next_sweep(monkeypatch):
    import omaticaya_py.scheduler.cache as cache_module

    monkeypatch.setattr(cache_module, "SWEEP_EVERY", 2)  # (1,024 by default)
    w = World()
    kept = Verdicts(w.index, NEED)
    kept.judge(NAMES, w.ctx())
    del w.states["n0"]  # deleted; the scheduler stops asking about it
    kept.judge(NAMES[1:], w.ctx())  # the second request sweeps
    assert "n0" not in kept.free and "n0" not in kept._state and len(w.index) == len(NAMES) - 1
