"""Trace replay: the real H100 trace by phase, utilisation means, the looping clock, Xid delivery,
fault injection through health and render, and bad trace files."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from statistics import fmean

import pytest

from omaticaya_py.core.model.snapshot import XidEvent
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.rules.health import Health, XidLedger, assess
from omaticaya_py.sources.replay import TraceError, TraceReader, load_trace
from tests.helpers import (
    FAULTS_TRACE,
    H100,
    H100_TRACE,
    MULTI_TRACE,
    Clock,
    h100_static,
    policy_of,
    prefixed,
    settings,
)

REPO = Path(__file__).resolve().parents[2]
OMATICAYA = REPO / ".venv" / "bin" / "omaticaya"
MIB = 1024 * 1024
H100_DOC = json.loads(H100_TRACE.read_text())
SAMPLES = H100_DOC["samples"]
PERIOD = SAMPLES[-1]["t"] + H100_DOC["interval_s"]  # one loop: last sample + one interval


def sample_at(t: float) -> dict:
    """The latest sample with ``t <= at``, from the JSON itself."""
    return [s for s in SAMPLES if s["t"] <= t][-1]


def free_mib(sample: dict) -> int:
    return sample["gpus"][0]["memory_bytes"]["free"] // MIB


def util_mean(lo: float, hi: float) -> float:
    """Mean GPU utilisation of the samples with unwrapped time in (lo, hi], looping the trace."""
    values = []
    cycle = 0
    while cycle * PERIOD <= hi:
        for s in SAMPLES:
            t = cycle * PERIOD + s["t"]
            if lo < t <= hi:
                values.append(s["gpus"][0]["utilization_pct"]["gpu"])
        cycle += 1
    return fmean(values)


def phase_at(t: float) -> str:
    phases = [p["phase"] for p in H100_DOC["phases"] if p["t"] <= t]
    return phases[-1] if phases else "start"


# --------------------------------------------------------------------------- the real H100 trace


def test_trace_copy_is_the_fixture_shape() -> None:
    trace = load_trace(H100_TRACE)
    assert len(trace.samples) == 99
    assert trace.devices[0].name == H100


def test_static_facts_and_not_supported_fields() -> None:
    snap = TraceReader(H100_TRACE, at_s=0.0).read()
    assert snap.error is None
    assert snap.driver_version == "580.159.04"
    assert snap.cuda_driver_version == (13, 0)
    assert snap.source == "trace:h100-trace.json"
    (g,) = snap.gpus
    assert (g.index, g.uuid, g.product, g.architecture, g.compute_major, g.compute_minor) == (
        0, "GPU-178dd196-7fda-b7ae-a94e-630097a14ca4", H100, "hopper", 9, 0,
    )
    assert (g.memory_total_mib, g.memory_free_mib, g.memory_used_mib) == (81559, 81079, 480)
    assert (g.temperature_c, g.power_w, g.performance_state) == (42, 129.497, 0)
    assert (g.ecc_uncorrected_volatile, g.remapped_rows_pending, g.remapped_rows_failure) == (0, False, False)
    assert (g.process_count, g.error) == (0, None)
    # fan speed and retired pages are NotSupported on the H100: not errors, not faults
    assert assess(snap).state is Health.HEALTHY


PHASE_POINTS = [
    # (at_s, window_s, phase)
    (3.0, 10.0, "start"),
    (6.0, 10.0, "idle"),
    (10.0, 10.0, "alloc_30gib_idle"),
    (12.0, 2.0, "alloc_30gib_busy"),
    (15.0, 1.0, "alloc_30gib_busy"),
    (17.0, 10.0, "alloc_30gib_busy"),
    (20.0, 1.0, "busy_small"),
    (23.5, 0.5, "released"),
    (25.5, 10.0, "released"),
]


@pytest.mark.parametrize(("at_s", "window_s", "phase"), PHASE_POINTS, ids=[f"{p[0]}s-{p[2]}" for p in PHASE_POINTS])
def test_snapshot_follows_the_trace(at_s, window_s, phase) -> None:
    assert phase_at(at_s) == phase
    snap = TraceReader(H100_TRACE, at_s=at_s, window_s=window_s).read()
    (g,) = snap.gpus
    assert snap.clock_s == at_s
    assert g.memory_free_mib == free_mib(sample_at(at_s))
    assert g.temperature_c == sample_at(at_s)["gpus"][0]["temperature_c"]
    assert g.utilization_pct == pytest.approx(util_mean(at_s - window_s, at_s))


def test_phases_move_free_memory_and_utilisation() -> None:
    def read(at_s: float, window_s: float = 1.0):
        return TraceReader(H100_TRACE, at_s=at_s, window_s=window_s).read().gpus[0]

    idle, alloc, busy, small, released = read(6.0), read(10.0), read(15.0), read(20.0), read(25.0)
    assert idle.memory_free_mib > 79 * 1024  # ~80 GiB free when idle
    assert 29 * 1024 < idle.memory_free_mib - alloc.memory_free_mib < 32 * 1024  # 30 GiB allocated
    assert (idle.utilization_pct, alloc.utilization_pct) == (0, 0)
    assert busy.utilization_pct == 100
    assert busy.power_w > 650
    assert small.utilization_pct >= 99 and small.memory_free_mib > 75 * 1024
    assert released.utilization_pct == 0 and released.memory_free_mib > 78 * 1024


H100_LABEL_POINTS = [
    (
        3.0,
        10.0,
        {
            **h100_static(1),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "80896",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "80896",
            "gpu-0.utilization-pct": "0",
            "gpu-0.temperature-c": "40",
        },
    ),
    (
        15.0,
        1.0,
        {
            **h100_static(1),
            "gpu.memory.free-mib": "49152",
            "gpu.memory.free-total-mib": "49152",
            "gpu.utilization-pct": "100",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "49152",
            "gpu-0.utilization-pct": "100",
            "gpu-0.temperature-c": "60",  # 58 C, step 5
        },
    ),
    (
        25.674,
        10.0,  # released: 0 % but the process still holds its context: not idle
        {
            **h100_static(1),
            "gpu.memory.free-mib": "79872",
            "gpu.memory.free-total-mib": "79872",
            "gpu.utilization-pct": "70",  # mean over (15.674, 25.674], see the test below
            "gpu.idle-count": "0",
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "79872",
            "gpu-0.utilization-pct": "70",
            "gpu-0.temperature-c": "50",  # 48 C, step 5
        },
    ),
]


@pytest.mark.parametrize(("at_s", "window_s", "expected"), H100_LABEL_POINTS, ids=[f"{p[0]}s" for p in H100_LABEL_POINTS])
def test_h100_trace_labels(at_s, window_s, expected) -> None:
    snap = TraceReader(H100_TRACE, at_s=at_s, window_s=window_s).read()
    s = settings(temperature_labels=True)  # the table pins gpu-0.temperature-c too
    assert render(snap, assess(snap), s).labels == prefixed(expected)


def test_released_point_utilisation_is_the_window_mean() -> None:
    # the literal "70" above: 40 samples in (15.674, 25.674]: 23 x 100 %, 5 x 99 %, 12 x 0 %
    assert util_mean(25.674 - 10.0, 25.674) == (23 * 100 + 5 * 99) / 40 == 69.875
    snap = TraceReader(H100_TRACE, at_s=25.674, window_s=10.0).read()
    assert snap.gpus[0].utilization_pct == 69.875


def test_second_read_at_a_pinned_time_reads_that_sample() -> None:
    reader = TraceReader(H100_TRACE, at_s=15.0, window_s=10.0)
    first = reader.read()
    second = reader.read()
    assert first.gpus[0].utilization_pct == pytest.approx(util_mean(5.0, 15.0))
    assert second.gpus[0].utilization_pct == sample_at(15.0)["gpus"][0]["utilization_pct"]["gpu"]


def test_no_loop_holds_the_last_sample() -> None:
    snap = TraceReader(H100_TRACE, at_s=100.0, loop=False, window_s=0.1).read()
    assert snap.gpus[0].memory_free_mib == free_mib(SAMPLES[-1])


# --------------------------------------------------------------------------- the looping clock


def test_wall_clock_replay_covers_successive_windows_and_wraps() -> None:
    clock = Clock(1000.0)
    reader = TraceReader(H100_TRACE, window_s=2.0, clock=clock)
    seen = []
    prev = None
    for k in range(31):  # 0..60 s: more than two loops of 25.924 s
        clock.t = 1000.0 + 2.0 * k
        snap = reader.read()
        now = 2.0 * k
        assert snap.clock_s == pytest.approx(now)
        lo = now - 2.0 if prev is None else prev
        g = snap.gpus[0]
        assert g.memory_free_mib == free_mib(sample_at(now % PERIOD)), now
        assert g.utilization_pct == pytest.approx(util_mean(lo, now)), now
        seen.append(g.memory_free_mib)
        prev = now
    # 26.0 s wraps to 0.076 s: idle again after "released"
    assert seen[12] == free_mib(SAMPLES[-1]) and seen[13] == free_mib(SAMPLES[0])
    assert seen[13:26] == seen[0:13]


def test_speed_factor() -> None:
    clock = Clock(0.0)
    reader = TraceReader(H100_TRACE, speed=4.0, clock=clock)
    reader.read()
    clock.t = 3.75  # 15 s of trace time
    assert reader.read().clock_s == 15.0


def test_xid_events_delivered_once_each_across_loops() -> None:
    clock = Clock(0.0)
    reader = TraceReader(FAULTS_TRACE, clock=clock)
    delivered: list[tuple[float, XidEvent]] = []
    for k in range(85):  # trace period is 40 s
        clock.t = float(k)
        snap = reader.read()
        delivered.extend((snap.clock_s, e) for e in snap.xid_events)
    assert [(t, replace(e, uuid=None)) for t, e in delivered] == [
        (5.0, XidEvent(index=1, xid=13, at_s=5.0)),
        (20.0, XidEvent(index=2, xid=79, at_s=20.0)),
        (45.0, XidEvent(index=1, xid=13, at_s=45.0)),
        (60.0, XidEvent(index=2, xid=79, at_s=60.0)),
    ]
    # each event names its GPU by UUID too (indices shift when a GPU is gone)
    assert {e.uuid for _, e in delivered} == {
        "GPU-00000001-7fda-b7ae-a94e-630097a14ca4",
        "GPU-00000002-7fda-b7ae-a94e-630097a14ca4",
    }


def test_first_read_delivers_every_xid_up_to_the_time_then_none() -> None:
    reader = TraceReader(FAULTS_TRACE, at_s=25.0)
    assert reader.read().xid_events == (
        XidEvent(1, 13, 5.0, "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"),
        XidEvent(2, 79, 20.0, "GPU-00000002-7fda-b7ae-a94e-630097a14ca4"),
    )
    assert reader.read().xid_events == ()
    assert TraceReader(FAULTS_TRACE, at_s=4.0).read().xid_events == ()


# --------------------------------------------------------------------------- the faults trace


def tick(at_s: float, **overrides) -> tuple:
    """What one tick of the agent computes from the faults trace at ``at_s``."""
    s = settings(**overrides)
    snap = TraceReader(FAULTS_TRACE, at_s=at_s).read()
    ledger = XidLedger(policy_of(s))
    ledger.record(snap.xid_events)
    health = assess(snap, ledger.recent(snap.clock_s), policy_of(s))
    return snap, health, render(snap, health, s)


STATIC4 = h100_static(4)


def gpu_labels(i: int, health: str, free: str | None, util: str | None, temp: str | None) -> dict[str, str]:
    out = {f"gpu-{i}.health": health}
    if free is not None:
        out[f"gpu-{i}.memory.free-mib"] = free
    if util is not None:
        out[f"gpu-{i}.utilization-pct"] = util
    if temp is not None:
        out[f"gpu-{i}.temperature-c"] = temp
    return out


ALL_FOUR = {
    **gpu_labels(0, "Healthy", "80896", "0", "40"),
    **gpu_labels(1, "Healthy", "60416", "50", "55"),
    **gpu_labels(2, "Healthy", "19456", "100", "70"),
    **gpu_labels(3, "Healthy", "80896", "0", None),  # temperature NotSupported
}

FAULT_POINTS = [
    (
        "t7-ignored-xid-13-all-healthy",
        7.0,
        {},
        {
            **STATIC4,
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "241664",  # 242396 down to 1024
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "2",
            "gpu.healthy-count": "4",
            "gpu.health": "Healthy",
            **ALL_FOUR,
        },
    ),
    (
        "t12-remap-pending-on-gpu1",
        12.0,
        {},
        {
            **STATIC4,
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "181248",  # 181797 down to 1024
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "2",
            "gpu.healthy-count": "3",
            "gpu.health": "Degraded",
            **ALL_FOUR,
            "gpu-1.health": "Unhealthy",
        },
    ),
    (
        "t25-xid-79-on-gpu2-and-gpu3-lost",
        25.0,
        {},
        {
            **STATIC4,
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "141312",  # 141678 down to 1024
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "2",
            "gpu.health": "Degraded",
            **gpu_labels(0, "Healthy", "80896", "0", "40"),
            **gpu_labels(1, "Healthy", "60416", "50", "55"),
            **gpu_labels(2, "Unhealthy", "19456", "100", "70"),
            **gpu_labels(3, "Unhealthy", None, None, None),
        },
    ),
    ("t33-driver-not-loaded", 33.0, {}, {"gpu.health": "Unknown"}),
    (
        "t38-gpu3-back-xid-still-within-600s",
        38.0,
        {},
        {
            **STATIC4,
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "222208",  # 222757 down to 1024
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "2",
            "gpu.healthy-count": "3",
            "gpu.health": "Degraded",
            **ALL_FOUR,
            "gpu-2.health": "Unhealthy",
        },
    ),
    (
        "t38-xid-expired-with-10s-quiet-window",
        38.0,
        {"xid_quiet_s": 10},
        {
            **STATIC4,
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "241664",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "2",
            "gpu.healthy-count": "4",
            "gpu.health": "Healthy",
            **ALL_FOUR,
        },
    ),
    (
        "t7-xid-13-fatal-when-all-fatal",
        7.0,
        {"xid_all_fatal": True, "per_gpu_labels": False},
        {
            **STATIC4,
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "181248",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "2",
            "gpu.healthy-count": "3",
            "gpu.health": "Degraded",
        },
    ),
]


@pytest.mark.parametrize(("name", "at_s", "overrides", "expected"), FAULT_POINTS, ids=[p[0] for p in FAULT_POINTS])
def test_faults_trace_labels(name, at_s, overrides, expected) -> None:
    # the table pins the gpu-N.temperature-c labels too (opt-in)
    _, _, desired = tick(at_s, **{"temperature_labels": True, **overrides})
    assert desired.labels == prefixed(expected)
    assert desired.dropped == ()


FAULT_REASONS = [
    (3.0, {0: (), 1: (), 2: (), 3: ()}, Health.HEALTHY),
    (7.0, {0: (), 1: (), 2: (), 3: ()}, Health.HEALTHY),
    (12.0, {0: (), 1: ("remap-pending",), 2: (), 3: ()}, Health.DEGRADED),
    (16.0, {0: (), 1: (), 2: (), 3: ()}, Health.HEALTHY),
    (21.0, {0: (), 1: (), 2: ("xid-79",), 3: ()}, Health.DEGRADED),
    (25.0, {0: (), 1: (), 2: ("xid-79",), 3: ("lost",)}, Health.DEGRADED),
    (29.0, {0: (), 1: (), 2: ("xid-79",), 3: ()}, Health.DEGRADED),
    (33.0, {}, Health.UNKNOWN),
    (36.0, {0: (), 1: (), 2: ("xid-79",), 3: ()}, Health.DEGRADED),
]


@pytest.mark.parametrize(("at_s", "reasons", "state"), FAULT_REASONS, ids=[f"{p[0]}s" for p in FAULT_REASONS])
def test_faults_trace_health(at_s, reasons, state) -> None:
    snap, health, _ = tick(at_s)
    assert {i: g.reasons for i, g in health.gpus.items()} == reasons
    assert health.state is state


def test_faults_trace_not_supported_fields_are_absent_not_errors() -> None:
    snap, health, desired = tick(3.0)
    g0, _, _, g3 = snap.gpus
    assert (g0.power_w, g0.error) == (None, None)
    assert (g3.temperature_c, g3.ecc_uncorrected_volatile, g3.error) == (None, None, None)
    doc = json.loads(desired.annotations["omaticaya.io/telemetry"])
    assert [g["power_w"] for g in doc["gpus"]] == [None, 350.0, 690.0, 121.0]
    assert [g["temperature_c"] for g in doc["gpus"]] == [40, 55, 70, None]


def test_faults_trace_lost_gpu_keeps_static_facts() -> None:
    snap, _, _ = tick(25.0)
    g3 = snap.gpus[3]
    assert (g3.index, g3.error, g3.product, g3.uuid) == (
        3, "NVMLError_GpuIsLost", H100, "GPU-00000003-7fda-b7ae-a94e-630097a14ca4",
    )
    assert g3.memory_free_mib is None


def test_faults_trace_driver_not_loaded_snapshot() -> None:
    snap = TraceReader(FAULTS_TRACE, at_s=33.0).read()
    assert (snap.error, snap.gpus, snap.driver_version) == ("NVMLError_DriverNotLoaded", (), None)


def test_faults_trace_utilisation_mean_skips_driver_outage() -> None:
    # window (28, 38]: samples 29-31 and 35-38 carry GPU 1's 55/45 alternation; 32-34 have none
    snap = TraceReader(FAULTS_TRACE, at_s=38.0).read()
    assert snap.gpus[1].utilization_pct == pytest.approx((55 + 45 + 55 + 55 + 45 + 55 + 45) / 7)


# --------------------------------------------------------------------------- the 8-GPU trace


def test_multi_gpu_trace_labels() -> None:
    snap = TraceReader(MULTI_TRACE, at_s=9.5).read()
    desired = render(snap, assess(snap), settings(temperature_labels=True))
    assert desired.labels == prefixed(
        {
            **h100_static(8),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "406528",  # 406968 down to 1024
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "3",  # GPUs 0, 4, 6 (mean 1 %)
            "gpu.healthy-count": "8",
            "gpu.health": "Healthy",
            **gpu_labels(0, "Healthy", "80896", "0", "40"),
            **gpu_labels(1, "Healthy", "50176", "100", "70"),
            **gpu_labels(2, "Healthy", "70656", "30", "50"),
            **gpu_labels(3, "Healthy", "9216", "100", "65"),  # mean 95, half up
            **gpu_labels(4, "Healthy", "80896", "0", "40"),
            **gpu_labels(5, "Healthy", "34816", "70", "60"),  # mean 65, half up
            **gpu_labels(6, "Healthy", "75776", "0", "40"),
            **gpu_labels(7, "Healthy", "3072", "100", "70"),
        }
    )


def test_multi_gpu_trace_raw_sample_with_a_small_window() -> None:
    snap = TraceReader(MULTI_TRACE, at_s=9.0, window_s=0.4).read()
    assert [g.utilization_pct for g in snap.gpus] == [0, 100, 20, 90, 0, 60, 0, 100]
    assert [g.process_count for g in snap.gpus] == [0, 1, 1, 2, 0, 1, 0, 3]
    assert [g.uuid for g in snap.gpus] == [f"GPU-{i:08d}-7fda-b7ae-a94e-630097a14ca4" for i in range(8)]


# --------------------------------------------------------------------------- bad traces


def _mutate(fn):
    doc = copy.deepcopy(H100_DOC)
    fn(doc)
    return json.dumps(doc)


def _set(path, value):
    def fn(doc):
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return fn


def _del(path):
    def fn(doc):
        target = doc
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return fn


BAD_TRACES = [
    # (id, file text or None for a missing file, expected text after "<path>: ")
    ("missing-samples", _mutate(_del(["samples"])), "samples: Field required"),
    ("empty-samples", _mutate(_set(["samples"], [])), "samples: List should have at least 1 item"),
    ("gpu-without-index", _mutate(_del(["samples", 3, "gpus", 0, "index"])), "samples[3].gpus[0].index: Field required"),
    ("t-a-string", _mutate(_set(["samples", 3, "t"], "soon")), "samples[3].t: Input should be a valid number"),
    ("neither-gpus-nor-error", _mutate(_del(["samples", 5, "gpus"])), "samples[5]: a sample needs 'gpus' or 'nvml_error'"),
    ("gpus-not-a-list", _mutate(_set(["samples", 2, "gpus"], {"index": 0})), "samples[2].gpus: Input should be a valid list"),
    ("xid-without-code", _mutate(_set(["samples", 1, "xid_events"], [{"index": 0}])), "samples[1].xid_events[0].xid: Field required"),
    ("interval-zero", _mutate(_set(["interval_s"], 0)), "interval_s: Input should be greater than 0"),
    ("out-of-order", _mutate(_set(["samples", 3, "t"], 100.0)), "samples must be in order of 't'"),
    ("not-json", '{"samples": [', "not JSON: line 1"),
    ("not-an-object", "[1, 2, 3]", "(top level): expected a JSON object"),
    ("missing-file", None, "cannot read trace: No such file or directory"),
    # the bad-input campaign (docs/bad-input.md)
    ("truncated", json.dumps(H100_DOC)[:5000], "not JSON: line"),
    ("nan-memory", _mutate(_set(["samples", 2, "gpus", 0, "temperature_c"], float("nan"))), "samples[2].gpus[0].temperature_c: Input should be a finite number"),
    ("infinite-t", _mutate(_set(["samples", 2, "t"], float("inf"))), "samples[2].t: Input should be a finite number"),
    ("negative-memory", _mutate(_set(["samples", 4, "gpus", 0, "memory_bytes", "free"], -1)), "samples[4].gpus[0].memory_bytes.free: Input should be greater than or equal to 0"),
    ("memory-a-string", _mutate(_set(["samples", 4, "gpus", 0, "memory_bytes", "free"], "lots")), "samples[4].gpus[0].memory_bytes.free: Input should be a valid integer"),
    ("duplicate-gpu", _mutate(lambda d: d["samples"][1]["gpus"].append(copy.deepcopy(d["samples"][1]["gpus"][0]))), "samples[1]: gpus[1]: index 0 appears twice"),
    ("10000-gpus", _mutate(lambda d: d["samples"][0].update(gpus=[{"index": i, "nvml_error": "NVMLError_GpuIsLost"} for i in range(10_000)])), "samples[0].gpus: List should have at most 1024 items"),
    ("gpu-index-huge", _mutate(_set(["samples", 0, "gpus", 0, "index"], 10**12)), "samples[0].gpus[0].index: Input should be less than 1024"),
    ("format-version-4", _mutate(_set(["format_version"], 4)), "format_version: 4 is not a version this reader replays (1, 2, 3); upgrade omaticaya"),
]


def _write(tmp_path: Path, name: str, text: str | None) -> Path:
    path = tmp_path / f"{name}.json"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("name", "text", "expected"), BAD_TRACES, ids=[b[0] for b in BAD_TRACES])
def test_bad_trace_names_file_and_place(tmp_path, name, text, expected) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(TraceError) as info:
        TraceReader(path)
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{path}: ")
    assert expected in lines[0]
    assert all(line.startswith(f"{path}: ") for line in lines)


def test_bad_union_field_is_one_line(tmp_path) -> None:
    path = _write(tmp_path, "mem", _mutate(_del(["samples", 3, "gpus", 0, "memory_bytes", "free"])))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert str(info.value) == f"{path}: samples[3].gpus[0].memory_bytes.free: Field required"


def test_non_utf8_trace_is_a_trace_error(tmp_path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00\x01 not text")
    with pytest.raises(TraceError, match=r"^.*binary\.json: "):
        load_trace(path)


def test_nan_utilisation_is_rejected_at_load(tmp_path) -> None:
    # json.loads reads NaN (Python's json writes and reads it); the trace's models refuse it
    # (allow_inf_nan=False), at load, naming the place: the first "gpu": 100 is sample 47's GPU 0
    text = json.dumps(H100_DOC).replace('"gpu": 100', '"gpu": NaN', 1)
    assert "NaN" in text  # the replacement happened: the trace still has a "gpu": 100
    path = _write(tmp_path, "nan", text)
    with pytest.raises(TraceError) as info:
        TraceReader(path, at_s=13.0, window_s=0.1)
    assert str(info.value) == (
        f"{path}: samples[47].gpus[0].utilization_pct.gpu: Input should be a finite number"
    )


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    exe = [str(OMATICAYA)] if OMATICAYA.exists() else [sys.executable, "-m", "omaticaya_py"]
    env = {k: v for k, v in os.environ.items() if not (k.startswith("OMATICAYA_") or k == "NODE_NAME")}
    return subprocess.run([*exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


CLI_BAD = [b for b in BAD_TRACES if b[0] in {"gpu-without-index", "not-json", "missing-file", "out-of-order"}]


@pytest.mark.parametrize(("name", "text", "expected"), CLI_BAD, ids=[b[0] for b in CLI_BAD])
def test_cli_bad_trace_exits_2(tmp_path, name, text, expected) -> None:
    path = _write(tmp_path, name, text)
    proc = _cli(["show", "--trace", str(path)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    if name == "missing-file":  # caught by the settings, which name the flag
        assert line.startswith(f"omaticaya: invalid setting --trace='{path}': ")
        return
    assert line.startswith(f"omaticaya: {path}: ")
    assert expected in line


def test_cli_show_good_traces(tmp_path) -> None:
    for trace, at in [(H100_TRACE, "15"), (FAULTS_TRACE, "25"), (MULTI_TRACE, "9.5")]:
        proc = _cli(["show", "--json", "--trace", str(trace), "--trace-at", at], tmp_path)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["labels"]["omaticaya.io/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_a_huge_trace_file_is_refused_before_it_is_read(tmp_path) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: no disk used, but stat() says 600 MiB
        f.truncate(600 * 1024 * 1024)
    with pytest.raises(TraceError) as info:
        TraceReader(path)
    assert str(info.value) == (
        f"{path}: 600 MiB is larger than a trace can be (512 MiB): record a shorter one"
    )


# -- GPM (issue 40): a reading's ``gpm`` object replayed -----------------------------------------


def gpm_trace(tmp_path: Path, rows: list[tuple[float, int, dict | None]]) -> Path:
    """The H100 trace's first reading at ``(t, classic utilisation, gpm object or None)``."""
    doc = copy.deepcopy(H100_DOC)
    doc.pop("phases", None)
    doc["interval_s"] = 1.0
    base = SAMPLES[0]["gpus"][0]
    doc["samples"] = []
    for t, util, gpm in rows:
        g = copy.deepcopy(base)
        g["utilization_pct"] = {"gpu": util, "memory": 3}
        if gpm is not None:
            g["gpm"] = gpm
        doc["samples"].append({"t": t, "gpus": [g]})
    path = tmp_path / "gpm-trace.json"
    path.write_text(json.dumps(doc))
    return path


