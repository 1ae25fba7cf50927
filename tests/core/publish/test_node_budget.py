"""The Node's side of the write budget (``core.publish.node_budget``): which label changes are
pending for the worse, what is written while the others wait, when the telemetry alone is
rewritten, and what moves the calm clocks. Table-driven."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.budget import Calm, UnitMark
from omaticaya_py.core.publish.node_budget import (
    calm_changes,
    labels_within_budget,
    pending_labels,
    telemetry_behind,
)
from omaticaya_py.core.publish.publisher import Changes, Publisher

P = "omaticaya.io/"
FREE, HEALTH, TEMP = P + "gpu-0.memory.free-mib", P + "gpu-0.health", P + "gpu-0.temperature-c"
G0 = (0, -1)


@pytest.mark.parametrize(
    ("on_node", "desired", "worse", "better"),
    [
        ({FREE: "4096"}, {FREE: "4096"}, set(), set()),
        ({FREE: "4096"}, {FREE: "2048"}, {FREE}, set()),
        ({FREE: "2048"}, {FREE: "4096"}, set(), {FREE}),
        ({HEALTH: "Healthy"}, {HEALTH: "Unhealthy"}, {HEALTH}, set()),
        ({HEALTH: "Unhealthy"}, {}, {HEALTH}, set()),  # a key gone
        ({}, {FREE: "1"}, set(), {FREE}),  # a number appears
        ({TEMP: "40"}, {TEMP: "60"}, set(), {TEMP}),  # no direction: may wait
    ],
    ids=["same", "less-free", "more-free", "sick", "gone", "new", "neutral"],
)
def test_pending_labels(on_node, desired, worse, better):
    assert pending_labels(on_node, desired) == Changes.of(worse, better)


SICK_NODE = {FREE: "2048", HEALTH: "Unhealthy"}
WELL = {FREE: "8192", HEALTH: "Healthy"}


@pytest.mark.parametrize(
    ("desired", "publisher", "going", "hold", "expected"),
    [
        (WELL, Publisher(30.0), False, True, None),  # never written: nothing held
        (WELL, Publisher(30.0, {}, 95.0), False, True, SICK_NODE),  # rate limit
        (WELL, Publisher(30.0, {}, 95.0), True, True, None),  # the telemetry goes: all go
        (WELL, Publisher(30.0, {}, 95.0), False, False, None),  # annotation heartbeat
        # the free memory's own calm: it waits, health goes with the telemetry
        (WELL, Publisher(30.0, {FREE: Calm(90.0, 30.0)}, 50.0), True, True,
         {FREE: "2048", HEALTH: "Healthy"}),
        # a drop goes at once, and the rise of health rides on it
        ({FREE: "1024", HEALTH: "Healthy"}, Publisher(30.0, {}, 95.0), False, True, None),
    ],
    ids=["first", "rate-limit", "going", "heartbeat", "own-calm", "rides-on-a-drop"],
)
def test_labels_within_budget(desired, publisher, going, hold, expected):
    got = labels_within_budget(SICK_NODE, desired, publisher, 100.0, going=going, hold=hold)
    assert got == expected


@pytest.mark.parametrize(
    ("published", "now", "publisher", "behind"),
    [
        ({G0: UnitMark(10000)}, {G0: UnitMark(10000)}, Publisher(30.0, {}, 95.0), False),
        ({G0: UnitMark(10000)}, {G0: UnitMark(9000)}, Publisher(30.0, {}, 95.0), True),  # drop
        ({G0: UnitMark(10000)}, {G0: UnitMark(9900)}, Publisher(30.0, {}, 95.0), False),  # small
        ({G0: UnitMark(9000)}, {G0: UnitMark(10000)}, Publisher(30.0, {}, 95.0), False),  # waits
        ({G0: UnitMark(9000)}, {G0: UnitMark(10000)}, Publisher(30.0, {}, 60.0), True),  # goes
        ({G0: UnitMark(9000)}, {G0: UnitMark(10000)},
         Publisher(30.0, {G0: Calm(90.0, 30.0)}, 60.0), False),  # its own calm
        ({G0: UnitMark(9000)}, {G0: UnitMark(9000, frozenset({("ns", "p", "c")}))},
         Publisher(30.0, {}, 95.0), True),  # a new holder
    ],
    ids=["same", "drop", "small-drop", "rise-waits", "rise-goes", "rise-own-calm", "holder"],
)
def test_telemetry_behind(published, now, publisher, behind):
    assert telemetry_behind(published, now, publisher, 100.0, 256) is behind


def test_calm_changes_labels_and_units_on_one_clock_map():
    changes = calm_changes({FREE: "4096", TEMP: "40"}, {FREE: "2048", TEMP: "50"},
                           {G0: UnitMark(10000)}, {G0: UnitMark(20000)}, 256)  # fmt: skip
    assert changes == Changes.of({FREE, TEMP}, {TEMP, G0})
    assert calm_changes(None, {FREE: "1"}, None, {G0: UnitMark(1)}, 256) == Changes.of([], [])
