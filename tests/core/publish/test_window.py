"""The peak signal: the agent's window (least free memory, p95 utilisation), its place in the
telemetry, and the extender's ``window-min`` signal that decides on it."""

from __future__ import annotations

import json

import pytest

from omaticaya_py.core.model.window import PeakWindow, WindowSummary, p95
from omaticaya_py.core.publish.render import telemetry
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import GpuInfo, NodeGpuState, parse_node
from omaticaya_py.scheduler import ExtenderSettings
from omaticaya_py.scheduler.nodeview import with_signal
from omaticaya_py.scheduler.protocol import handle_filter, handle_prioritize
from tests.helpers import H100_TOTAL_MIB, gpu, lost, snapshot

P = "omaticaya.io/"
UUID0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([7.0], 7.0),
        ([1.0, 2.0], 2.0),
        ([float(v) for v in range(1, 21)], 19.0),  # 20 values: the 19th
        ([float(v) for v in range(1, 101)], 95.0),
        ([0.0] * 95 + [100.0] * 5, 0.0),  # 5 % of spikes are not the p95
        ([0.0] * 94 + [100.0] * 6, 100.0),
    ],
    ids=["one", "two", "twenty", "hundred", "five-pct-spikes", "six-pct-spikes"],
)
def test_p95_nearest_rank(values, expected):
    assert p95(values) == expected


def feed(window: PeakWindow, samples: list[tuple[float, int | None, float | None]]) -> None:
    for t, free, util in samples:
        window.add(snapshot(gpu(0, memory_free_mib=free, utilization_pct=util), clock_s=t))


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        # under half the window covered: nothing to say yet
        ([(0, 70000, 10.0), (100, 70000, 10.0)], None),
        # half covered: the minimum and the p95 of what is there
        ([(0, 70000, 10.0), (75, 5000, 90.0), (150, 70000, 10.0)], WindowSummary(5000, 90.0, 150)),
        # the dip aged out of the window (older than 300 s)
        (
            [(0, 5000, 90.0), (200, 70000, 10.0), (350, 70000, 20.0), (500, 69000, 10.0)],
            WindowSummary(69000, 20.0, 300),
        ),
        # NotSupported utilisation: the memory still counts
        ([(0, 60000, None), (200, 50000, None)], WindowSummary(50000, None, 200)),
        # the clock went back (a trace replayed from its start): a fresh window
        ([(0, 1000, 90.0), (400, 70000, 0.0), (10, 70000, 0.0)], None),
    ],
    ids=["under-half", "half", "aged-out", "no-utilisation", "clock-back"],
)
def test_window_summary(samples, expected):
    window = PeakWindow(300)
    feed(window, samples)
    assert window.summary(UUID0) == expected


def test_window_skips_unreadable_and_mig_gpus_and_keys_by_uuid():
    window = PeakWindow(10)
    for t in (0.0, 10.0):
        window.add(snapshot(
            gpu(0, memory_free_mib=1000), lost(1), gpu(2, mig_enabled=True), gpu(3, uuid=None),
            clock_s=t,
        ))  # fmt: skip
    assert window.summary(UUID0) == WindowSummary(1000, 0.0, 10.0)
    assert window.summary(PeakWindow.key(1, "GPU-00000001-7fda-b7ae-a94e-630097a14ca4")) is None
    assert window.summary(PeakWindow.key(2, "GPU-00000002-7fda-b7ae-a94e-630097a14ca4")) is None
    assert window.summary(PeakWindow.key(3, None)) == WindowSummary(81079, 0.0, 10.0)


@pytest.mark.parametrize("window_s", [0, -1, float("nan")])
def test_window_needs_a_positive_length(window_s):
    with pytest.raises(ValueError, match="window_s must be > 0"):
        PeakWindow(window_s)


