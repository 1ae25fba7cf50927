"""``core.rules.health`` cases that mutation testing (``scripts/mutation``) found no test pinned:
``mig-lost`` against ``mig-read-error``, an Xid for a UUID no GPU has, the quiet window's edge,
units' fields and reasons, the node summary with MIG devices, and the Xid ledger's
bookkeeping (ties, the window's edge, seeding counts)."""

from __future__ import annotations

from typing import Any

import pytest

from omaticaya_py.core.model.snapshot import GpuReading, MigReading, XidEvent
from omaticaya_py.core.rules.health import (
    GpuHealth,
    Health,
    Unit,
    XidLedger,
    XidPolicy,
    assess,
    assess_gpu,
    schedulable_units,
)
from tests.helpers import gpu, lost, snapshot

UUID0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"  # tests.helpers.gpu(0)'s
UUID1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"


def mig(index: int, error: str | None = None, **kw: Any) -> MigReading:
    fields: dict[str, Any] = {
        "uuid": f"MIG-{index:08d}-0000-0000-0000-000000000000",
        "profile": "1g.10gb",
        "memory_total_mib": 9984,
        "memory_used_mib": 984,
        "memory_free_mib": 9000,
        "process_count": 1,
    }
    fields.update(kw)
    return MigReading(index=index, error=error, **fields)


def mig_gpu(index: int, *migs: MigReading, **kw: Any) -> GpuReading:
    return gpu(index, utilization_pct=None, mig_enabled=True, mig_devices=migs, **kw)


# --- one GPU's reasons --------------------------------------------------------------------------

