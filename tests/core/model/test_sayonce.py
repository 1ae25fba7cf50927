"""Say it once, say when it is over (``core.model.sayonce.SayOnce``), and the agent's refusal pacing
driven by tenacity's own retry loop (``agent.outage.Refusals``)."""

from __future__ import annotations

import pytest

from omaticaya_py.agent.outage import MAX_PAUSE_S, ApiOutage, Refusals
from omaticaya_py.agent.state import SnapshotCache
from omaticaya_py.core.model.sayonce import Episode, SayOnce
from omaticaya_py.kube import KubeError, KubeForbidden
from tests.agent.stuck_tick_support import log_lines  # noqa: F401  (fixture)

# (steps: ("start", key, what, at_s) or ("end", key), answers expected, what holds after)
CASES = [
    ("first start is news", [("start", "a", "x", 1.0)], [True], {"a": "x"}),
    (
        "the same again is not",
        [("start", "a", "x", 1.0), ("start", "a", "x", 2.0)],
        [True, False],
        {"a": "x"},
    ),
    (
        "another problem is news",
        [("start", "a", "x", 1.0), ("start", "a", "y", 2.0)],
        [True, True],
        {"a": "y"},
    ),
    (
        "the end says what and since when",
        [("start", "a", "x", 1.0), ("start", "a", "x", 5.0), ("end", "a")],
        [True, False, Episode("x", 1.0)],
        {},
    ),
    ("an end with nothing on says nothing", [("end", "a")], [None], {}),
    (
        "keys are apart",
        [("start", "a", "x", None), ("start", "b", "x", None), ("end", "a")],
        [True, True, Episode("x", None)],
        {"b": "x"},
    ),
    (
        "after the end, the same is news again",
        [("start", "a", "x", 1.0), ("end", "a"), ("start", "a", "x", 9.0)],
        [True, Episode("x", 1.0), True],
        {"a": "x"},
    ),
]


@pytest.mark.parametrize(("steps", "answers", "after"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_say_once(steps, answers, after) -> None:
    said: SayOnce[str, str] = SayOnce()
    got = [said.start(*step[1:]) if step[0] == "start" else said.end(step[1]) for step in steps]
    assert got == answers
    assert dict(said.current) == after


def test_a_bounded_one_forgets_the_oldest_and_says_it_again() -> None:
    said: SayOnce[str, bool] = SayOnce(max_keys=2)
    assert said.start("a", True) and said.start("b", True) and said.start("c", True)
    assert "a" not in said and set(said.current) == {"b", "c"}
    assert said.start("a", True)  # forgotten: news again
    assert said.since_s("b") is None


def test_refusals_pause_as_tenacity_waits_doubling_to_the_cap() -> None:
    import tenacity

    refusals = Refusals(tenacity.wait_exponential(multiplier=10.0, min=0, max=MAX_PAUSE_S))
    assert [refusals.refused() for _ in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    refusals.reset()
    assert refusals.refused() == 10


def test_the_outage_is_said_once_and_its_end_once(log_lines) -> None:  # noqa: F811
    outage = ApiOutage(10.0, SnapshotCache(lambda: 0.0))
    for at_s in (100.0, 110.0, 120.0):
        outage.failed(KubeError("connection refused"), at_s)
        assert not outage.paused(at_s)  # not a refusal: no pause
    outage.failed(KubeForbidden("nodes is forbidden"), 130.0)
    assert outage.paused(139.0) and not outage.paused(140.0)  # one period
    outage.failed(KubeForbidden("nodes is forbidden"), 140.0)
    assert outage.paused(159.0) and not outage.paused(160.0)  # doubled
    outage.ok(160.0)
    outage.ok(170.0)
    failed = [x for x in log_lines if "Kubernetes API request failed" in x]
    assert len(failed) == 1 and "(check RBAC)" not in failed[0]
    back = [x for x in log_lines if "Kubernetes API reachable again" in x]
    assert len(back) == 1 and "after 60.0s" in back[0]
    outage.failed(KubeForbidden("nodes is forbidden"), 200.0)
    assert not outage.paused(210.0)  # the count started again after the round that went through
    assert sum("(check RBAC)" in x for x in log_lines) == 1
