"""Health rules: per-GPU reasons, the node summary, and the Xid ledger (window and recovery)."""

from __future__ import annotations

import pytest

from omaticaya_py.core.rules.health import (
    GpuHealth,
    Health,
    NodeHealth,
    XidLedger,
    XidPolicy,
    assess,
    assess_gpu,
)
from tests.helpers import gpu, lost, snapshot, xid

DEFAULT = XidPolicy()
ALL_FATAL = XidPolicy(all_fatal=True)
SHORT = XidPolicy(quiet_s=60.0)

GPU_CASES = [
    # (id, reading, xid events, policy, expected reasons)
    ("healthy", gpu(0), [], DEFAULT, ()),
    ("lost", lost(0), [], DEFAULT, ("lost",)),
    ("read-error-unknown", lost(0, error="NVMLError_Unknown"), [], DEFAULT, ("read-error",)),
    ("read-error-timeout", lost(0, error="NVMLError_Timeout"), [], DEFAULT, ("read-error",)),
    ("remap-pending", gpu(0, remapped_rows_pending=True), [], DEFAULT, ("remap-pending",)),
    ("remap-failure", gpu(0, remapped_rows_failure=True), [], DEFAULT, ("remap-failure",)),
    ("ecc-dbe", gpu(0, ecc_uncorrected_volatile=1), [], DEFAULT, ("ecc-dbe",)),
    ("ecc-dbe-many", gpu(0, ecc_uncorrected_volatile=7), [], DEFAULT, ("ecc-dbe",)),
    ("ecc-corrected-only", gpu(0, ecc_corrected_volatile=12345), [], DEFAULT, ()),
    ("xid-79", gpu(0), [xid(0, 79)], DEFAULT, ("xid-79",)),
    ("xid-79-twice", gpu(0), [xid(0, 79, 80.0), xid(0, 79, 90.0)], DEFAULT, ("xid-79",)),
    ("xid-48-and-79-sorted", gpu(0), [xid(0, 79), xid(0, 48)], DEFAULT, ("xid-48", "xid-79")),
    ("xid-on-other-gpu", gpu(0), [xid(1, 79)], DEFAULT, ()),
    (
        "everything-at-once",
        gpu(0, remapped_rows_pending=True, remapped_rows_failure=True, ecc_uncorrected_volatile=2),
        [xid(0, 94)],
        DEFAULT,
        ("remap-pending", "remap-failure", "ecc-dbe", "xid-94"),
    ),
    (
        "not-supported-everywhere",
        gpu(
            0,
            memory_free_mib=None,
            utilization_pct=None,
            memory_total_mib=None,
            temperature_c=None,
            power_w=None,
            performance_state=None,
            ecc_uncorrected_volatile=None,
            ecc_corrected_volatile=None,
            remapped_rows_pending=None,
            remapped_rows_failure=None,
            process_count=None,
        ),
        [],
        DEFAULT,
        (),
    ),
    *[(f"ignored-xid-{code}", gpu(0), [xid(0, code)], DEFAULT, ()) for code in (13, 31, 43, 45, 68, 109)],
    *[
        (f"all-fatal-xid-{code}", gpu(0), [xid(0, code)], ALL_FATAL, (f"xid-{code}",))
        for code in (13, 31, 43, 45, 68, 109)
    ],
    ("custom-ignore-79", gpu(0), [xid(0, 79), xid(0, 13)], XidPolicy(ignore=frozenset({79})), ("xid-13",)),
    # snapshot clock is 100.0; quiet window 60 s
    ("xid-inside-window", gpu(0), [xid(0, 79, 40.5)], SHORT, ("xid-79",)),
    ("xid-at-window-edge-expired", gpu(0), [xid(0, 79, 40.0)], SHORT, ()),
    ("xid-outside-window", gpu(0), [xid(0, 79, 10.0)], SHORT, ()),
    ("xid-default-window-600s", gpu(0), [xid(0, 79, -499.0)], DEFAULT, ("xid-79",)),
    ("xid-default-window-expired", gpu(0), [xid(0, 79, -501.0)], DEFAULT, ()),
    pytest.param(
        "ecc-negative-is-not-a-fault",
        gpu(0, ecc_uncorrected_volatile=-1),
        [],
        DEFAULT,
        (),
        id="ecc-negative-is-not-a-fault",
    ),
]


def _id(case) -> str | None:
    return case[0] if isinstance(case, tuple) else None


@pytest.mark.parametrize(("name", "reading", "events", "policy", "reasons"), GPU_CASES, ids=[_id(c) for c in GPU_CASES])
def test_gpu_reasons(name, reading, events, policy, reasons) -> None:
    health = assess(snapshot(reading, clock_s=100.0), events, policy)
    assert health.gpus == {0: GpuHealth(index=0, reasons=reasons)}
    gh = health.gpus[0]
    assert gh.healthy is (reasons == ())
    assert gh.state is (Health.HEALTHY if not reasons else Health.UNHEALTHY)


def test_assess_gpu_direct() -> None:
    assert assess_gpu(gpu(3), [79, 79, 48]) == GpuHealth(index=3, reasons=("xid-48", "xid-79"))
    assert assess_gpu(lost(3)).state is Health.UNHEALTHY