def test_the_window_goes_into_the_telemetry_and_back():
    window = PeakWindow(60)
    feed(window, [(0, 70000, 5.0), (20, 4000, 97.0), (40, 70000, 5.0)])
    snap = snapshot(gpu(0, memory_free_mib=70000, utilization_pct=5.0), clock_s=40)
    raw = telemetry(snap, assess(snap), window=window)
    doc = json.loads(raw)
    assert doc["window_s"] == 60
    assert doc["gpus"][0]["memory_free_min_mib"] == 4000
    assert doc["gpus"][0]["utilization_p95_pct"] == 97.0
    state = parse_node("n", {P + "gpu.health": "Healthy"}, {P + "telemetry": raw})
    assert state.gpus == (GpuInfo(0, 70000, True, 4000, H100_TOTAL_MIB),)
    # without a window (or before it is half covered) the keys are absent, not null
    plain = json.loads(telemetry(snap, assess(snap)))
    assert "window_s" not in plain and "memory_free_min_mib" not in plain["gpus"][0]


@pytest.mark.parametrize(
    ("gpus", "signal", "free", "total"),
    [
        ((GpuInfo(0, 70000, True, 4000),), "now", (70000,), 70000),
        ((GpuInfo(0, 70000, True, 4000),), "window-min", (4000,), 4000),
        ((GpuInfo(0, 70000, True),), "window-min", (70000,), 70000),  # nothing published
        ((GpuInfo(0, 3000, True, 4000),), "window-min", (3000,), 3000),  # now is lower
        (
            (GpuInfo(0, 70000, True, 4000), GpuInfo(1, 50000, False, 1000)),
            "window-min",
            (4000, 1000),
            4000,  # the unhealthy GPU counts in no total
        ),
    ],
    ids=["now", "window-min", "unpublished", "now-lower", "unhealthy"],
)
def test_with_signal(gpus, signal, free, total):
    state = NodeGpuState("n", known=True, health="Healthy", gpus=gpus,
                         free_total_mib=sum(g.free_mib for g in gpus if g.healthy))  # fmt: skip
    out = with_signal(state, signal)
    assert tuple(g.free_mib for g in out.gpus) == free and out.free_total_mib == total


def test_window_min_rejects_a_dipping_gpu_that_now_would_choose():
    """Two nodes: ``dips`` has 70000 MiB free now but fell to 4000 within the window; ``steady``
    has 40000 all along. A 30 GiB pod: ``now`` ranks ``dips`` first (binpack on the least free
    is off: spread), ``window-min`` leaves it out."""
    window = PeakWindow(60)
    feed(window, [(0, 70000, 5.0), (20, 4000, 97.0), (40, 70000, 5.0)])
    dips_snap = snapshot(gpu(0, memory_free_mib=70000), clock_s=40)
    steady_snap = snapshot(gpu(0, memory_free_mib=40000), clock_s=40)
    docs = {
        "dips": telemetry(dips_snap, assess(dips_snap), window=window),
        "steady": telemetry(steady_snap, assess(steady_snap)),
    }
    pod = {"metadata": {"annotations": {P + "gpu-memory-mib": "30720"}}}
    now_s = dips_snap.read_at.timestamp() + 1

    def place(signal: str) -> tuple[list[str], dict[str, int]]:
        settings = ExtenderSettings(_env_file=None, placement_policy="spread", signal=signal)  # type: ignore[call-arg]
        states = {
            name: with_signal(
                parse_node(name, {P + "gpu.health": "Healthy"}, {P + "telemetry": raw}), signal
            )
            for name, raw in docs.items()
        }
        args = {"Pod": pod, "NodeNames": sorted(states)}
        passed = handle_filter(args, settings, states.get, now=now_s)["NodeNames"]
        scores = handle_prioritize({**args, "NodeNames": passed}, settings, states.get, now=now_s)
        return passed, {s["Host"]: s["Score"] for s in scores}

    passed, scores = place("now")
    assert passed == ["dips", "steady"] and scores["dips"] > scores["steady"]
    passed, scores = place("window-min")
    assert passed == ["steady"]


def test_extender_signal_setting():
    assert ExtenderSettings(_env_file=None).signal == "now"  # type: ignore[call-arg]
    assert ExtenderSettings(_env_file=None, signal="Window-Min").signal == "window-min"  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        ExtenderSettings(_env_file=None, signal="peak")  # type: ignore[call-arg]