GPM_ROWS = [
    (0.0, 99, {"supported": True, "sm_active_pct": 10.0, "tensor_active_pct": 1.0, "dram_bw_pct": 5.0, "graphics_pct": 99.0}),
    (1.0, 99, {"supported": True, "sm_active_pct": 20.0, "tensor_active_pct": 2.0, "dram_bw_pct": 5.0}),
    (3.0, 99, {"supported": True, "sm_active_pct": 50.0, "tensor_active_pct": 4.0, "dram_bw_pct": 150.0}),
    (4.0, 99, {"supported": True, "sm_active_pct": 80.0, "tensor_active_pct": {"nvml_error": "NVMLError_Unknown"}}),
]


def test_gpm_is_the_time_weighted_mean_since_the_last_read_and_utilisation_is_sm(tmp_path) -> None:
    trace = gpm_trace(tmp_path, GPM_ROWS)
    clock = Clock()
    reader = TraceReader(trace, window_s=0.5, clock=clock)
    g = reader.read().gpus[0]  # t=0: the first sample alone
    assert (g.sm_active_pct, g.tensor_active_pct, g.dram_bw_pct) == (10.0, 1.0, 5.0)
    assert g.utilization_pct == 10.0
    clock.t += 3.0  # window (0, 3]: samples at 1 (weight 1) and 3 (weight 2)
    g = reader.read().gpus[0]
    assert g.sm_active_pct == pytest.approx((20.0 * 1 + 50.0 * 2) / 3)
    assert g.utilization_pct == g.sm_active_pct
    assert g.tensor_active_pct == pytest.approx((2.0 + 4.0 * 2) / 3)
    assert g.dram_bw_pct == pytest.approx((5.0 + 100.0 * 2) / 3)  # 150 clamped to 100
    assert g.memory_utilization_pct == 3
    clock.t += 1.0  # window (3, 4]: sample 4; its tensor metric failed, DRAM absent
    g = reader.read().gpus[0]
    assert g.sm_active_pct == 80.0 == g.utilization_pct
    assert g.tensor_active_pct is None and g.dram_bw_pct is None


