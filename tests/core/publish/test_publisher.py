"""The one budgeted publisher (``core.publish.publisher``): the calm clocks, the write budget and
the plan of one tick, the same for the Node's labels and telemetry and the ResourceSlice's
devices. Table-driven; the rules under it (``held_keys``, ``note_changes``) have their own
tables in ``tests/core/publish/test_write_budget.py``."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.budget import CALM_MAX_INTERVALS, Calm
from omaticaya_py.core.publish.publisher import Changes, Publisher, WritePlan

INTERVAL_S = 30.0
NOW_S = 100.0
F = frozenset


@pytest.mark.parametrize(
    ("publisher", "pending", "going", "hold", "expected"),
    [
        # budget off: everything goes
        (Publisher(0.0, {}, 95.0), Changes.of([], ["a"]), False, True, WritePlan(False, F({"a"}), F())),
        # never written: nothing held
        (Publisher(INTERVAL_S), Changes.of([], ["a"]), False, True, WritePlan(False, F({"a"}), F())),
        # the last write 5 s ago, nothing going: every change for the better waits
        (Publisher(INTERVAL_S, {}, 95.0), Changes.of([], ["a", "b"]), False, True,
         WritePlan(False, F(), F({"a", "b"}))),
        # ... a change for the worse goes, and the calm ones ride on it
        (Publisher(INTERVAL_S, {}, 95.0), Changes.of(["w"], ["a"]), False, True,
         WritePlan(True, F({"a"}), F())),
        # ... or the writer's own reason (the telemetry is rewritten)
        (Publisher(INTERVAL_S, {}, 95.0), Changes.of([], ["a"]), True, True,
         WritePlan(True, F({"a"}), F())),
        # a key that got worse itself 10 s ago waits, its calm neighbour goes
        (Publisher(INTERVAL_S, {"a": Calm(90.0, INTERVAL_S)}, 50.0), Changes.of([], ["a", "b"]),
         False, True, WritePlan(False, F({"b"}), F({"a"}))),
        # its window over: it goes
        (Publisher(INTERVAL_S, {"a": Calm(60.0, INTERVAL_S)}, 50.0), Changes.of([], ["a"]),
         False, True, WritePlan(False, F({"a"}), F())),
        # a flapping key (window doubled to 60 s, worse 40 s ago) waits
        (Publisher(INTERVAL_S, {"a": Calm(60.0, 60.0)}, 50.0), Changes.of([], ["a"]), False,
         True, WritePlan(False, F(), F({"a"}))),
        # an annotation heartbeat: nothing held
        (Publisher(INTERVAL_S, {"a": Calm(90.0, INTERVAL_S)}, 95.0), Changes.of([], ["a"]),
         False, False, WritePlan(False, F({"a"}), F())),
        # nothing pending
        (Publisher(INTERVAL_S, {}, 95.0), Changes.of([], []), False, True,
         WritePlan(False, F(), F())),
    ],
    ids=["budget-off", "first-write", "rate-limit", "rides-on-worse", "rides-on-going",
         "own-calm", "calm-over", "flapping", "heartbeat", "nothing"],
)
def test_plan(publisher, pending, going, hold, expected):
    assert publisher.plan(pending, NOW_S, going=going, hold=hold) == expected


@pytest.mark.parametrize(
    ("calm", "changes", "expected"),
    [
        # a key that got worse starts its clock at one interval
        ({}, Changes.of(["a"], []), {"a": Calm(NOW_S, INTERVAL_S)}),
        # a key that rose is marked; one not on a clock is not put on one
        ({"a": Calm(90.0, INTERVAL_S)}, Changes.of([], ["a", "b"]),
         {"a": Calm(90.0, INTERVAL_S, rose=True)}),
        # worse again after it rose: a flap, its window doubles
        ({"a": Calm(90.0, INTERVAL_S, rose=True)}, Changes.of(["a"], []),
         {"a": Calm(NOW_S, 2 * INTERVAL_S)}),
        # ... up to CALM_MAX_INTERVALS intervals
        ({"a": Calm(90.0, CALM_MAX_INTERVALS * INTERVAL_S, rose=True)}, Changes.of(["a"], []),
         {"a": Calm(NOW_S, CALM_MAX_INTERVALS * INTERVAL_S)}),
        # a clock older than CALM_MAX_INTERVALS intervals is forgotten
        ({"a": Calm(NOW_S - CALM_MAX_INTERVALS * INTERVAL_S, INTERVAL_S)}, Changes.of([], []), {}),
    ],
    ids=["worse", "rose", "flap", "flap-capped", "forgotten"],
)
def test_noted(calm, changes, expected):
    assert Publisher(INTERVAL_S, calm).noted(changes, NOW_S).calm == expected


def test_wrote_starts_the_interval_and_keeps_the_clocks():
    before = Publisher(INTERVAL_S, {"a": Calm(90.0, INTERVAL_S)})
    after = before.wrote(NOW_S)
    assert after.last_write_s == NOW_S and after.calm == before.calm
    assert before.last_write_s is None  # frozen: a new one
    # just written: a change for the better waits for the interval
    assert after.plan(Changes.of([], ["b"]), NOW_S + 1).held == {"b"}
    assert after.plan(Changes.of([], ["b"]), NOW_S + INTERVAL_S).held == frozenset()
