"""The write budget's pure decision (``core.publish.budget``): which label changes go at once (the Node
gets less attractive) and which wait for ``min_patch_interval_s`` (it gets more attractive, or
nothing a scheduler reads changed)."""

from __future__ import annotations

import pytest

from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.publish.budget import hold_back, safe_part, urgent, worse

P = "omaticaya.io/"

BASE = {
    P + "gpu.health": "Healthy",
    P + "gpu.count": "2",
    P + "gpu.product": "NVIDIA-H100-80GB-HBM3",
    P + "gpu.memory.free-mib": "40960",
    P + "gpu.memory.free-total-mib": "81920",
    P + "gpu.utilization-pct": "30",
    P + "gpu.idle-count": "1",
    P + "gpu.healthy-count": "2",
    P + "gpu-0.health": "Healthy",
    P + "gpu-0.memory.free-mib": "40960",
    P + "gpu-0.utilization-pct": "30",
    P + "gpu-0.temperature-c": "50",
    P + "gpu-1.health": "Healthy",
    P + "gpu-1.memory.free-mib": "40960",
    P + "gpu-1.utilization-pct": "40",
    P + "gpu-1.temperature-c": "50",
    P + "mig-1g.10gb.idle-count": "3",
    P + "mig-1g.10gb.memory.free-mib": "9216",
}


def changed(**changes: str | None) -> dict[str, str]:
    """BASE with keys (``_`` for ``.``-free spelling: pass a dict instead) set or removed."""
    out = dict(BASE)
    for name, value in changes.items():
        key = P + name
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def c(mapping: dict[str, str | None]) -> dict[str, str]:
    return changed(**mapping)


# (id, after, urgent?)
CASES = [
    ("nothing changed", BASE, False),
    # safety direction: at once
    ("free memory down", c({"gpu.memory.free-mib": "39936"}), True),
    ("free total down", c({"gpu.memory.free-total-mib": "80896"}), True),
    ("per-GPU free down", c({"gpu-1.memory.free-mib": "1024"}), True),
    ("MIG profile free down", c({"mig-1g.10gb.memory.free-mib": "0"}), True),
    ("MIG idle count down", c({"mig-1g.10gb.idle-count": "2"}), True),
    ("utilisation up", c({"gpu.utilization-pct": "40"}), True),
    ("per-GPU utilisation up", c({"gpu-0.utilization-pct": "100"}), True),
    ("idle count down", c({"gpu.idle-count": "0"}), True),
    ("healthy count down", c({"gpu.healthy-count": "1"}), True),
    ("health Healthy -> Degraded", c({"gpu.health": "Degraded"}), True),
    ("health Degraded -> Unhealthy", c({"gpu.health": "Unhealthy"}), True),
    ("NVML unreadable: Unknown", c({"gpu.health": "Unknown"}), True),
    ("a GPU unhealthy", c({"gpu-1.health": "Unhealthy"}), True),
    (
        "a GPU gone",
        c({"gpu.count": "1", "gpu-1.health": None, "gpu-1.memory.free-mib": None,
           "gpu-1.utilization-pct": None, "gpu-1.temperature-c": None}),
        True,
    ),
    ("free memory label gone", c({"gpu.memory.free-mib": None}), True),
    ("utilisation label gone", c({"gpu.utilization-pct": None}), True),
    ("a value that is not a number", c({"gpu.memory.free-mib": "lots"}), True),
    ("product changed", c({"gpu.product": "NVIDIA-A100"}), True),
    ("an unranked key appears", c({"mig.strategy": "mixed"}), False),
    ("an unknown health word", c({"gpu.health": "Weird"}), True),
    # attractive direction: may wait
    ("free memory up", c({"gpu.memory.free-mib": "80896"}), False),
    ("free total up", c({"gpu.memory.free-total-mib": "161792"}), False),
    ("utilisation down", c({"gpu.utilization-pct": "0", "gpu-0.utilization-pct": "0"}), False),
    ("idle count up", c({"gpu.idle-count": "2"}), False),
    ("health Degraded -> Healthy", None, False),  # before Degraded, see below
    ("temperature up (not a scheduling input)", c({"gpu-0.temperature-c": "85"}), False),
    ("temperature gone", c({"gpu-0.temperature-c": None}), False),
    ("a number appears", c({"gpu-2.memory.free-mib": "1024"}), False),
    ("a healthy GPU appears", c({"gpu-2.health": "Healthy"}), False),
    ("an unhealthy GPU appears", c({"gpu-2.health": "Unhealthy"}), True),
    # mixed: one worse key makes the whole change urgent (merged into one patch)
    ("memory up, utilisation up", c({"gpu.memory.free-mib": "80896", "gpu.utilization-pct": "90"}), True),
    ("memory up, temperature up", c({"gpu.memory.free-mib": "80896", "gpu-1.temperature-c": "90"}), False),
]