def test_gpm_absent_in_part_of_the_window_falls_back_to_classic_utilisation(tmp_path) -> None:
    rows = [
        (0.0, 10, None),
        (1.0, 30, {"supported": False}),
        (2.0, 50, {"supported": True, "sm_active_pct": 5.0}),
        (3.0, 70, {"supported": True, "sm_active_pct": 7.0}),
    ]
    trace = gpm_trace(tmp_path, rows)
    snap = TraceReader(trace, at_s=2.0, window_s=2.5).read()  # samples 0..2, GPM in one only
    g = snap.gpus[0]
    assert g.sm_active_pct is None and g.utilization_pct == pytest.approx(30.0)
    g = TraceReader(trace, at_s=3.0, window_s=1.5).read().gpus[0]  # samples 2 and 3
    assert g.sm_active_pct == pytest.approx(6.0) == g.utilization_pct
    g = TraceReader(trace, at_s=1.0, window_s=0.5).read().gpus[0]  # "supported": false
    assert g.sm_active_pct is None and g.utilization_pct == 30


def test_gpm_loops_with_the_first_sample_covering_the_wrap(tmp_path) -> None:
    rows = [
        (0.0, 99, {"supported": True, "sm_active_pct": 0.0}),
        (1.0, 99, {"supported": True, "sm_active_pct": 60.0}),
    ]
    trace = gpm_trace(tmp_path, rows)  # period 2 s: sample 0 covers (1, 2] of the loop
    clock = Clock()
    reader = TraceReader(trace, window_s=0.5, clock=clock)
    reader.read()
    clock.t += 3.0  # window (0, 3]: sample 1 (60, 1 s), sample 0 again (0, 1 s), sample 1 (60, 1 s)
    g = reader.read().gpus[0]
    assert g.sm_active_pct == pytest.approx(40.0) == g.utilization_pct


