"""MIG: profile names, trace format version 2, schedulable units, health, labels and the device
plugin's per-profile resources, on the MIG traces derived from the real H100 recording
(`tests/data/make_mig_traces.py`) and on hand-built readings. Pure stages; the real API server
and kubelet runs are in test_mig_cluster.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.model.snapshot import MigReading, XidEvent, mig_profile_name
from omaticaya_py.core.publish.render import render, telemetry
from omaticaya_py.core.rules.health import Health, XidPolicy, assess, schedulable_units
from omaticaya_py.deviceplugin import DevicePluginSet
from omaticaya_py.deviceplugin.allocation import mig_resource_name, preferred, trace_units
from omaticaya_py.deviceplugin.config import PluginConfig, Timing
from omaticaya_py.deviceplugin.plugin import DevicePlugin
from omaticaya_py.sources.replay import TraceError, TraceReader, load_trace
from tests.data import make_mig_traces
from tests.deviceplugin.mig_support import (  # the names moved out, for this file's tests
    H100_MIG_AT_15,  # noqa: F401
    STATIC,  # noqa: F401
)
from tests.helpers import DATA, gpu, settings, snapshot

H100_MIG = DATA / "h100-mig-trace.json"
MIG_MIXED = DATA / "mig-mixed-trace.json"
H100_TOTAL_BYTES = 85520809984
A100_40GB_TOTAL_BYTES = 42505273344
MIB = 1 << 20


@pytest.mark.parametrize(
    ("gi", "ci", "mib", "total", "name"),
    [
        (1, 1, 9984, H100_TOTAL_BYTES, "1g.10gb"),
        (1, 1, 20096, H100_TOTAL_BYTES, "1g.20gb"),
        (2, 2, 20096, H100_TOTAL_BYTES, "2g.20gb"),
        (3, 3, 40448, H100_TOTAL_BYTES, "3g.40gb"),
        (4, 4, 40448, H100_TOTAL_BYTES, "4g.40gb"),
        (7, 7, 81152, H100_TOTAL_BYTES, "7g.80gb"),
        (3, 1, 40448, H100_TOTAL_BYTES, "1c.3g.40gb"),
        (1, 1, 4864, A100_40GB_TOTAL_BYTES, "1g.5gb"),
        (3, 3, 19968, A100_40GB_TOTAL_BYTES, "3g.20gb"),
    ],
)
def test_mig_profile_names_as_nvidia_names_them(gi, ci, mib, total, name) -> None:
    assert mig_profile_name(gi, ci, mib, total) == name


@pytest.mark.parametrize("args", [(0, 1, 9984, H100_TOTAL_BYTES), (1, 1, 9984, 0)])
def test_mig_profile_name_refuses_impossible_attributes(args) -> None:
    with pytest.raises(ValueError):
        mig_profile_name(*args)


# ------------------------------------------------------------------------------ the trace format


def test_the_mig_traces_are_what_the_generator_makes() -> None:
    for name, text in make_mig_traces.render_all().items():
        assert (DATA / name).read_text() == text, f"run python tests/data/make_mig_traces.py ({name})"


def test_version_1_traces_still_replay_and_say_so() -> None:
    assert load_trace(DATA / "h100-trace.json").format_version == 1
    assert load_trace(H100_MIG).format_version == 2


@pytest.mark.parametrize("version", [0, 4, "2", None])
def test_an_unknown_format_version_is_refused_in_one_line(tmp_path: Path, version) -> None:
    doc = json.loads(H100_MIG.read_text())
    doc["format_version"] = version
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value).count("\n") == 0
    assert f"{path}: format_version: {version!r} is not a version" in str(err.value)


def test_mig_readings_equal_the_trace() -> None:
    doc = json.loads(H100_MIG.read_text())
    facts = doc["devices"][0]["mig_devices"]
    for i in (0, 40, 60, 98):
        sample = doc["samples"][i]
        snap = TraceReader(H100_MIG, at_s=sample["t"], window_s=0.0).read()
        (g,) = snap.gpus
        assert g.mig_enabled is True and g.utilization_pct is None
        assert g.memory_free_mib == sample["gpus"][0]["memory_bytes"]["free"] // MIB
        for m, recorded, fact in zip(g.mig_devices, sample["gpus"][0]["mig_devices"], facts, strict=True):
            assert (m.index, m.uuid, m.gpu_instance_id) == (
                fact["index"],
                fact["uuid"],
                fact["gpu_instance_id"],
            )
            assert m.uuid.startswith("MIG-")
            assert m.memory_free_mib == recorded["memory_bytes"]["free"] // MIB
            assert m.memory_total_mib == recorded["memory_bytes"]["total"] // MIB
            assert m.process_count == len(recorded["compute_processes"])
        assert [m.profile for m in g.mig_devices] == ["3g.40gb", "2g.20gb", "2g.20gb"]


def test_a_bad_mig_entry_is_named(tmp_path: Path) -> None:
    doc = json.loads(H100_MIG.read_text())
    doc["samples"][3]["gpus"][0]["mig_devices"][1]["memory_bytes"]["free"] = -5
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"samples\[3\]\.gpus\[0\]\.mig_devices\[1\]\.memory_bytes\.free"):
        load_trace(path)


# ------------------------------------------------------------------------------ units and health


def mig(index: int, free_mib: int = 9000, procs: int = 0, **kw) -> MigReading:
    return MigReading(
        index=index,
        uuid=f"MIG-{index:08d}-0000-0000-0000-000000000000",
        profile=kw.pop("profile", "1g.10gb"),
        memory_total_mib=9984,
        memory_used_mib=9984 - free_mib,
        memory_free_mib=free_mib,
        process_count=procs,
        **kw,
    )


def mig_gpu(index: int = 0, migs: tuple[MigReading, ...] = (), **kw):
    return gpu(index, utilization_pct=None, mig_enabled=True, mig_devices=migs, **kw)


@pytest.mark.parametrize(
    ("gpus", "xids", "state", "unit_reasons"),
    [
        # MIG off: one unit per GPU, as before
        ((gpu(0), gpu(1)), (), Health.HEALTHY, [(), ()]),
        # seven MIG devices are seven units
        ((mig_gpu(0, tuple(mig(i) for i in range(7))),), (), Health.HEALTHY, [()] * 7),
        # one MIG device unreadable: that unit only; the node is Degraded
        (
            (mig_gpu(0, (mig(0), mig(1, error="NVMLError_Unknown"))),),
            (),
            Health.DEGRADED,
            [(), ("mig-read-error",)],
        ),
        # a fault of the parent is a fault of every instance on it
        (
            (mig_gpu(0, (mig(0), mig(1))), gpu(1)),
            (XidEvent(0, 79, 0.0),),
            Health.DEGRADED,
            [("xid-79",), ("xid-79",), ()],
        ),
        (
            (mig_gpu(0, (mig(0), mig(1)), ecc_uncorrected_volatile=2),),
            (),
            Health.UNHEALTHY,
            [("ecc-dbe",), ("ecc-dbe",)],
        ),
        # a lost MIG GPU has no unit (its MIG devices cannot be listed)
        ((replace(mig_gpu(0), error="NVMLError_GpuIsLost"), gpu(1)), (), Health.DEGRADED, [()]),
        # MIG on and no instance: no unit, and nothing wrong
        ((mig_gpu(0),), (), Health.HEALTHY, []),
    ],
)
def test_units_and_health(gpus, xids, state, unit_reasons) -> None:
    snap = snapshot(*gpus)
    health = assess(snap, xids, XidPolicy())
    assert health.state == state
    assert [u.reasons for u in health.units] == unit_reasons
    assert health.units == schedulable_units(snap, health.gpus)


def test_an_xid_is_charged_to_the_gpu_by_uuid_when_indices_shift() -> None:
    # GPU 0 is gone after a re-init: the former GPU 1 is now index 0
    survivor = replace(gpu(0), uuid="GPU-00000001-7fda-b7ae-a94e-630097a14ca4")
    snap = snapshot(survivor, gpu(1, uuid="GPU-00000009-7fda-b7ae-a94e-630097a14ca4"))
    event = XidEvent(index=1, xid=79, at_s=0.0, uuid="GPU-00000001-7fda-b7ae-a94e-630097a14ca4")
    health = assess(snap, (event,))
    assert health.gpus[0].reasons == ("xid-79",)
    assert health.gpus[1].reasons == ()
    # an event of a GPU no longer present charges nobody
    gone = XidEvent(index=0, xid=79, at_s=0.0, uuid="GPU-00000000-7fda-b7ae-a94e-630097a14ca4")
    assert assess(snap, (gone,)).state == Health.HEALTHY


# ------------------------------------------------------------------------------ labels


def labels_at(path: Path, at_s: float, **overrides) -> dict[str, str]:
    snap = TraceReader(path, at_s=at_s, window_s=0.0).read()
    health = assess(snap, snap.xid_events, XidPolicy())
    desired = render(snap, health, settings(**overrides))
    assert not desired.dropped
    return {k.removeprefix("omaticaya.io/"): v for k, v in desired.labels.items()}






def test_labels_of_one_h100_in_three_mig_devices_under_load() -> None:
    assert labels_at(H100_MIG, 15.0, temperature_labels=True) == H100_MIG_AT_15


@pytest.mark.parametrize(
    ("at_s", "expected"),
    [
        # MIG device 5 unreadable; MIG device 3 holds the 6 GiB load; GPU 1 whole holds 30 GiB
        (
            9.0,
            {
                "gpu.health": "Degraded",
                "gpu.healthy-count": "7",
                "gpu.idle-count": "5",
                "gpu.utilization-pct": "0",
                "mig-1g.10gb.count": "7",
                "mig-1g.10gb.healthy-count": "6",
                "mig-1g.10gb.idle-count": "5",
                "mig-1g.10gb.memory.free-mib": "9216",
            },
        ),
        # Xid 79 on GPU 0 at t=20: all seven instances out, the whole GPU 1 stays
        (
            22.0,
            {
                "gpu.health": "Degraded",
                "gpu.healthy-count": "1",
                "gpu.idle-count": "0",
                "gpu.utilization-pct": "100",
                "mig-1g.10gb.count": "7",
                "mig-1g.10gb.healthy-count": "0",
                "mig-1g.10gb.idle-count": "0",
                "mig-1g.10gb.memory.free-mib": "0",
                "gpu-0.health": "Unhealthy",
            },
        ),
    ],
)
def test_labels_of_a_mixed_node(at_s: float, expected: dict[str, str]) -> None:
    got = labels_at(MIG_MIXED, at_s)
    assert {k: got.get(k) for k in expected} == expected
    assert got["gpu.count"] == "2" and got["mig.strategy"] == "mixed"
    assert "gpu-0.utilization-pct" not in got  # a MIG GPU has no whole-GPU utilisation
    assert "gpu-1.utilization-pct" in got


def test_a_mig_only_node_publishes_no_utilisation_and_no_mig_label_without_mig() -> None:
    assert not any("utilization" in k for k in labels_at(H100_MIG, 15.0))
    assert not any(k.startswith("mig") for k in labels_at(DATA / "h100-trace.json", 15.0))


def test_telemetry_carries_each_mig_device() -> None:
    snap = TraceReader(MIG_MIXED, at_s=9.0, window_s=0.0).read()
    doc = json.loads(telemetry(snap, assess(snap)))
    g0, g1 = doc["gpus"]
    assert g0["mig_enabled"] is True and "mig_enabled" not in g1
    assert [m["profile"] for m in g0["mig_devices"]] == ["1g.10gb"] * 7
    assert g0["mig_devices"][5]["health"] == "Unhealthy"
    assert g0["mig_devices"][5]["reasons"] == ["mig-read-error"]
    assert g0["mig_devices"][3]["process_count"] == 1


# ------------------------------------------------------------------------------ device plugin


def test_resources_per_profile_beside_whole_gpus() -> None:
    assert mig_resource_name("nvidia.com/gpu", "1g.10gb") == "nvidia.com/mig-1g.10gb"
    units = trace_units(MIG_MIXED)
    assert set(units) == {None, "1g.10gb"}
    assert len(units["1g.10gb"]) == 7 and all(u.startswith("MIG-") for _, u in units["1g.10gb"])
    assert [i for i, _ in units[None]] == [1]


def plugins_at(at_s: float, tmp_path: Path) -> tuple[Agent, DevicePluginSet]:
    reader = TraceReader(MIG_MIXED, at_s=at_s)
    agent = Agent(settings(), reader, NodeApi(None, dry_run=True))
    agent.tick()
    return agent, DevicePluginSet(agent, PluginConfig(plugin_dir=tmp_path, units=trace_units(MIG_MIXED)))


def test_each_mig_device_has_its_health(tmp_path: Path) -> None:
    agent, plugins = plugins_at(9.0, tmp_path)
    assert {p.resource_name for p in plugins.plugins.values()} == {
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
    }
    migs = plugins.plugins["1g.10gb"].devices()
    assert [s.healthy for s in migs] == [True] * 5 + [False] + [True]
    assert migs[5].reasons == ("mig-read-error",)
    whole = plugins.plugins[None].devices()
    assert [(s.index, s.healthy) for s in whole] == [(1, True)]
    # the Xid on the parent at t=20 takes every instance out, then they come back
    agent.reader.at_s = 22.0
    agent.tick()
    assert not any(s.healthy for s in plugins.plugins["1g.10gb"].devices())
    assert plugins.plugins[None].devices()[0].healthy


def test_preferred_mig_device_is_the_one_with_most_free_memory(tmp_path: Path) -> None:
    _, plugins = plugins_at(15.0, tmp_path)
    plugin: DevicePlugin = plugins.plugins["1g.10gb"]
    states = {s.id: s for s in plugin.devices()}
    busy = next(s.id for s in states.values() if s.mig_index == 3)  # holds the 6 GiB load
    ids = list(states)
    assert busy not in preferred(states, ids, [], 6)
    assert preferred(states, ids, [], 7)[-1] == busy


def test_a_profile_that_appears_later_gets_its_plugin(tmp_path: Path) -> None:
    reader = TraceReader(H100_MIG, at_s=1.0)
    agent = Agent(settings(), reader, NodeApi(None, dry_run=True))
    timing = Timing(resync_s=60, first_read_timeout_s=0.1)
    plugins = DevicePluginSet(agent, PluginConfig(plugin_dir=tmp_path, timing=timing))
    assert set(plugins.plugins) == {None}
    plugins.start()
    try:
        agent.tick()
        assert set(plugins.plugins) == {None, "2g.20gb", "3g.40gb"}
        assert plugins.plugins["3g.40gb"].resource_name == "nvidia.com/mig-3g.40gb"
        assert len(plugins.plugins["2g.20gb"].devices()) == 2
    finally:
        plugins.stop(0)


# ------------------------------------------------------------------------------ extender


def node_parts(path: Path, at_s: float) -> tuple[dict[str, str], dict[str, str]]:
    snap = TraceReader(path, at_s=at_s, window_s=0.0).read()
    desired = render(snap, assess(snap, snap.xid_events), settings())
    return desired.labels, desired.annotations


@pytest.mark.parametrize("drop_telemetry", [False, True], ids=["telemetry", "labels-only"])
def test_extender_counts_only_whole_gpus(drop_telemetry: bool) -> None:
    from omaticaya_py.scheduler import parse_node

    labels, annotations = node_parts(MIG_MIXED, 9.0)
    if drop_telemetry:
        annotations = {}
    state = parse_node("n", labels, annotations)
    # GPU 0 is in seven MIG devices: only the whole GPU 1 can take a pod asking for a GPU
    assert [g.index for g in state.gpus] == [1]
    labels, annotations = node_parts(H100_MIG, 15.0)
    if drop_telemetry:
        annotations = {}
    assert parse_node("n", labels, annotations).gpus == ()