GPU_CASES = [
    # (id, reading, fatal xids, reasons)
    ("lost", lost(0), (), ("lost",)),
    ("another read error", lost(0, "NVMLError_Unknown"), (), ("read-error",)),
    ("an error naming GpuIsLost inside is not lost", lost(0, "NVMLError_GpuIsLostNot"), (), ("read-error",)),
    ("remap pending", gpu(0, remapped_rows_pending=True), (), ("remap-pending",)),
    ("remap failure", gpu(0, remapped_rows_failure=True), (), ("remap-failure",)),
    ("one double-bit error", gpu(0, ecc_uncorrected_volatile=1), (), ("ecc-dbe",)),
    ("no double-bit error", gpu(0, ecc_uncorrected_volatile=0), (), ()),
    ("ECC not supported", gpu(0, ecc_uncorrected_volatile=None), (), ()),
    ("Xids once each, in code order", gpu(0), (79, 48, 79), ("xid-48", "xid-79")),
    ("every fault, in the documented order",
     gpu(0, remapped_rows_pending=True, remapped_rows_failure=True, ecc_uncorrected_volatile=2), (94,),
     ("remap-pending", "remap-failure", "ecc-dbe", "xid-94")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("reading", "xids", "reasons"), [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES]
)
def test_assess_gpu_reasons(reading, xids, reasons) -> None:
    h = assess_gpu(reading, xids)
    assert h.reasons == reasons
    assert h.healthy is (reasons == ())
    assert h.state == (Health.HEALTHY if reasons == () else Health.UNHEALTHY)
    assert h.index == 0


def test_assess_gpu_keeps_the_latest_time_of_each_xid() -> None:
    h = assess_gpu(gpu(0), [79, 79, 48], [(79, 50.0), (79, 80.0), (48, 70.0), (79, 60.0)])
    assert h.xid_at_s == ((48, 70.0), (79, 80.0))


# --- units --------------------------------------------------------------------------------------


def test_mig_lost_and_mig_read_error() -> None:
    snap = snapshot(
        mig_gpu(0, mig(0), mig(1, "NVMLError_GpuIsLost"), mig(2, "NVMLError_Unknown"))
    )
    health = assess(snap)
    assert [u.reasons for u in health.units] == [(), ("mig-lost",), ("mig-read-error",)]
    assert health.state == Health.DEGRADED
    assert [u.mig_index for u in health.healthy_units] == [0]
    assert health.healthy_indices == frozenset({0})  # the GPU itself is healthy


def test_a_mig_unit_carries_its_parents_reasons_first() -> None:
    snap = snapshot(mig_gpu(0, mig(0), mig(1, "NVMLError_GpuIsLost"), ecc_uncorrected_volatile=1))
    health = assess(snap)
    assert [u.reasons for u in health.units] == [("ecc-dbe",), ("ecc-dbe", "mig-lost")]
    assert health.state == Health.UNHEALTHY


def test_unit_fields_come_from_the_reading() -> None:
    whole = gpu(1, 5000, 37.0, process_count=2)
    units = schedulable_units(
        snapshot(mig_gpu(0, mig(3, process_count=4, memory_free_mib=123)), whole),
        {0: GpuHealth(0), 1: GpuHealth(1, ("xid-79",))},
    )
    assert units == (
        Unit(gpu_index=0, mig_index=3, uuid="MIG-00000003-0000-0000-0000-000000000000",
             profile="1g.10gb", memory_total_mib=9984, memory_free_mib=123, process_count=4),
        Unit(gpu_index=1, uuid=UUID1, memory_total_mib=whole.memory_total_mib, memory_free_mib=5000,
             utilization_pct=37.0, process_count=2, reasons=("xid-79",)),
    )  # fmt: skip
    assert units[0].is_mig and not units[1].is_mig
    assert (units[0].state, units[1].state) == (Health.HEALTHY, Health.UNHEALTHY)


def test_a_mig_gpu_that_cannot_be_read_has_no_unit() -> None:
    reading = mig_gpu(0, mig(0), error="NVMLError_Unknown")
    health = assess(snapshot(reading, gpu(1)))
    assert [u.gpu_index for u in health.units] == [1]
    assert health.state == Health.DEGRADED


def test_a_mig_gpu_without_devices_is_healthy_with_no_unit() -> None:
    health = assess(snapshot(mig_gpu(0)))
    assert health.units == ()
    assert health.state == Health.HEALTHY


# --- the node -----------------------------------------------------------------------------------

NODE_CASES = [
    # (id, snapshot, state)
    ("NVML not read", snapshot(gpu(0), error="NVMLError_LibraryNotFound"), Health.UNKNOWN),
    ("no GPU", snapshot(), Health.UNKNOWN),
    ("all healthy", snapshot(gpu(0), gpu(1)), Health.HEALTHY),
    ("one of two lost", snapshot(gpu(0), lost(1)), Health.DEGRADED),
    ("both lost", snapshot(lost(0), lost(1)), Health.UNHEALTHY),
    ("every MIG device lost", snapshot(mig_gpu(0, mig(0, "NVMLError_GpuIsLost"))), Health.UNHEALTHY),
]  # fmt: skip


@pytest.mark.parametrize(("snap", "state"), [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES])
def test_node_state(snap, state) -> None:
    assert assess(snap).state == state


# --- Xids in assess -----------------------------------------------------------------------------


def _reasons(*events: XidEvent, policy: XidPolicy | None = None, clock_s: float = 100.0):
    health = assess(snapshot(gpu(0), gpu(1), clock_s=clock_s), events, policy)
    return {i: g.reasons for i, g in health.gpus.items()}, health.state


def test_an_xid_for_a_uuid_no_gpu_has_is_charged_to_no_gpu() -> None:
    reasons, state = _reasons(XidEvent(0, 79, 90.0, uuid="GPU-gone"))
    assert reasons == {0: (), 1: ()}
    assert state == Health.HEALTHY


def test_an_xid_by_uuid_wins_over_its_index() -> None:
    reasons, _ = _reasons(XidEvent(0, 79, 90.0, uuid=UUID1))
    assert reasons == {0: (), 1: ("xid-79",)}
    # and without a UUID, the index
    reasons, _ = _reasons(XidEvent(1, 48, 90.0))
    assert reasons == {0: (), 1: ("xid-48",)}


@pytest.mark.parametrize(
    ("at_s", "charged"), [(40.0, True), (-499.0, True), (-500.0, False), (-600.0, False)]
)
def test_the_quiet_window_edge_in_assess(at_s, charged) -> None:
    """clock 100, quiet 600 s: an event counts while less than 600 s old."""
    reasons, _ = _reasons(XidEvent(0, 79, at_s), policy=XidPolicy(quiet_s=600.0))
    assert reasons[0] == (("xid-79",) if charged else ())


def test_assess_skips_xids_its_policy_ignores_and_records_the_times() -> None:
    reasons, _ = _reasons(XidEvent(0, 13, 90.0), XidEvent(0, 79, 91.0))
    assert reasons[0] == ("xid-79",)
    reasons, _ = _reasons(XidEvent(0, 13, 90.0), policy=XidPolicy(all_fatal=True))
    assert reasons[0] == ("xid-13",)
    health = assess(snapshot(gpu(0)), [XidEvent(0, 79, 91.0), XidEvent(0, 79, 95.0)])
    assert health.gpus[0].xid_at_s == ((79, 95.0),)


# --- the ledger ---------------------------------------------------------------------------------


def test_ledger_window_edge_is_exclusive() -> None:
    ledger = XidLedger(XidPolicy(quiet_s=10.0))
    ledger.record([XidEvent(0, 79, 100.0)])
    assert [e.at_s for e in ledger.recent(109.9)] == [100.0]
    assert ledger.recent(110.0) == ()
    assert ledger.recent(100.0) == ()  # forgotten, not just hidden


def test_ledger_keys_by_uuid_and_a_tie_takes_the_later_record() -> None:
    ledger = XidLedger(XidPolicy())
    first = XidEvent(0, 79, 50.0, uuid=UUID0)
    moved = XidEvent(3, 79, 50.0, uuid=UUID0)  # same GPU, same time, another index
    ledger.record([first])
    ledger.record([moved])
    assert ledger.recent(60.0) == (moved,)
    older = XidEvent(5, 79, 40.0, uuid=UUID0)
    ledger.record([older])
    assert ledger.recent(60.0) == (moved,)
    # without a UUID the index is the key: index 0 is another entry than UUID0
    ledger.record([XidEvent(0, 79, 55.0)])
    assert [e.index for e in ledger.recent(60.0)] == [3, 0]


def test_ledger_recent_is_oldest_first() -> None:
    ledger = XidLedger(XidPolicy())
    ledger.record([XidEvent(1, 79, 30.0), XidEvent(0, 48, 10.0), XidEvent(2, 94, 20.0)])
    assert [e.at_s for e in ledger.recent(40.0)] == [10.0, 20.0, 30.0]


def test_ledger_seed_counts_only_fatal_events_and_adds_refusals() -> None:
    ledger = XidLedger(XidPolicy())
    ledger.seed([XidEvent(0, 79, 10.0), XidEvent(0, 13, 11.0), XidEvent(1, 48, 12.0)], refused=2)
    ledger.seed([XidEvent(1, 79, 13.0)])
    assert (ledger.seeded, ledger.seed_refused) == (3, 2)
    ledger.record([XidEvent(1, 94, 14.0)])
    assert (ledger.seeded, ledger.seed_refused) == (3, 2)
    assert len(ledger.recent(20.0)) == 4


def test_ledger_bound_keeps_exactly_max_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(XidLedger, "MAX_ENTRIES", 3)
    ledger = XidLedger(XidPolicy())
    ledger.record([XidEvent(i, 79, float(i)) for i in range(3)])
    assert len(ledger.recent(5.0)) == 3
    ledger.record([XidEvent(9, 79, 4.0)])
    assert [e.index for e in ledger.recent(5.0)] == [1, 2, 9]
    # the oldest by time goes, not the first by GPU
    ledger = XidLedger(XidPolicy())
    ledger.record([XidEvent(i, 79, float(3 - i)) for i in range(3)])  # GPU 2 is the oldest
    ledger.record([XidEvent(9, 79, 4.0)])
    assert [e.index for e in ledger.recent(5.0)] == [1, 0, 9]


def test_ledger_bound_drops_the_first_recorded_of_a_tie_at_the_oldest_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the bound, of two entries equally old, the one recorded first goes: the ledger is
    not reordered while it is at most full (a survivor: ``>`` as ``>=`` sorted it by time each
    time it was exactly full, so a later tie fell the other way)."""
    monkeypatch.setattr(XidLedger, "MAX_ENTRIES", 2)
    ledger = XidLedger(XidPolicy())
    ledger.record([XidEvent(0, 79, 5.0)])  # GPU 0 first
    ledger.record([XidEvent(1, 79, 3.0)])  # full: GPU 1 is older, recorded second
    ledger.record([XidEvent(1, 79, 5.0)])  # GPU 1's latest ties GPU 0's
    ledger.record([XidEvent(2, 79, 6.0)])  # one too many: of the tie, GPU 0 (first) goes
    assert [e.index for e in ledger.recent(7.0)] == [1, 2]
