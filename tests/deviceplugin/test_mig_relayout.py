# ruff: noqa: F811  (test arguments named after the imported fixtures)
"""MIG layouts re-created (issue 23, item 7): MIG UUIDs change each time, and the devices and
per-profile plugins that left the reading leave the kubelet's list.

A real ``Agent`` reads hand-built snapshots of one H100 whose layout the test re-creates; the
plugins (``DevicePluginSet``) serve over real gRPC on a temporary folder and register with the
fake kubelet of test_device_plugin.py; the test reads ``ListAndWatch`` as the kubelet would.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.model.snapshot import MigReading, NodeSnapshot
from omaticaya_py.deviceplugin import DevicePluginSet
from omaticaya_py.deviceplugin.allocation import departed
from omaticaya_py.deviceplugin.config import PluginConfig, Timing
from omaticaya_py.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.deviceplugin.device_plugin_support import FakeKubelet, folder  # noqa: F401
from tests.helpers import gpu, lost, settings, snapshot
from tests.waiting import wait_for

RESOURCE = "example.com/gpu"
SEVEN = [("1g.10gb", 9984)] * 7
MIXED = [("3g.40gb", 40448), ("2g.20gb", 20096), ("2g.20gb", 20096)]


def layout(generation: int, profiles: list[tuple[str, int]]) -> tuple[MigReading, ...]:
    """MIG devices of one layout: new UUIDs for every ``generation`` (as NVML gives them when a
    layout is re-created)."""
    return tuple(
        MigReading(
            index=slot,
            uuid="MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gen/{generation}/slot/{slot}")),
            profile=profile,
            memory_total_mib=mib,
            memory_free_mib=mib - 13,
            process_count=0,
        )
        for slot, (profile, mib) in enumerate(profiles)
    )


class Reader:
    """Reads whatever ``snap`` says, on a clock that moves 1 s per read."""

    def __init__(self, snap: NodeSnapshot) -> None:
        self.snap = snap
        self.t = 100.0

    def read(self) -> NodeSnapshot:
        self.t += 1
        return replace(self.snap, clock_s=self.t)

    def close(self) -> None:
        pass


def h100(migs: tuple[MigReading, ...]) -> NodeSnapshot:
    """GPU 0 in MIG mode with ``migs``, GPU 1 whole."""
    return snapshot(gpu(0, mig_enabled=True, mig_devices=migs), gpu(1))


# -- the pure rule ------------------------------------------------------------------------------

OLD = layout(0, SEVEN)
NEW = layout(1, SEVEN)
KNOWN = {m.uuid: 0 for m in OLD}
PARENTS = {m.uuid: gpu(0).uuid for m in OLD}


@pytest.mark.parametrize(
    ("snap", "gone"),
    [
        pytest.param(h100(NEW), set(KNOWN), id="layout re-created: the old ones leave"),
        pytest.param(h100(OLD), set(), id="same layout: none leaves"),
        pytest.param(snapshot(gpu(0), gpu(1)), set(KNOWN), id="MIG turned off: all leave"),
        pytest.param(snapshot(lost(0), gpu(1)), set(), id="parent lost: they stay"),
        pytest.param(snapshot(gpu(1)), set(), id="parent missing: they stay"),
        pytest.param(snapshot(error="NVMLError_DriverNotLoaded"), set(), id="no library: stay"),
        pytest.param(
            h100(NEW[:6] + (MigReading(index=6, error="NVMLError_Unknown"),)),
            set(),
            id="one MIG device unreadable: they stay",
        ),
    ],
)
def test_which_mig_devices_left_the_reading(snap: NodeSnapshot, gone: set[str]) -> None:
    present = {m.uuid for g in snap.gpus for m in g.mig_devices if m.uuid in KNOWN}
    assert departed(KNOWN, PARENTS, present, snap, mig=True) == gone


@pytest.mark.parametrize(
    ("snap", "gone"),
    [
        pytest.param(h100(NEW), {gpu(0).uuid}, id="GPU now in MIG mode: leaves nvidia.com/gpu"),
        pytest.param(snapshot(lost(0), gpu(1)), set(), id="GPU lost: stays, Unhealthy"),
        pytest.param(snapshot(gpu(1)), set(), id="GPU missing: stays, Unhealthy"),
    ],
)
def test_which_whole_gpus_left_the_reading(snap: NodeSnapshot, gone: set[str]) -> None:
    known = {gpu(0).uuid: 0, gpu(1).uuid: 1}
    present = {g.uuid for g in snap.gpus if not g.mig_enabled and g.error is None}
    assert departed(known, {}, present, snap, mig=False) == gone


# -- over gRPC ------------------------------------------------------------------------------------


class Rig:
    def __init__(self, folder: Path) -> None:
        self.reader = Reader(h100(layout(0, SEVEN)))
        self.agent = Agent(settings(), self.reader, NodeApi(None, dry_run=True))
        self.plugins = DevicePluginSet(
            self.agent, PluginConfig(RESOURCE, folder, timing=Timing(resync_s=0.5))
        )
        self.kubelet = FakeKubelet(folder)
        self.channels: list[grpc.Channel] = []

    def stream(self, profile: str | None):
        path = self.plugins.plugins[profile].socket_path
        channel = grpc.insecure_channel(f"unix://{path}")
        self.channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty(), timeout=30)

    def relayout(self, generation: int, profiles: list[tuple[str, int]]) -> None:
        self.reader.snap = h100(layout(generation, profiles))
        self.agent.tick()


@pytest.fixture
def rig(folder: Path):
    rig = Rig(folder)
    rig.agent.tick()
    rig.kubelet.start()
    rig.plugins.start()
    assert rig.plugins.wait_registered(10)
    yield rig
    for channel in rig.channels:
        channel.close()
    rig.plugins.stop(0)
    rig.kubelet.stop()


def ids(resp: api_pb2.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in resp.devices}


def test_four_relayouts_leave_only_the_current_seven(rig: Rig) -> None:
    stream = rig.stream("1g.10gb")
    assert ids(next(stream)) == dict.fromkeys((m.uuid for m in layout(0, SEVEN)), "Healthy")
    for generation in (1, 2, 3, 4):
        rig.relayout(generation, SEVEN)
        want = dict.fromkeys((m.uuid for m in layout(generation, SEVEN)), "Healthy")
        assert ids(next(stream)) == want, f"layout {generation}"  # 7 devices, not 7 x (n + 1)
    assert len(rig.plugins.plugins["1g.10gb"].devices()) == 7
    stream.cancel()


def test_a_profile_that_left_is_emptied_stopped_and_its_socket_removed(rig: Rig) -> None:
    old = rig.stream("1g.10gb")
    next(old)
    socket = rig.plugins.plugins["1g.10gb"].socket_path
    assert socket.is_socket()
    rig.relayout(1, MIXED)
    assert list(next(old).devices) == []  # the kubelet hears the list is empty
    with pytest.raises((grpc.RpcError, StopIteration)):
        next(old)  # then the stream ends
    assert "1g.10gb" not in rig.plugins.plugins
    assert set(rig.plugins.plugins) == {None, "2g.20gb", "3g.40gb"}
    wait_for("the old profile's socket removed", lambda: not socket.exists(), 10)
    wait_for(
        "the new profiles registered",
        lambda: {r.resource_name for r in rig.kubelet.requests}
        >= {"example.com/mig-2g.20gb", "example.com/mig-3g.40gb"},
        10,
    )
    assert set(ids(next(rig.stream("2g.20gb")))) == {
        m.uuid for m in layout(1, MIXED) if m.profile == "2g.20gb"
    }
    # the profile comes back: served again, with the new devices only
    rig.relayout(2, SEVEN)
    assert set(rig.plugins.plugins) == {None, "1g.10gb"}
    wait_for("1g.10gb served again", lambda: socket.is_socket(), 10)
    assert ids(next(rig.stream("1g.10gb"))) == dict.fromkeys(
        (m.uuid for m in layout(2, SEVEN)), "Healthy"
    )


def test_a_gpu_turned_to_mig_leaves_the_whole_gpu_resource(folder: Path) -> None:
    reader = Reader(snapshot(gpu(0), gpu(1)))
    agent = Agent(settings(), reader, NodeApi(None, dry_run=True))
    agent.tick()
    plugins = DevicePluginSet(agent, PluginConfig(RESOURCE, folder))
    assert [s.index for s in plugins.plugins[None].devices()] == [0, 1]
    reader.snap = h100(layout(0, SEVEN))
    agent.tick()
    assert [(s.index, s.healthy) for s in plugins.plugins[None].devices()] == [(1, True)]
