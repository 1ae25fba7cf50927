"""``core.schema.nodestate`` cases that mutation testing (``scripts/mutation``) found no test
pinned, each Node read whole (``parse_node`` compared with the whole ``NodeGpuState``): whole
GPUs bounded by the labels, held, unreadable or below zero; shared GPUs' two books (units no
holder has, the largest slice the labels allow, a unit of 1 MiB or none); MIG devices; the
labels alone and the node aggregates; the problems and the liveness window's edges;
``state_from_object``, ``parse_gpu_readings`` and ``lease_ref``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omaticaya_py.core.schema.gpustate import GpuInfo, NodeGpuState
from omaticaya_py.core.schema.nodestate import (
    MAX_REFRESH_S,
    lease_ref,
    parse_gpu_readings,
    parse_node,
    state_from_object,
)
from omaticaya_py.core.schema.values import rfc3339_s

P = "omaticaya.io/"
READ_AT = "2026-01-01T00:00:00Z"
T = 1767225600.0  # READ_AT


def tele(**doc: Any) -> dict[str, str]:
    """The telemetry annotation of ``doc`` (``read_at`` READ_AT unless given)."""
    return {P + "telemetry": json.dumps({"read_at": READ_AT, **doc})}


def node(labels: dict[str, str] | None = None, **doc: Any) -> NodeGpuState:
    """``parse_node`` of node n1 with our ``labels`` (names without the prefix) and, when
    ``doc`` has any key, its telemetry."""
    return parse_node(
        "n1", {P + k: v for k, v in (labels or {}).items()}, tele(**doc) if doc else {}
    )


def test_whole_gpus_bounded_held_unreadable_and_below_zero() -> None:
    state = node(
        {"gpu.memory.free-mib": "30000", "gpu-1.memory.free-mib": "20000",
         "gpu.memory.free-total-mib": "45000", "gpu-3.memory.free-mib": "-5"},
        health="Healthy", expires_at=READ_AT, lease="ns/agent-n1",
        gpus=[
            {"index": 0, "memory_free_mib": 40000, "memory_free_min_mib": 35000,
             "memory_total_mib": 81559, "health": "Healthy",
             "pods": [{"namespace": "ns", "pod": "a", "container": "c"}]},
            {"index": 1, "memory_free_mib": 25000, "memory_total_mib": 81559, "health": "Healthy"},
            {"index": 2, "memory_free_mib": 10000, "memory_total_mib": 81559, "health": "Unhealthy"},
            # a reading below zero stays as read: a bound never raises it
            {"index": 3, "memory_free_mib": -5, "health": "Healthy"},
            # held by a holder without a pod name: assigned, but no pod to name
            {"index": 4, "health": "Healthy", "pods": [{"namespace": "ns"}]},
        ],
    )  # fmt: skip
    assert state == NodeGpuState(
        name="n1", known=True, health="Healthy", read_at=T, expires_at=T, lease="ns/agent-n1",
        gpus=(
            # at most the node's best (30000); held: 0 free, its live value kept aside
            GpuInfo(0, 0, True, 35000, 81559, assigned=True, assigned_free_mib=30000),
            GpuInfo(1, 20000, True, None, 81559),  # at most its own label
            GpuInfo(2, 10000, False, None, 81559),
            GpuInfo(3, -5, True),
            GpuInfo(4, 0, False, assigned=True, assigned_free_mib=0),
        ),
        # live: 30000 + 20000 - 5 over the healthy, at most the free total (45000)
        free_total_mib=20000 - 5, free_live_total_mib=45000,
        holders=frozenset({"ns/a"}),
    )  # fmt: skip


def test_shared_gpus_books_and_the_largest_slice_the_labels_allow() -> None:
    state = node(
        {"gpu.shared.memory.free-mib": "2560", "gpu-2.memory.free-mib": "3000"},
        share_unit_mib=1024,
        gpus=[
            # 8 units less 2 + 0 + 3 (a holder with no pod name counts) + 0 (negative) + 0
            {"index": 0, "shared": True, "share_units": 8, "memory_free_mib": 20000,
             "health": "Healthy", "pods": [
                 {"namespace": "ns", "pod": "p1", "limit_mib": 2048},
                 {"namespace": "ns", "pod": "p2", "limit_mib": 1000},
                 {"namespace": "ns", "limit_mib": 3072},
                 {"namespace": "ns", "pod": "p3", "limit_mib": -1024},
                 {"namespace": "ns", "pod": "p4"}]},
            {"index": 1, "shared": True, "share_units": 2, "memory_free_mib": 20000,
             "health": "Healthy", "pods": []},
            # no holders published: its units are the labels' bound
            {"index": 2, "shared": True, "share_units": 8, "memory_free_mib": 5000,
             "health": "Healthy"},
            {"index": 3, "shared": True, "share_units": 1, "memory_free_mib": 20000,
             "health": "Healthy", "pods": []},
            {"index": 4, "shared": True, "memory_free_mib": 20000, "health": "Healthy", "pods": []},
            {"index": 5, "memory_free_mib": 1000, "health": "Healthy"},
        ],
    )  # fmt: skip
    # the labels' largest slice: 2560 MiB, 2 whole units
    assert state == NodeGpuState(
        name="n1", known=True, read_at=T,
        gpus=(GpuInfo(5, 1000, True),), free_total_mib=1000, free_live_total_mib=1000,
        shared=(
            GpuInfo(0, 20000, True, units_left=3, units_cap=2),
            GpuInfo(1, 20000, True, units_left=2),  # at the bound exactly: no cap
            GpuInfo(2, 3000, True, units_left=2),
            GpuInfo(3, 20000, True, units_left=1),
            GpuInfo(4, 20000, True, units_left=2),
        ),
        share_unit_mib=1024,
        holders=frozenset({"ns/p1", "ns/p2", "ns/p3", "ns/p4"}),
        slices_held=(("ns/p1", 0, 2),),
        units_attributed=True,
    )  # fmt: skip


def test_shared_gpus_of_a_one_mib_unit_and_of_no_unit() -> None:
    # a unit of 1 MiB: a limit absent, 0 or negative holds no unit, 1 MiB one
    one = node({"gpu.shared.memory.free-mib": "-5"}, share_unit_mib=1, gpus=[
        {"index": 0, "shared": True, "share_units": 8, "memory_free_mib": 7, "health": "Healthy"},
        {"index": 1, "shared": True, "share_units": 8, "memory_free_mib": 7, "health": "Healthy",
         "pods": [{"namespace": "ns", "pod": "q1"}, {"namespace": "ns", "pod": "q2", "limit_mib": -5},
                  {"namespace": "ns", "pod": "q3", "limit_mib": 0},
                  {"namespace": "ns", "pod": "q4", "limit_mib": 1}]},
    ])  # fmt: skip
    assert (one.shared, one.share_unit_mib, one.slices_held, one.units_attributed) == (
        (GpuInfo(0, 7, True, units_left=0), GpuInfo(1, 7, True, units_left=7, units_cap=0)),
        1, (("ns/q4", 1, 1),), True,
    )  # fmt: skip
    # no unit size (0): a shared GPU's slices cannot be sized, and it is not given out
    none = node(share_unit_mib=0, gpus=[{"index": 0, "shared": True, "share_units": 8,
                                         "memory_free_mib": 7, "health": "Healthy"}])  # fmt: skip
    assert none == NodeGpuState(name="n1", known=True, read_at=T, free_live_total_mib=0)
    # a unit but no shared GPU: no unit said
    whole = node(
        share_unit_mib=1024, gpus=[{"index": 0, "memory_free_mib": 7, "health": "Healthy"}]
    )
    assert (whole.shared, whole.share_unit_mib) == ((), None)


def test_mig_devices() -> None:
    state = node(gpus=[
        {"index": 0, "mig_enabled": True, "memory_free_mib": 80000, "health": "Healthy",
         "mig_devices": [
             {"index": 0, "profile": "1g.10gb", "memory_free_mib": 9000, "memory_total_mib": 9984,
              "health": "Healthy", "pods": [{"namespace": "ns", "pod": "m1"}]},
             {"index": 1, "profile": "1g.10gb", "memory_free_mib": -3, "health": "Healthy"},
             {"index": 2, "profile": "2g.20gb", "health": "Healthy"},
             {"index": 3, "profile": "2g.20gb", "memory_free_mib": 100, "health": "Healthy",
              "error": "boom"},
             {"index": 4, "profile": "3g.40gb", "memory_free_mib": 100, "health": "Unhealthy"},
             # no profile: not given out, but its holder is a holder
             {"index": 5, "memory_free_mib": 100, "health": "Healthy",
              "pods": [{"namespace": "ns", "pod": "m5"}]}]},
        # MIG off: its listed MIG devices are not given out, the GPU is
        {"index": 1, "memory_free_mib": 100, "health": "Healthy",
         "mig_devices": [{"index": 0, "profile": "1g.10gb", "memory_free_mib": 5, "health": "Healthy"}]},
    ])  # fmt: skip
    assert state == NodeGpuState(
        name="n1", known=True, read_at=T,
        gpus=(GpuInfo(1, 100, True),), free_total_mib=100, free_live_total_mib=100,
        mig=(
            GpuInfo(0, 0, True, total_mib=9984, assigned=True, assigned_free_mib=9000,
                    profile="1g.10gb", mig_index=0),
            GpuInfo(0, 0, True, profile="1g.10gb", mig_index=1),
            GpuInfo(0, 0, False, profile="2g.20gb", mig_index=2),
            GpuInfo(0, 100, False, profile="2g.20gb", mig_index=3),
            GpuInfo(0, 100, False, profile="3g.40gb", mig_index=4),
        ),
        holders=frozenset({"ns/m1", "ns/m5"}),
    )  # fmt: skip


def test_gpus_from_the_labels_alone() -> None:
    state = node({
        "gpu-0.health": "Healthy", "gpu-0.memory.free-mib": "1000",
        # MIG on: given out as MIG devices, not whole (the GPUs after it are read on)
        "gpu-1.mig.enabled": "true", "gpu-1.health": "Healthy", "gpu-1.memory.free-mib": "900",
        "gpu-2.health": "Unhealthy", "gpu-2.memory.free-mib": "500",
        "gpu-3.health": "Healthy",  # no free memory: not healthy
        "gpu.memory.free-total-mib": "0",
    })  # fmt: skip
    assert state == NodeGpuState(
        name="n1", known=True,
        gpus=(GpuInfo(0, 1000, True), GpuInfo(2, 500, False), GpuInfo(3, 0, False)),
        free_total_mib=0, free_live_total_mib=0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("labels", "gpus"),
    [
        ({"gpu.memory.free-mib": "30000", "gpu.healthy-count": "3", "gpu.memory.free-total-mib": "50000"},
         (GpuInfo(0, 30000, True), GpuInfo(1, 20000, True), GpuInfo(2, 0, True))),
        ({"gpu.memory.free-mib": "30000", "gpu.healthy-count": "1"}, (GpuInfo(0, 30000, True),)),
        ({"gpu.memory.free-mib": "30000"}, ()),  # no healthy count: no GPU
        ({"gpu.memory.free-mib": "30000", "gpu.healthy-count": "0"}, ()),
        ({"gpu.memory.free-mib": "30000", "gpu.healthy-count": "2", "mig.strategy": "single"}, ()),
    ],
    ids=["three", "one", "no-count", "none-healthy", "mig"],
)  # fmt: skip
def test_gpus_from_the_node_aggregates(labels, gpus) -> None:
    assert node(labels).gpus == gpus


def test_problems_are_named() -> None:
    assert parse_node("n1", {}, {P + "telemetry": "not json"}) == NodeGpuState(
        name="n1", problem="unreadable telemetry annotation"
    )
    bad = node(gpus=[{"index": 0, "memory_free_mib": "lots", "health": "Healthy"}])
    assert bad == NodeGpuState(
        name="n1", known=True, read_at=T, gpus=(GpuInfo(0, 0, False),), free_live_total_mib=0,
        problem="telemetry annotation with a bad memory_free_mib",
    )  # fmt: skip
    # no read_at: no liveness at all, the Lease it names included
    no_read_at = parse_node("n1", {}, {P + "telemetry": json.dumps({"lease": "ns/agent-n1"})})
    assert no_read_at == NodeGpuState(
        name="n1", known=True, free_live_total_mib=0,
        problem="telemetry annotation without a valid read_at",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("expires_at", "expected"),
    [
        (READ_AT, T),
        ("2026-01-09T00:00:00Z", T + MAX_REFRESH_S),
        ("2026-01-09T00:00:01Z", None),
        ("2025-12-31T23:59:59Z", None),
    ],
)
def test_expires_at_is_trusted_within_the_refresh_window(expires_at, expected) -> None:
    assert node(expires_at=expires_at).expires_at == expected


def test_health_comes_from_the_label_else_the_telemetry() -> None:
    assert node(health="Degraded").health == "Degraded"
    assert node({"gpu.health": "Healthy"}, health="Degraded").health == "Healthy"


def test_state_from_object() -> None:
    labels = {"gpu.example.com/gpu.health": "Healthy", P + "gpu.health": "Unhealthy"}
    state = state_from_object({"metadata": {"name": "n9", "labels": labels}}, "gpu.example.com")
    assert state == NodeGpuState(name="n9", known=True, health="Healthy", free_live_total_mib=0)
    assert (
        state_from_object({"metadata": {"name": 5, "labels": labels}}, "gpu.example.com").name == ""
    )
    assert state_from_object({}, P.rstrip("/")) == NodeGpuState(name="")


def test_parse_gpu_readings_by_index_the_first_of_an_index_winning() -> None:
    annotations = tele(gpus=[{"index": 2, "uuid": "GPU-b"}, {"index": 0, "uuid": "GPU-a"},
                             {"index": 2, "uuid": "GPU-c"}, "gpu"])  # fmt: skip
    assert [(g.index, g.uuid) for g in parse_gpu_readings(annotations)] == [
        (0, "GPU-a"),
        (2, "GPU-b"),
    ]
    other = {"gpu.example.com/telemetry": annotations[P + "telemetry"]}
    assert [g.index for g in parse_gpu_readings(other, "gpu.example.com")] == [0, 2]
    assert parse_gpu_readings(other) == ()
    assert parse_gpu_readings(None) == ()
    assert parse_gpu_readings({P + "telemetry": "not json"}) == ()


def test_lease_ref_at_its_longest() -> None:
    longest = "a" * 63 + "/" + "b" * 253  # a DNS label, a DNS subdomain: 317 characters
    assert lease_ref(longest) == longest
    assert lease_ref("a" * 64 + "/b") is None
    assert lease_ref(["ns/name"]) is None
    assert rfc3339_s("2026-01-09T00:00:00Z") == T + MAX_REFRESH_S  # the window's end, above
