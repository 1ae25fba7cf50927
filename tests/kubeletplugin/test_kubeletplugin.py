"""``kubeletplugin``: the host both kubelet plugins (device plugin, DRA) run on, with real gRPC
servers on real unix sockets and a real folder watch: a socket served, served again after it
went, removed at stop; the plugin's ``sync`` run at start, on a folder event and retried after
a failure; a kubelet socket created again is a kubelet restart; the GPU indices compared once."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from omaticaya_py.core.model.sharing import IndexMoved, parse_shared_gpus
from omaticaya_py.core.model.snapshot import GpuReading
from omaticaya_py.core.publish.readings import TickResult
from omaticaya_py.dra.pluginregistration import api_pb2 as reg
from omaticaya_py.dra.pluginregistration import api_pb2_grpc as reg_grpc
from omaticaya_py.dra.registration import RegistrationService
from omaticaya_py.kubeletplugin import (
    Backoff,
    IndexCheck,
    KubeletPluginHost,
    PluginSteps,
    ServedSocket,
)
from omaticaya_py.sources.gpu_indices import load_indices, save_indices
from tests.helpers import evaluate, gpu, snapshot
from tests.waiting import wait_for

A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))  # short: a unix socket's path
    yield path
    shutil.rmtree(path, ignore_errors=True)


def served(path: Path) -> ServedSocket:
    """A socket serving the DRA registration service (any real servicer would do)."""
    service = RegistrationService(Path("/run/dra.sock"), lambda ok, error: None)
    return ServedSocket(path, lambda server: reg_grpc.add_RegistrationServicer_to_server(service, server),
                        rpc_threads="test-rpc")  # fmt: skip


def answers(path: Path) -> bool:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        return reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5).type == "DRAPlugin"


def test_a_socket_is_served_again_over_a_stale_file_and_removed_at_stop(folder: Path) -> None:
    path = folder / "plugin.sock"
    path.write_text("left by a crash")
    socket = served(path)
    socket.serve()
    assert socket.served and answers(path) and socket.serves == 1
    socket.serve()  # again: a new server on the same path
    assert socket.served and answers(path) and socket.serves == 2
    socket.stop(0)
    assert not path.exists() and socket.server is None and not socket.served


def test_a_socket_that_cannot_listen_is_an_oserror(folder: Path) -> None:
    socket = served(folder / "missing-folder" / "plugin.sock")
    with pytest.raises(OSError, match="cannot listen on"):
        socket.serve()
    assert socket.server is None and socket.serves == 0


class Steps:
    """A plugin's steps that serve its socket and count what the host did."""

    def __init__(self, socket: ServedSocket, failures: int = 0) -> None:
        self.socket = socket
        self.failures = failures
        self.syncs = 0
        self.restarts = 0
        self.woken = 0
        self.failed: list[tuple[str, float]] = []

    def sync(self) -> None:
        self.syncs += 1
        if self.failures > 0:
            self.failures -= 1
            raise OSError("the kubelet is not there yet")
        if not self.socket.served:
            self.socket.serve()

    def steps(self) -> PluginSteps:
        return PluginSteps(sync=self.sync, failed=lambda detail, delay_s: self.failed.append((detail, delay_s)),
                           wake=lambda: setattr(self, "woken", self.woken + 1),
                           kubelet_restarted=lambda: setattr(self, "restarts", self.restarts + 1))  # fmt: skip


def test_the_host_serves_again_what_went_and_stops(folder: Path) -> None:
    path = folder / "plugins" / "plugin.sock"
    plugin = Steps(served(path))
    host = KubeletPluginHost("test plugin", [plugin.socket], plugin.steps(),
                             kubelet_socket=folder / "plugins" / "kubelet.sock",
                             backoff=Backoff(resync_s=30))  # fmt: skip
    host.start()
    try:
        wait_for("the first sync", lambda: path.is_socket(), 5)
        path.unlink()  # the folder's event wakes the thread long before resync_s
        wait_for("serving again", lambda: path.is_socket() and plugin.socket.serves == 2, 5)
        assert answers(path)
        (folder / "plugins" / "kubelet.sock").write_text("")  # a kubelet (re)started
        wait_for("the kubelet's restart", lambda: plugin.restarts == 1, 5)
        assert not host.wait_registered(0)
        host.note_registered()
        assert host.wait_registered(0) and host.registrations == 1
    finally:
        host.stop(0)
    assert not path.exists() and host.stopping.is_set() and plugin.woken == 1
    syncs = plugin.syncs
    threading.Event().wait(0.2)
    assert plugin.syncs == syncs  # the thread ended


def test_a_failed_sync_is_retried_and_logged(folder: Path) -> None:
    path = folder / "plugin.sock"
    plugin = Steps(served(path), failures=2)
    host = KubeletPluginHost("test plugin", [plugin.socket], plugin.steps(),
                             backoff=Backoff(resync_s=30, retry_first_s=0.05, retry_max_s=0.1))  # fmt: skip
    host.start()
    try:
        wait_for("serving after two failures", lambda: path.is_socket(), 5)
        assert plugin.syncs == 3
        assert plugin.failed == [("the kubelet is not there yet", 0.05), ("the kubelet is not there yet", 0.1)]
    finally:
        host.stop(0)


def reading(*gpus: GpuReading, error: str | None = None) -> TickResult:
    snap = snapshot(*gpus, error=error)
    health, desired = evaluate(snap)
    return TickResult(snap, health, desired, None, False)


def test_the_indices_are_compared_once_at_the_first_readable_reading(folder: Path) -> None:
    path = folder / "gpu-indices.json"
    save_indices(path, {0: A, 1: B})
    check = IndexCheck(path, parse_shared_gpus("0"), "test plugin")
    recorded: list[tuple[IndexMoved, ...]] = []
    assert check(None, recorded.append) is None
    assert check(reading(error="NVMLError_DriverNotLoaded"), recorded.append) is None
    assert not check.done and load_indices(path) == {0: A, 1: B}
    moved = check(reading(gpu(0, uuid=B)), recorded.append)
    assert moved == (IndexMoved(0, A, B),) and recorded == [moved] and check.done
    assert load_indices(path) == {0: B}
    assert check(reading(gpu(0, uuid=A)), recorded.append) is None  # once
