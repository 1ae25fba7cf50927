"""GPM SM activity published (issue 40, item 2): ``gpu.sm-active-pct`` and ``gpu-N.sm-active-pct``
(absent, never 0, without GPM), ``gpu.idle-count`` deciding busy by SM activity where a GPU has
it, the telemetry's ``sm_active_pct``/``tensor_active_pct``/``dram_bw_pct``, the write budget
treating them like utilisation, and the ``omaticaya_gpu_*_pct`` metrics. Readings built here:
no reader."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent.gpu_collectors import GpuReadings
from omaticaya_py.core.model.sharing import Sharing
from omaticaya_py.core.model.snapshot import MigReading, NodeSnapshot
from omaticaya_py.core.publish.budget import telemetry_change, urgent
from omaticaya_py.core.publish.readings import TickResult
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.publish.render_telemetry import telemetry_marks
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema.telemetry import Telemetry
from tests.helpers import PREFIX, gpu, settings, snapshot

NODE = f"{PREFIX}/gpu.sm-active-pct"
IDLE = f"{PREFIX}/gpu.idle-count"


def gpu_label(index: int) -> str:
    return f"{PREFIX}/gpu-{index}.sm-active-pct"


def labels_of(
    snap: NodeSnapshot, previous: dict[str, str] | None = None, **overrides: Any
) -> dict[str, str]:
    return render(snap, assess(snap, (), None), settings(**overrides), previous).labels


def _mig_gpu(index: int) -> Any:
    m = MigReading(
        index=0, uuid="MIG-00000000-0000-0000-0000-000000000000", profile="1g.10gb",
        memory_total_mib=9984, memory_used_mib=984, memory_free_mib=9000, process_count=0,
    )  # fmt: skip
    return gpu(index, utilization_pct=None, mig_enabled=True, mig_devices=(m,), sm_active_pct=50.0)


@pytest.mark.parametrize(
    ("name", "gpus", "overrides", "node", "per_gpu"),
    [
        ("no GPM: both absent, not 0", [gpu(0), gpu(1)], {}, None, {0: None, 1: None}),
        (
            "lowest of the GPUs that have it, rounded to the step",
            [gpu(0, sm_active_pct=47.0), gpu(1, sm_active_pct=23.0), gpu(2)],
            {},
            "20",
            {0: "50", 1: "20", 2: None},
        ),
        ("0 is a value, not absent", [gpu(0, sm_active_pct=0.0)], {}, "0", {0: "0"}),
        ("capped at 100", [gpu(0, sm_active_pct=104.0)], {}, "100", {0: "100"}),
        (
            "per-GPU label off: the node's stays",
            [gpu(0, sm_active_pct=33.0)],
            {"sm_active_labels": False},
            "30",
            {0: None},
        ),
        (
            "no per-GPU labels at all",
            [gpu(0, sm_active_pct=33.0)],
            {"per_gpu_labels": False},
            "30",
            {0: None},
        ),
        (
            "an unhealthy GPU is not in the node's",
            [gpu(0, sm_active_pct=10.0, remapped_rows_pending=True), gpu(1, sm_active_pct=60.0)],
            {},
            "60",
            {0: "10", 1: "60"},
        ),
        (
            "a shared GPU is not in the node's",
            [gpu(0, sm_active_pct=10.0), gpu(1, sm_active_pct=60.0)],
            {"shared_gpus": "0"},
            "60",
            {0: "10", 1: "60"},
        ),
        ("MIG on: none", [_mig_gpu(0)], {}, None, {0: None}),
        ("step 25", [gpu(0, sm_active_pct=40.0)], {"utilization_step_pct": 25}, "50", {0: "50"}),
    ],
)
def test_sm_active_labels(
    name: str, gpus: list, overrides: dict, node: str | None, per_gpu: dict[int, str | None]
) -> None:
    labels = labels_of(snapshot(*gpus), **overrides)
    assert labels.get(NODE) == node, name
    for index, value in per_gpu.items():
        assert labels.get(gpu_label(index)) == value, name


def test_on_by_default() -> None:
    assert settings().sm_active_labels is True
    assert labels_of(snapshot(gpu(0, sm_active_pct=70.0)))[gpu_label(0)] == "70"


@pytest.mark.parametrize(
    ("raw", "previous", "expected"),
    [
        (24.0, "20", "20"),  # within half a step + the margin (2): kept
        (26.0, "20", "20"),
        (27.0, "20", "30"),
        (13.1, "20", "20"),
        (13.0, "20", "10"),
        (26.0, None, "30"),  # no previous: plain rounding
    ],
)
def test_the_same_hysteresis_as_utilisation(
    raw: float, previous: str | None, expected: str
) -> None:
    before = {NODE: previous, gpu_label(0): previous} if previous else None
    labels = labels_of(snapshot(gpu(0, sm_active_pct=raw)), before)
    assert labels[NODE] == expected
    assert labels[gpu_label(0)] == expected
    util = labels_of(
        snapshot(gpu(0, utilization_pct=raw)),
        {f"{PREFIX}/gpu.utilization-pct": previous} if previous else None,
    )
    assert util[f"{PREFIX}/gpu.utilization-pct"] == expected


@pytest.mark.parametrize(
    ("name", "reading", "idle"),
    [
        ("no GPM, utilisation under the threshold", {"utilization_pct": 2.0}, 1),
        ("no GPM, utilisation at the threshold", {"utilization_pct": 5.0}, 0),
        ("no GPM, no utilisation: not idle", {"utilization_pct": None}, 0),
        (
            "a resident but idle kernel: utilisation 100, SM activity 0.8",
            {"utilization_pct": 100.0, "sm_active_pct": 0.8},
            1,
        ),
        ("busy SMs, low utilisation", {"utilization_pct": 1.0, "sm_active_pct": 40.0}, 0),
        ("SM activity at the threshold", {"utilization_pct": 0.0, "sm_active_pct": 5.0}, 0),
        ("SM activity 0, no utilisation", {"utilization_pct": None, "sm_active_pct": 0.0}, 1),
        (
            "a process: never idle",
            {"utilization_pct": 0.0, "sm_active_pct": 0.0, "process_count": 1},
            0,
        ),
    ],
)
def test_idle_count_uses_sm_activity_where_there(name: str, reading: dict, idle: int) -> None:
    fields = {"process_count": 0, **reading}
    assert labels_of(snapshot(gpu(0, **fields)))[IDLE] == str(idle), name


def test_idle_count_threshold_setting() -> None:
    snap = snapshot(gpu(0, process_count=0, utilization_pct=100.0, sm_active_pct=8.0))
    assert labels_of(snap)[IDLE] == "0"
    assert labels_of(snap, idle_utilization_pct=10)[IDLE] == "1"


def test_a_change_of_sm_activity_is_budgeted_like_utilisation() -> None:
    for key in (NODE, gpu_label(0)):
        assert urgent({key: "20"}, {key: "30"})  # busier: less attractive, at once
        assert not urgent({key: "30"}, {key: "20"})  # a change for the better waits
        util = key.replace("sm-active", "utilization")
        assert urgent({util: "20"}, {util: "30"}) and not urgent({util: "30"}, {util: "20"})


def _parse(doc: dict) -> Telemetry:
    parsed, problem = Telemetry.parse(json.dumps(doc))
    assert parsed is not None, problem
    return parsed


def _telemetry(snap: NodeSnapshot) -> dict:
    desired = render(snap, assess(snap, (), None), settings())
    return json.loads(desired.annotations[f"{PREFIX}/telemetry"])


def test_telemetry_fields_rounded_and_absent_without_gpm() -> None:
    snap = snapshot(
        gpu(0, sm_active_pct=94.94, tensor_active_pct=92.06, dram_bw_pct=23.549),
        gpu(1),
        gpu(2, sm_active_pct=0.0, tensor_active_pct=None, dram_bw_pct=0.04),
    )
    g0, g1, g2 = _telemetry(snap)["gpus"]
    assert (g0["sm_active_pct"], g0["tensor_active_pct"], g0["dram_bw_pct"]) == (94.9, 92.1, 23.5)
    for field in ("sm_active_pct", "tensor_active_pct", "dram_bw_pct"):
        assert field not in g1
    assert g2["sm_active_pct"] == 0.0 and g2["dram_bw_pct"] == 0.0
    assert "tensor_active_pct" not in g2
    parsed = _parse(_telemetry(snap))
    assert parsed.gpus[0].sm_active_pct == 94.9 and parsed.gpus[1].sm_active_pct is None


def test_telemetry_compatible_both_ways() -> None:
    """The schema version is unchanged; a document without the fields (an older agent) reads
    as absent, and one with them parses in a reader that ignores unknown fields."""
    doc = _telemetry(snapshot(gpu(0, sm_active_pct=40.0)))
    old = {
        **doc,
        "gpus": [{k: v for k, v in g.items() if k != "sm_active_pct"} for g in doc["gpus"]],
    }
    assert _parse(old).gpus[0].sm_active_pct is None
    assert _parse(doc).version == doc["schema"]
    bad = {**doc, "gpus": [{**doc["gpus"][0], "sm_active_pct": "lots"}]}
    assert _parse(bad).gpus[0].sm_active_pct is None


def test_gpm_changes_alone_never_rewrite_the_telemetry() -> None:
    before = telemetry_marks(
        snapshot(gpu(0, sm_active_pct=10.0, tensor_active_pct=5.0, dram_bw_pct=3.0))
    )
    after = telemetry_marks(
        snapshot(gpu(0, sm_active_pct=90.0, tensor_active_pct=80.0, dram_bw_pct=60.0))
    )
    assert telemetry_change(before, after, 256) is None


def _scrape(snap: NodeSnapshot) -> CollectorRegistry:
    health = assess(snap, (), None)
    result = TickResult(snap, health, render(snap, health, settings()), None, False)
    registry = CollectorRegistry()
    registry.register(GpuReadings(lambda: result, Sharing.of(settings())))
    return registry


def test_metrics_only_where_gpm_gave_them() -> None:
    snap = snapshot(gpu(0, sm_active_pct=94.9, tensor_active_pct=92.1, dram_bw_pct=23.5), gpu(1))
    registry = _scrape(snap)
    key0 = {"gpu": "0", "uuid": snap.gpus[0].uuid or ""}
    key1 = {"gpu": "1", "uuid": snap.gpus[1].uuid or ""}
    for name, value in (
        ("omaticaya_gpu_sm_active_pct", 94.9),
        ("omaticaya_gpu_tensor_active_pct", 92.1),
        ("omaticaya_gpu_dram_bw_pct", 23.5),
    ):
        assert registry.get_sample_value(name, key0) == pytest.approx(value)
        assert registry.get_sample_value(name, key1) is None  # no series, not 0
