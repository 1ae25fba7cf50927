"""The write budget's pure decision (``core.budget``): which label changes go at once (the Node
gets less attractive) and which wait for ``min_patch_interval_s`` (it gets more attractive, or
nothing a scheduler reads changed)."""

from __future__ import annotations

import pytest

from omaticaya_py.core.budget import hold_back, safe_part, urgent, worse
from omaticaya_py.core.settings import load_settings

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
    from omaticaya_py.core.settings import SettingsError

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
