"""``core.publish.budget`` cases that mutation testing (``scripts/mutation``) found no test pinned:
``worse`` for health values that cannot be ranked, numbers spelt two ways and versions that go
down; ``hold_back`` with the budget off or under a second; ``safe_part`` for a key that appears;
``telemetry_change`` at its thresholds and for containers over their slice."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.budget import (
    BETTER,
    WORSE,
    UnitMark,
    hold_back,
    name_of,
    safe_part,
    telemetry_change,
    urgent,
    worse,
)

P = "omaticaya.io/"

WORSE_CASES = [
    # (id, name, before, after, worse?)
    ("a new healthy GPU", "gpu-3.health", None, "Healthy", False),
    ("a new degraded node", "gpu.health", None, "Degraded", True),
    ("a new GPU whose health cannot be ranked", "gpu-3.health", None, "Broken", True),
    ("health that cannot be ranked, then healthy", "gpu.health", "Broken", "Healthy", False),
    ("health that cannot be ranked, then unknown", "gpu.health", "Broken", "Unknown", False),
    ("one unrankable health for another: both rank worst", "gpu.health", "Broken", "Gone", False),
    ("healthy to unrankable", "gpu-0.health", "Healthy", "Broken", True),
    ("degraded to unhealthy", "gpu.health", "Degraded", "Unhealthy", True),
    ("unhealthy to degraded", "gpu.health", "Unhealthy", "Degraded", False),
    ("the same number spelt with a leading zero: free memory", "gpu.memory.free-mib", "4096", "04096", False),
    ("the same number spelt with a leading zero: utilisation", "gpu.utilization-pct", "40", "040", False),
    ("utilisation down", "gpu.utilization-pct", "50", "40", False),
    ("utilisation up", "gpu.utilization-pct", "40", "50", True),
    ("a MIG profile's free memory down", "mig-1g.10gb.memory.free-mib", "9216", "8192", True),
    ("a MIG profile's free memory up", "mig-1g.10gb.memory.free-mib", "8192", "9216", False),
    ("a MIG profile's count down", "mig-1g.10gb.count", "7", "6", True),
    ("a MIG profile's idle count up", "mig-1g.10gb.idle-count", "1", "2", False),
    ("out-of-band memory up", "gpu-1.memory.out-of-band-mib", "1024", "2048", True),
    ("out-of-band memory down", "gpu-1.memory.out-of-band-mib", "2048", "1024", False),
    ("temperature gone: neutral", "gpu-1.temperature-c", "45", None, False),
    ("a driver version that goes down is never held back", "cuda.driver-version.major", "590", "580", True),
    ("nor one that goes up", "cuda.driver-version.major", "580", "590", True),
    ("a driver version appears", "cuda.driver-version.major", None, "580", False),
    ("a product appears", "gpu.product", None, "NVIDIA-H100", False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "before", "after", "expected"), [c[1:] for c in WORSE_CASES], ids=[c[0] for c in WORSE_CASES]
)
def test_worse(name, before, after, expected) -> None:
    assert worse(name, before, after) is expected
    # a full key says the same, and urgent() of the one key too
    assert worse(name_of(P + name), before, after) is expected
    b = {} if before is None else {P + name: before}
    a = {} if after is None else {P + name: after}
    assert urgent(b, a) is expected


HOLD_CASES = [
    # (id, now_s, last_patch_s, interval_s, is_urgent, calm_since_s, held?)
    ("budget off: never held, even against a later last patch", 10.0, 11.0, 0.0, False, None, False),
    ("budget off with a recent rise", 10.0, 9.0, 0.0, False, 9.5, False),
    ("half a second budget: held within it", 10.0, 9.8, 0.5, False, None, True),
    ("half a second budget: sent after it", 10.0, 9.5, 0.5, False, None, False),
    ("calm for less than the interval", 100.0, 50.0, 10.0, False, 95.0, True),
    ("calm for exactly the interval", 100.0, 50.0, 10.0, False, 90.0, False),
    ("last patch exactly an interval ago", 100.0, 90.0, 10.0, False, None, False),
    ("urgent goes at once", 100.0, 99.0, 10.0, True, 99.0, False),
    ("never patched", 100.0, None, 10.0, False, 99.0, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("now_s", "last_s", "interval_s", "is_urgent", "calm_since_s", "held"),
    [c[1:] for c in HOLD_CASES],
    ids=[c[0] for c in HOLD_CASES],
)
def test_hold_back(now_s, last_s, interval_s, is_urgent, calm_since_s, held) -> None:
    assert hold_back(now_s, last_s, interval_s, is_urgent, calm_since_s) is held


SAFE_CASES = [
    # (id, on the Node, desired, written)
    ("a new GPU that is unhealthy is written", {}, {"gpu-1.health": "Unhealthy"}, {"gpu-1.health": "Unhealthy"}),
    ("a new healthy GPU waits", {}, {"gpu-1.health": "Healthy"}, {}),
    ("a number that appears waits", {}, {"gpu-1.memory.free-mib": "1024"}, {}),
    ("a key gone is gone", {"gpu-1.memory.free-mib": "1024"}, {}, {}),
    ("a neutral key gone stays until the next patch", {"gpu-1.temperature-c": "40"}, {},
     {"gpu-1.temperature-c": "40"}),
    ("unchanged keys are written as they are", {"gpu.count": "8"}, {"gpu.count": "8"}, {"gpu.count": "8"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("node", "desired", "written"), [c[1:] for c in SAFE_CASES], ids=[c[0] for c in SAFE_CASES]
)
def test_safe_part(node, desired, written) -> None:
    def full(d: dict[str, str]) -> dict[str, str]:
        return {P + k: v for k, v in d.items()}

    assert safe_part(full(node), full(desired)) == full(written)


A = ("ml", "a", "main")
B = ("ml", "b", "main")
G0, G1 = (0, -1), (1, -1)

CHANGE_CASES = [
    # (id, published, now, drop_mib, expected)
    ("a drop of exactly the threshold waits for nothing", {G0: UnitMark(10_000)}, {G0: UnitMark(9_744)}, 256, None),
    ("a drop one past it", {G0: UnitMark(10_000)}, {G0: UnitMark(9_743)}, 256, WORSE),
    ("a rise of exactly the threshold", {G0: UnitMark(9_744)}, {G0: UnitMark(10_000)}, 256, None),
    ("a rise one past it", {G0: UnitMark(9_743)}, {G0: UnitMark(10_000)}, 256, BETTER),
    ("free memory read again", {G0: UnitMark(None)}, {G0: UnitMark(10)}, 256, BETTER),
    ("free memory neither time", {G0: UnitMark(None)}, {G0: UnitMark(None)}, 256, None),
    ("a new unit whose memory is not read", {}, {G0: UnitMark(None)}, 256, None),
    ("a unit gone whose memory was not read", {G0: UnitMark(None), G1: UnitMark(5)},
     {G1: UnitMark(5)}, 256, None),
    ("a unit gone with its holder", {G0: UnitMark(None, frozenset({A}))}, {}, 256, BETTER),
    ("a holder goes over its slice", {G0: UnitMark(10, frozenset({A}))},
     {G0: UnitMark(10, frozenset({A}), frozenset({A}))}, 256, WORSE),
    ("another holder goes over", {G0: UnitMark(10, frozenset({A, B}), frozenset({A}))},
     {G0: UnitMark(10, frozenset({A, B}), frozenset({B}))}, 256, WORSE),
    ("no longer over", {G0: UnitMark(10, frozenset({A}), frozenset({A}))},
     {G0: UnitMark(10, frozenset({A}))}, 256, BETTER),
    ("no longer over, memory 0 threshold", {G0: UnitMark(10, frozenset({A}), frozenset({A}))},
     {G0: UnitMark(900, frozenset({A}))}, 0, BETTER),
    ("a holder left and another unit dropped: worse", {G0: UnitMark(10, frozenset({A})), G1: UnitMark(5_000)},
     {G0: UnitMark(10), G1: UnitMark(1_000)}, 256, WORSE),
    ("threshold 0: a rise is not followed either", {G0: UnitMark(1)}, {G0: UnitMark(10_900)}, 0, None),
    ("threshold 0: nor a new unit's memory", {}, {G0: UnitMark(10_900)}, 0, None),
    ("a holder left, free memory up as well: better", {G0: UnitMark(10, frozenset({A}))},
     {G0: UnitMark(5_000)}, 256, BETTER),
]  # fmt: skip


@pytest.mark.parametrize(
    ("published", "now", "drop_mib", "expected"),
    [c[1:] for c in CHANGE_CASES],
    ids=[c[0] for c in CHANGE_CASES],
)
def test_telemetry_change(published, now, drop_mib, expected) -> None:
    assert telemetry_change(published, now, drop_mib) == expected
