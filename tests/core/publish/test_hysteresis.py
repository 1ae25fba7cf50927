"""Hysteresis of the rounded labels: a reading hovering at a step edge does not flap."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.render import render, stable_down, stable_nearest
from omaticaya_py.core.rules.health import assess
from tests.helpers import gpu, settings, snapshot

P = "omaticaya.io/"


@pytest.mark.parametrize(
    ("raw", "step", "previous", "margin", "expected"),
    [
        pytest.param(40_000, 1024, None, 204.8, 39_936, id="no-previous"),
        pytest.param(40_000, 1024, 39_936, 204.8, 39_936, id="same-bucket"),
        pytest.param(39_900, 1024, 39_936, 204.8, 38_912, id="drops-at-once"),
        pytest.param(40_970, 1024, 39_936, 204.8, 39_936, id="just-over-the-edge-holds"),
        pytest.param(41_165, 1024, 39_936, 204.8, 40_960, id="past-edge-by-margin-rises"),
        pytest.param(50_000, 1024, 39_936, 204.8, 49_152, id="big-rise"),
        pytest.param(40_970, 1024, 39_936, 0, 40_960, id="margin-0-is-plain-rounding"),
    ],
)
def test_stable_down(raw, step, previous, margin, expected):
    assert stable_down(raw, step, previous, margin) == expected


@pytest.mark.parametrize(
    ("raw", "step", "previous", "margin", "expected"),
    [
        pytest.param(46, 10, None, 2, 50, id="no-previous"),
        pytest.param(46, 10, 40, 2, 40, id="within-half-step-plus-margin-holds"),
        pytest.param(34, 10, 40, 2, 40, id="holds-downward-too"),
        pytest.param(47, 10, 40, 2, 50, id="beyond-margin-moves"),
        pytest.param(33, 10, 40, 2, 30, id="beyond-margin-moves-down"),
        pytest.param(46, 10, 40, 0, 50, id="margin-0-is-plain-rounding"),
        pytest.param(100, 10, 40, 2, 100, id="big-jump"),
    ],
)
def test_stable_nearest(raw, step, previous, margin, expected):
    assert stable_nearest(raw, step, previous, margin) == expected


def test_a_reading_hovering_at_an_edge_does_not_flap():
    s = settings(hysteresis_pct=20)
    previous = None
    seen = []
    for util, free in [(44, 40_000), (46, 40_970), (44, 40_000), (46, 40_970), (45.5, 41_000)]:
        snap = snapshot(gpu(0, utilization_pct=util, memory_free_mib=free))
        labels = render(snap, assess(snap), s, previous).labels
        seen.append((labels[P + "gpu.utilization-pct"], labels[P + "gpu.memory.free-mib"]))
        previous = labels
    assert seen == [("40", "39936")] * 5

    off = settings(hysteresis_pct=0)
    flapping = [
        render(snap, assess(snap), off, None).labels[P + "gpu.utilization-pct"]
        for snap in (snapshot(gpu(0, utilization_pct=u)) for u in (44, 46, 44, 46))
    ]
    assert flapping == ["40", "50", "40", "50"]