@pytest.mark.parametrize(("after", "expected"), [c_[1:] for c_ in CASES], ids=[c_[0] for c_ in CASES])
def test_urgent(after, expected):
    if after is None:  # Degraded -> Healthy
        before, after = c({"gpu.health": "Degraded"}), BASE
    else:
        before = BASE
    assert urgent(before, after) is expected
    # bare names behave the same as full keys (any prefix)
    strip = {k.removeprefix(P): v for k, v in after.items()}
    assert urgent({k.removeprefix(P): v for k, v in before.items()}, strip) is expected


def test_first_write_is_not_held_by_direction():
    """From an empty Node everything appears: numbers and a healthy state are not urgent, an
    unhealthy state is; the first patch goes anyway (``hold_back`` with no last patch)."""
    assert urgent({}, BASE) is False
    assert urgent({}, c({"gpu.health": "Unhealthy"})) is True
    assert hold_back(5.0, None, 30.0, is_urgent=False) is False


def test_everything_removed_is_urgent():
    assert urgent(BASE, {}) is True


@pytest.mark.parametrize(
    ("now_s", "last_s", "interval_s", "is_urgent", "held"),
    [
        (10.0, 0.0, 30.0, False, True),   # within the interval: wait
        (29.9, 0.0, 30.0, False, True),
        (30.0, 0.0, 30.0, False, False),  # the interval has passed: goes out
        (45.0, 0.0, 30.0, False, False),
        (10.0, 0.0, 30.0, True, False),   # safety direction: never held
        (0.0, None, 30.0, False, False),  # no patch yet
        (1.0, 0.0, 0.0, False, False),    # budget off
    ],
)
def test_hold_back(now_s, last_s, interval_s, is_urgent, held):
    assert hold_back(now_s, last_s, interval_s, is_urgent) is held


@pytest.mark.parametrize(
    ("now_s", "last_s", "calm_since_s", "is_urgent", "held"),
    [
        (100.0, 0.0, 90.0, False, True),  # got worse 10 s ago: a rise waits for calm
        (100.0, 0.0, 70.0, False, False),  # calm for the interval, last patch long ago: goes
        (100.0, 80.0, 10.0, False, True),  # calm, but the last patch is recent: waits
        (100.0, 0.0, 99.0, True, False),  # worse again: never held
        (100.0, 0.0, None, False, False),  # never got worse
        (100.0, None, 99.0, False, False),  # no patch yet
    ],
    ids=["dipped-recently", "calm", "calm-recent-patch", "urgent", "never-worse", "first"],
)
def test_a_rise_waits_until_the_reading_is_calm_for_an_interval(
    now_s, last_s, calm_since_s, is_urgent, held
):
    assert hold_back(now_s, last_s, 30.0, is_urgent, calm_since_s) is held


def test_worse_is_per_key():
    assert worse("gpu.memory.free-mib", "2048", "1024")
    assert not worse("gpu.memory.free-mib", "1024", "2048")
    assert worse("gpu-3.utilization-pct", "10", "20")
    assert not worse("gpu-3.temperature-c", "40", "90")


