"""What other test files share of test_device_plugin.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import Settings, load_settings
from omaticaya_py.deviceplugin.config import PluginConfig, Timing
from omaticaya_py.deviceplugin.plugin import DevicePlugin
from omaticaya_py.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import FAULTS_TRACE

UUID = [f"GPU-{i:08d}-7fda-b7ae-a94e-630097a14ca4" for i in range(4)]


RESOURCE = "example.com/gpu"


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """The kubelet's registration service on ``<dir>/kubelet.sock``: records each request."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.requests: list[api_pb2.RegisterRequest] = []
        self.server: grpc.Server | None = None
        self.registered = threading.Event()

    def Register(self, request, context):  # noqa: N802 - gRPC method name
        self.requests.append(request)
        self.registered.set()
        return api_pb2.Empty()

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        assert self.server.add_insecure_port(f"unix://{self.folder / 'kubelet.sock'}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(2)
            self.server = None


class Rig:
    """A plugin over a real Agent whose trace time the test moves with ``at(seconds)``."""

    def __init__(self, folder: Path, settings: Settings) -> None:
        self.folder = folder
        self.reader = TraceReader(FAULTS_TRACE, at_s=0.0)
        self.agent = Agent(settings, self.reader, NodeApi(None, dry_run=True))
        self.plugin = DevicePlugin(
            self.agent, PluginConfig(RESOURCE, folder, timing=Timing(resync_s=0.5))
        )
        self.kubelet = FakeKubelet(folder)
        self.channel: grpc.Channel | None = None

    def at(self, t: float) -> None:
        self.reader.at_s = t
        self.agent.tick()
        self.plugin.notify()

    def stub(self) -> api_pb2_grpc.DevicePluginStub:
        if self.channel is None:
            self.channel = grpc.insecure_channel(f"unix://{self.plugin.socket_path}")
        return api_pb2_grpc.DevicePluginStub(self.channel)


@pytest.fixture
def folder() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes: keep the folder short
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rig(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.chdir(folder)  # no stray .env
    rig = Rig(folder, load_settings(xid_quiet_s=3, schedule="@every 1s"))
    rig.at(0.0)
    rig.kubelet.start()
    rig.plugin.start()
    assert rig.kubelet.registered.wait(10), "the plugin did not register"
    yield rig
    if rig.channel is not None:
        rig.channel.close()
    rig.plugin.stop(0)
    rig.kubelet.stop()