def test_a_recordings_first_sample_without_metrics_leaves_the_mean_to_the_others(tmp_path) -> None:
    """``omaticaya record``'s first sample has GPM but no metrics (GPM needs a previous sample):
    a window holding it averages the samples that have them, as the live reader would."""
    rows = [
        (0.0, 99, {"supported": True}),
        (1.0, 99, {"supported": True, "sm_active_pct": 60.0, "dram_bw_pct": 10.0}),
        (2.0, 99, {"supported": True, "sm_active_pct": 90.0}),
    ]
    trace = gpm_trace(tmp_path, rows)
    g = TraceReader(trace, at_s=1.0, window_s=1.5).read().gpus[0]  # samples 0 and 1
    assert g.sm_active_pct == 60.0 == g.utilization_pct and g.dram_bw_pct == 10.0
    g = TraceReader(trace, at_s=2.0, window_s=2.5).read().gpus[0]  # samples 0..2
    assert g.sm_active_pct == pytest.approx(75.0) and g.dram_bw_pct == 10.0
    assert g.tensor_active_pct is None  # in no sample
    g = TraceReader(trace, at_s=0.0).read().gpus[0]  # the first sample alone
    assert g.sm_active_pct is None and g.utilization_pct == 99


def test_a_gpm_error_object_is_no_gpm(tmp_path) -> None:
    rows = [(0.0, 42, {"nvml_error": "NVMLError_Unknown", "message": "Unknown"})]
    g = TraceReader(gpm_trace(tmp_path, rows), at_s=0.0).read().gpus[0]
    assert g.sm_active_pct is None and g.utilization_pct == 42


def test_traces_without_gpm_have_no_gpm_fields() -> None:
    for trace in (H100_TRACE, FAULTS_TRACE, MULTI_TRACE):
        snap = TraceReader(trace, at_s=5.0).read()
        assert all(g.sm_active_pct is None and g.dram_bw_pct is None for g in snap.gpus)