def test_setting_default_and_bounds(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMATICAYA_MIN_PATCH_INTERVAL_S", raising=False)
    assert load_settings().min_patch_interval_s == 30
    monkeypatch.setenv("OMATICAYA_MIN_PATCH_INTERVAL_S", "0")  # the budget off
    assert load_settings().min_patch_interval_s == 0
    from omaticaya_py.core.config.settings import SettingsError

    monkeypatch.setenv("OMATICAYA_MIN_PATCH_INTERVAL_S", "-1")
    with pytest.raises(SettingsError, match="OMATICAYA_MIN_PATCH_INTERVAL_S"):
        load_settings()


@pytest.mark.parametrize(
    ("node", "desired", "now"),
    [
        # free memory up (better) and utilisation up (worse): only the worse goes now
        ({"gpu.memory.free-mib": "49152", "gpu.utilization-pct": "0"},
         {"gpu.memory.free-mib": "78848", "gpu.utilization-pct": "80"},
         {"gpu.memory.free-mib": "49152", "gpu.utilization-pct": "80"}),
        # a GPU gone: its keys go now; a new number waits
        ({"gpu-1.health": "Healthy", "gpu.count": "2"},
         {"gpu.count": "1", "gpu-0.memory.free-mib": "1024"},
         {"gpu.count": "1"}),
        # health worse goes, temperature (neutral) waits
        ({"gpu.health": "Healthy", "gpu-0.temperature-c": "40"},
         {"gpu.health": "Degraded", "gpu-0.temperature-c": "60"},
         {"gpu.health": "Degraded", "gpu-0.temperature-c": "40"}),
        # nothing worse: the Node's labels as they are
        ({"gpu.idle-count": "1"}, {"gpu.idle-count": "3"}, {"gpu.idle-count": "1"}),
    ],
    ids=["mixed", "gpu-gone", "health-and-temperature", "only-better"],
)
def test_safe_part_sends_only_the_worse(node, desired, now):
    full = lambda m: {P + k: v for k, v in m.items()}  # noqa: E731
    assert safe_part(full(node), full(desired)) == full(now)


# -- issue 48: the calm window per label, per GPU ------------------------------------------------

from omaticaya_py.core.publish.budget import (  # noqa: E402
    CALM_MAX_INTERVALS,
    Calm,
    held_keys,
    label_changes,
    note_changes,
)

F0, F1, H1 = P + "gpu-0.memory.free-mib", P + "gpu-1.memory.free-mib", P + "gpu-1.health"


def calm(**worse_at_s: float) -> dict[str, Calm]:
    """Calm clocks of one interval (30 s): ``f0=95.0`` -> GPU 0's free memory got worse at 95 s."""
    keys = {"f0": F0, "f1": F1, "h1": H1}
    return {keys[k]: Calm(t, 30.0) for k, t in worse_at_s.items()}


@pytest.mark.parametrize(
    ("pending", "now_s", "last_s", "interval_s", "clocks", "going", "held"),
    [
        # the issue: GPU 0 dips every 20 s (its dip written 5 s ago, going again now); GPU 1
        # recovered 60 s ago: only GPU 0's own rise waits
        ({F0, H1}, 100.0, 95.0, 30.0, calm(f0=95.0), True, {F0}),
        # GPU 0 dipped 5 s ago, nothing goes now and the last write is 5 s old: all wait
        ({F0, H1}, 100.0, 95.0, 30.0, calm(f0=95.0), False, {F0, H1}),
        # the last write an interval old: GPU 1's recovery goes alone, GPU 0's rise still waits
        ({F0, H1}, 125.0, 95.0, 30.0, calm(f0=115.0), False, {F0}),
        # GPU 1 itself got worse 10 s ago: its own calm window holds it, whatever goes
        ({H1}, 100.0, 10.0, 30.0, calm(h1=90.0), True, {H1}),
        # calm for exactly its window: it goes
        ({H1}, 120.0, 10.0, 30.0, calm(h1=90.0), False, set()),
        # a flapping key's window, doubled: still held after one interval
        ({H1}, 150.0, 10.0, 30.0, {H1: Calm(90.0, 120.0)}, True, {H1}),
        # the budget off, or no write yet: nothing held
        ({F0, H1}, 100.0, 95.0, 0.0, calm(f0=99.0), False, set()),
        # a budget under a second is still a budget
        ({H1}, 100.0, 99.8, 0.5, {}, False, {H1}),
        ({F0, H1}, 100.0, None, 30.0, calm(f0=99.0), False, set()),
        (set(), 100.0, 95.0, 30.0, calm(f0=99.0), True, set()),
    ],
    ids=["neighbour-churns", "nothing-goes", "alone-after-interval", "own-churn", "calm-exactly",
         "flapping", "budget-off", "budget-under-a-second", "first-write", "nothing-pending"],
)
def test_held_keys_judges_each_key_by_its_own_calm(
    pending, now_s, last_s, interval_s, clocks, going, held
):
    assert held_keys(pending, now_s, last_s, interval_s, clocks, going) == held


@pytest.mark.parametrize(
    ("clocks", "worse", "better", "now_s", "expected"),
    [
        # a first change for the worse: one interval
        ({}, {F0}, set(), 10.0, {F0: Calm(10.0, 30.0)}),
        # it rose, then fell again (a flap): the window doubles
        ({F0: Calm(10.0, 30.0)}, set(), {F0}, 20.0, {F0: Calm(10.0, 30.0, rose=True)}),
        ({F0: Calm(10.0, 30.0, rose=True)}, {F0}, set(), 30.0, {F0: Calm(30.0, 60.0)}),
        # ... up to CALM_MAX_INTERVALS intervals
        ({F0: Calm(10.0, 240.0, rose=True)}, {F0}, set(), 30.0, {F0: Calm(30.0, 240.0)}),
        # falling over a few ticks (memory allocated): no flap, the window kept
        ({F0: Calm(10.0, 30.0)}, {F0}, set(), 20.0, {F0: Calm(20.0, 30.0)}),
        # a key calm for CALM_MAX_INTERVALS intervals is forgotten; the others stay
        ({F0: Calm(0.0, 60.0), H1: Calm(10.0, 30.0)}, set(), set(), 240.0, {H1: Calm(10.0, 30.0)}),
        # a key that rises with no clock: nothing to note
        ({}, set(), {H1}, 10.0, {}),
    ],
    ids=["first", "rose", "flap", "capped", "falling", "forgotten", "better-only"],
)
def test_note_changes_doubles_a_flapping_keys_window(clocks, worse, better, now_s, expected):
    assert CALM_MAX_INTERVALS * 30.0 == 240.0
    assert note_changes(clocks, worse, better, now_s, 30.0) == expected


def test_label_changes_names_each_key_that_got_worse_or_better():
    before = c({"gpu-1.health": "Unhealthy"})
    after = c({"gpu-0.memory.free-mib": "1024", "gpu-1.health": "Healthy",
               "gpu-1.utilization-pct": None})  # fmt: skip
    assert label_changes(before, after) == ({F0, P + "gpu-1.utilization-pct"}, {H1})
    assert label_changes(BASE, BASE) == (set(), set())
    # temperature has no direction: each move counts as a flap, so it settles before it goes
    temp = P + "gpu-0.temperature-c"
    assert label_changes(BASE, c({"gpu-0.temperature-c": "60"})) == ({temp}, {temp})


def _mark(free_mib: int, *pods: str):
    from omaticaya_py.core.publish.budget import UnitMark

    return UnitMark(free_mib, frozenset(("ml", p, "main") for p in pods))


@pytest.mark.parametrize(
    ("published", "now", "expected"),
    [
        # GPU 0 down 600 MiB, GPU 1 up 8,900: each unit judged alone
        ({0: _mark(10900), 1: _mark(100)}, {0: _mark(10300), 1: _mark(9000)}, ({0}, {1})),
        ({0: _mark(10900), 1: _mark(100)}, {0: _mark(10900)}, ({1}, set())),  # a unit gone
        ({0: _mark(10900)}, {0: _mark(10900), 2: _mark(5000)}, (set(), {2})),  # a new unit
        ({0: _mark(10900, "a")}, {0: _mark(10900)}, (set(), {0})),  # a holder left
        ({0: _mark(10900)}, {0: _mark(10800, "a")}, ({0}, set())),  # a new holder
        ({0: _mark(10900)}, {0: _mark(10800)}, (set(), set())),  # within the threshold
    ],
    ids=["down-and-up", "gone", "new", "holder-left", "new-holder", "within-threshold"],
)
def test_unit_changes_judges_each_unit_alone(published, now, expected):
    from omaticaya_py.core.publish.budget import unit_changes

    assert unit_changes(published, now, 256) == expected


def test_safe_part_lets_the_ready_keys_go():
    node = c({"gpu-1.health": "Unhealthy", "gpu-0.memory.free-mib": "1024"})
    desired = c({"gpu-1.memory.free-mib": "0"})  # GPU 1 healthy again, GPU 0 risen, GPU 1 down
    out = safe_part(node, desired, ready={H1})
    assert out[H1] == "Healthy"  # ready: goes
    assert out[F0] == "1024"  # not ready: the Node's value
    assert out[F1] == "0"  # worse: always


def churn_labels(t: float, recovered_at_s: float) -> dict[str, str]:
    """The issue's node at trace second ``t``: GPU 0's free memory dips for one 10 s tick every
    20 s; GPU 1 is unhealthy (remap pending) until ``recovered_at_s``."""
    healthy = t >= recovered_at_s
    return c({
        "gpu-0.memory.free-mib": "40960" if t % 20 == 0 else "81920",
        "gpu-1.health": "Healthy" if healthy else "Unhealthy",
        "gpu.health": "Healthy" if healthy else "Degraded",
        "gpu.healthy-count": "2" if healthy else "1",
    })  # fmt: skip


def test_a_churning_neighbour_does_not_hold_a_recovered_gpus_label():
    """The issue's fault on the pure rule as the Node writer applies it each tick: a change for
    the worse goes at once, a change for the better when ``held_keys`` lets it. GPU 1's
    recovery (and the node's health and healthy count) reaches the Node within two intervals
    and a tick (it stayed Unhealthy 1,790 s and counting with one node-wide calm clock); GPU 0's
    churn costs no write after its first dip (its rises wait for its own calm, never come)."""
    interval_s, tick_s, recovered_at_s = 30.0, 10.0, 100.0
    node = churn_labels(0.0, 1e9)
    last_write, clocks, previous = 0.0, {}, node
    writes, healthy_at = 0, None
    t = tick_s
    while t <= 1800.0:
        desired = churn_labels(t, recovered_at_s)
        clocks = note_changes(clocks, *label_changes(previous, desired), t, interval_s)
        previous = desired
        pending = {k for k in node.keys() | desired.keys()
                   if node.get(k) != desired.get(k) and not worse(k, node.get(k), desired.get(k))}
        held = held_keys(pending, t, last_write, interval_s, clocks, urgent(node, desired))
        target = safe_part(node, desired, ready=pending - held)
        if target != node:
            node, last_write, writes = target, t, writes + 1
        if healthy_at is None and node[H1] == "Healthy":
            healthy_at = t
        t += tick_s
    assert healthy_at is not None
    assert healthy_at - recovered_at_s <= 2 * interval_s + tick_s
    assert node[P + "gpu.health"] == "Healthy" and node[P + "gpu.healthy-count"] == "2"
    assert node[F0] == "40960"  # GPU 0's rises still wait: its label stays at the dip
    assert writes <= 2  # the first dip, the recovery: no churn
