# ruff: noqa: F811  (test arguments named after the imported fixtures)
"""A tick that never returns (issue 23, item 4, the device plugin's side): a blocked NVML call
leaves the last reading in the cache, and the plugin must not serve it as health forever.

Over a real gRPC channel (the fake kubelet of test_device_plugin.py), fed by a real ``Agent``
replaying the faults trace; the plugin's clock is hand-driven (``tests.helpers.Clock``), so
"older than N periods" needs no waiting. One test blocks a real reader in a real tick thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import stuck_after_s
from omaticaya_py.core.model.snapshot import NodeSnapshot
from omaticaya_py.deviceplugin import DevicePluginSet
from omaticaya_py.deviceplugin.allocation import STALE_READING
from omaticaya_py.deviceplugin.config import PluginConfig, Timing, plugin_config
from omaticaya_py.deviceplugin.plugin import DevicePlugin
from omaticaya_py.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.deviceplugin.device_plugin_support import RESOURCE, UUID, FakeKubelet, folder  # noqa: F401
from tests.helpers import FAULTS_TRACE, Clock, settings
from tests.waiting import wait_for

PERIOD_S = 2.0
STALE_S = 3 * PERIOD_S


class Rig:
    def __init__(self, folder: Path) -> None:
        self.clock = Clock(1000.0)
        self.reader = TraceReader(FAULTS_TRACE, at_s=0.0)
        self.agent = Agent(settings(schedule="@every 2s"), self.reader, NodeApi(None, dry_run=True))
        self.plugin = DevicePlugin(self.agent, PluginConfig(RESOURCE, folder, timing=Timing(
            resync_s=0.5, stale_after_s=STALE_S, clock=self.clock,
        )))  # fmt: skip
        self.kubelet = FakeKubelet(folder)
        self.channel = grpc.insecure_channel(f"unix://{self.plugin.socket_path}")

    def stub(self) -> api_pb2_grpc.DevicePluginStub:
        return api_pb2_grpc.DevicePluginStub(self.channel)

    def tick(self, at_s: float) -> None:
        self.reader.at_s = at_s
        self.agent.tick()
        self.plugin.notify()


@pytest.fixture
def rig(folder: Path) -> Iterator[Rig]:
    rig = Rig(folder)
    rig.tick(0.0)
    rig.kubelet.start()
    rig.plugin.start()
    assert rig.kubelet.registered.wait(10)
    yield rig
    rig.channel.close()
    rig.plugin.stop(0)
    rig.kubelet.stop()


def health(resp: api_pb2.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in resp.devices}


def test_an_old_reading_turns_every_device_unhealthy_and_a_fresh_one_back(rig: Rig) -> None:
    stream = rig.stub().ListAndWatch(api_pb2.Empty(), timeout=30)
    assert health(next(stream)) == dict.fromkeys(UUID, "Healthy")
    rig.clock.t += STALE_S  # no tick for exactly N periods: still served as read
    assert all(s.healthy for s in rig.plugin.devices())
    rig.clock.t += 0.5  # more than N periods: the reading is stale
    assert health(next(stream)) == dict.fromkeys(UUID, "Unhealthy")
    assert {s.reasons for s in rig.plugin.devices()} == {(STALE_READING,)}
    with pytest.raises(grpc.RpcError) as err:  # and nothing is handed out meanwhile
        rig.stub().Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=[UUID[0]])]
            ),
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "stale-reading" in err.value.details()
    rig.tick(1.0)  # a fresh reading: health as read again
    assert health(next(stream)) == dict.fromkeys(UUID, "Healthy")
    rig.tick(11.0)  # and it is the reading's own health that is served (GPU 1 remap pending)
    assert health(next(stream))[UUID[1]] == "Unhealthy"
    stream.cancel()


class BlockingReader:
    """A reader whose ``read()`` blocks while ``blocked`` is clear (a hung NVML call)."""

    def __init__(self, inner: TraceReader) -> None:
        self.inner = inner
        self.go = threading.Event()
        self.go.set()
        self.entered = threading.Event()

    def read(self) -> NodeSnapshot:
        self.entered.set()
        self.go.wait()
        return self.inner.read()

    def close(self) -> None:
        self.go.set()


def test_a_tick_blocked_in_the_reader_turns_devices_unhealthy(folder: Path) -> None:
    clock = Clock(50.0)
    reader = BlockingReader(TraceReader(FAULTS_TRACE, at_s=0.0))
    agent = Agent(settings(schedule="@every 2s"), reader, NodeApi(None, dry_run=True))
    agent.tick()
    plugins = DevicePluginSet(
        agent, PluginConfig(RESOURCE, folder, timing=Timing(stale_after_s=STALE_S, clock=clock))
    )
    plugin = plugins.plugins[None]
    assert all(s.healthy for s in plugin.devices())
    reader.go.clear()
    reader.entered.clear()
    tick = threading.Thread(target=agent.tick, daemon=True)
    tick.start()
    assert reader.entered.wait(5)  # the tick is in the reader, and stays there
    clock.t += STALE_S + 1
    assert [s.reasons for s in plugin.devices()] == [(STALE_READING,)] * 4
    assert plugin.stale
    reader.go.set()  # the call returns: a fresh reading
    tick.join(5)
    wait_for("devices healthy again", lambda: all(s.healthy for s in plugin.devices()), 5)
    assert not plugin.stale


def test_the_bound_is_the_agents_stuck_tick_bound() -> None:
    s = settings(schedule="@every 10s", jitter_s=5)
    periods = s.stuck_tick_periods  # OMATICAYA_STUCK_TICK_PERIODS, default 3
    assert periods == 3
    assert stuck_after_s(s) == periods * 10 + 5
    agent = Agent(s, TraceReader(FAULTS_TRACE), NodeApi(None))
    plugins = DevicePluginSet.from_settings(agent, s)
    assert plugin_config(s).timing.stale_after_s == periods * 10 + 5
    assert agent.cache.stuck_after_s == periods * 10 + 5  # the agent's /healthz bound
    assert plugins.plugins[None].stale_after_s == periods * 10 + 5


def test_off_without_a_bound(folder: Path) -> None:
    agent = Agent(settings(), TraceReader(FAULTS_TRACE, at_s=0.0), NodeApi(None, dry_run=True))
    agent.tick()
    clock = Clock(0.0)
    plugin = DevicePlugin(agent, PluginConfig(plugin_dir=folder, timing=Timing(clock=clock)))
    plugin.devices()
    clock.t += 1e6
    assert all(s.healthy for s in plugin.devices())


def test_a_library_failure_is_still_reported_as_such(rig: Rig) -> None:
    assert len(rig.plugin.devices()) == 4
    rig.tick(33.0)  # driver not loaded: that reason, not staleness
    assert {s.reasons for s in rig.plugin.devices()} == {("NVMLError_DriverNotLoaded",)}