NODE_CASES = [
    ("all-healthy", snapshot(gpu(0), gpu(1)), [], Health.HEALTHY, {0, 1}),
    ("one-healthy-gpu", snapshot(gpu(0)), [], Health.HEALTHY, {0}),
    ("one-lost-of-two", snapshot(gpu(0), lost(1)), [], Health.DEGRADED, {0}),
    ("xid-on-one-of-eight", snapshot(*(gpu(i) for i in range(8))), [xid(5, 79)], Health.DEGRADED, {0, 1, 2, 3, 4, 6, 7}),
    ("all-unhealthy", snapshot(lost(0), gpu(1, ecc_uncorrected_volatile=1)), [], Health.UNHEALTHY, set()),
    ("single-gpu-unhealthy", snapshot(gpu(0, remapped_rows_failure=True)), [], Health.UNHEALTHY, set()),
    ("library-error", snapshot(gpu(0), error="NVMLError_DriverNotLoaded"), [], Health.UNKNOWN, set()),
    ("no-gpus", snapshot(), [], Health.UNKNOWN, set()),
    ("ignored-xid-still-healthy", snapshot(gpu(0), gpu(1)), [xid(1, 13)], Health.HEALTHY, {0, 1}),
]


@pytest.mark.parametrize(("name", "snap", "events", "state", "healthy"), NODE_CASES, ids=[c[0] for c in NODE_CASES])
def test_node_state(name, snap, events, state, healthy) -> None:
    health = assess(snap, events)
    assert isinstance(health, NodeHealth)
    assert health.state is state
    assert health.healthy_indices == frozenset(healthy)
    assert set(health.gpus) == {g.index for g in snap.gpus}


def test_health_values_are_label_strings() -> None:
    assert [str(h) for h in Health] == ["Healthy", "Degraded", "Unhealthy", "Unknown"]


def test_policy_fatal() -> None:
    assert [c for c in (13, 31, 43, 45, 48, 63, 64, 68, 74, 79, 94, 95, 109, 119) if DEFAULT.fatal(c)] == [
        48, 63, 64, 74, 79, 94, 95, 119
    ]
    assert all(ALL_FATAL.fatal(c) for c in (13, 31, 43, 45, 68, 109, 79))


# --------------------------------------------------------------------------- the ledger


def test_ledger_records_only_fatal_events() -> None:
    ledger = XidLedger(XidPolicy(quiet_s=60.0))
    ledger.record([xid(0, 13, 10.0), xid(1, 79, 10.0), xid(2, 31, 11.0), xid(2, 48, 12.0)])
    assert ledger.recent(20.0) == (xid(1, 79, 10.0), xid(2, 48, 12.0))


def test_ledger_keeps_the_latest_event_of_each_gpu_and_xid_through_a_flood() -> None:
    """A flood of one Xid (one event a millisecond for 10 minutes) costs one entry per
    (GPU, Xid), and the latest time is the one the quiet window runs from."""
    ledger = XidLedger(XidPolicy(quiet_s=600.0))
    for ms in range(600_000):
        ledger.record([xid(0, 79, ms / 1000.0)])
    ledger.record([xid(1, 48, 5.0), xid(1, 48, 4.0)])  # an older event does not move it back
    assert ledger.recent(600.0) == (xid(1, 48, 5.0), xid(0, 79, 599.999))
    assert ledger.recent(1199.998) == (xid(0, 79, 599.999),)
    assert ledger.recent(1200.0) == ()


def test_ledger_is_bounded_in_gpu_xid_pairs_keeping_the_newest() -> None:
    ledger = XidLedger(XidPolicy(quiet_s=1e9, all_fatal=True))
    ledger.record([xid(0, code, float(code)) for code in range(XidLedger.MAX_ENTRIES + 10)])
    kept = ledger.recent(0.0)
    assert len(kept) == XidLedger.MAX_ENTRIES
    assert kept[0].xid == 10 and kept[-1].xid == XidLedger.MAX_ENTRIES + 9


def test_ledger_all_fatal_keeps_application_xids() -> None:
    ledger = XidLedger(XidPolicy(all_fatal=True))
    ledger.record([xid(0, 13, 10.0)])
    assert ledger.recent(20.0) == (xid(0, 13, 10.0),)


def test_ledger_forgets_after_quiet_window_and_gpu_recovers() -> None:
    policy = XidPolicy(quiet_s=60.0)
    ledger = XidLedger(policy)
    reading = gpu(2)
    timeline = []
    for now, events in [
        (100.0, [xid(2, 79, 100.0)]),
        (130.0, []),
        (159.9, []),
        (160.0, []),  # 60 s after: expired
        (200.0, []),
    ]:
        ledger.record(events)
        snap = snapshot(reading, clock_s=now, xid_events=events)
        timeline.append((now, assess(snap, ledger.recent(now), policy).gpus[2].reasons))
    assert timeline == [
        (100.0, ("xid-79",)),
        (130.0, ("xid-79",)),
        (159.9, ("xid-79",)),
        (160.0, ()),
        (200.0, ()),
    ]
    assert ledger.recent(200.0) == ()


def test_ledger_second_xid_extends_the_window() -> None:
    ledger = XidLedger(XidPolicy(quiet_s=60.0))
    ledger.record([xid(0, 79, 0.0)])
    ledger.record([xid(0, 79, 50.0)])
    assert ledger.recent(70.0) == (xid(0, 79, 50.0),)
    assert ledger.recent(110.0) == ()


def test_ledger_reset() -> None:
    ledger = XidLedger(DEFAULT)
    ledger.record([xid(0, 79, 0.0)])
    ledger.reset()
    assert ledger.recent(1.0) == ()


def test_other_faults_recover_when_cleared() -> None:
    states = [
        assess(snapshot(g)).state
        for g in (gpu(0), gpu(0, remapped_rows_pending=True), gpu(0), lost(0), gpu(0))
    ]
    assert states == [Health.HEALTHY, Health.UNHEALTHY, Health.HEALTHY, Health.UNHEALTHY, Health.HEALTHY]
