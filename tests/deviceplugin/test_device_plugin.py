"""The device plugin's gRPC servicer through the generated stubs, over a real gRPC channel on a
temporary unix socket, fed by a real ``Agent`` replaying ``tests/data/faults-trace.json``
(4 GPUs: GPU 1 remap-pending 10-14 s, Xid 79 on GPU 2 at 20 s, GPU 3 lost 24-27 s, driver not
loaded 32-34 s). A fake kubelet (the ``Registration`` service) checks registration and
re-registration after a kubelet restart."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from loguru import logger

from omaticaya_py.agent.state import SnapshotCache
from omaticaya_py.core.config.settings import SettingsError, load_settings
from omaticaya_py.core.model.topology import (
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    GpuTopology,
    NodeTopology,
    PairLink,
)
from omaticaya_py.deviceplugin.allocation import (
    DeviceState,
    preferred,
    socket_name_for,
    trace_devices,
)
from omaticaya_py.deviceplugin.plugin import DevicePlugin
from omaticaya_py.deviceplugin.plugin_set import DevicePluginSet
from omaticaya_py.deviceplugin.service import CacheFeed
from omaticaya_py.deviceplugin.v1beta1 import api_pb2
from tests.deviceplugin.device_plugin_support import (  # the names moved out, for this file's tests
    RESOURCE,  # noqa: F401
    UUID,  # noqa: F401
    FakeKubelet,  # noqa: F401
    Rig,  # noqa: F401
    folder,  # noqa: F401
    rig,  # noqa: F401
)
from tests.helpers import FAULTS_TRACE
from tests.waiting import wait_for


def health(resp: api_pb2.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in resp.devices}


def unhealthy(resp: api_pb2.ListAndWatchResponse) -> set[int]:
    return {UUID.index(d.ID) for d in resp.devices if d.health != "Healthy"}


# -- registration and options -------------------------------------------------------------


def test_registers_with_the_kubelet(rig: Rig) -> None:
    (req,) = rig.kubelet.requests
    assert req.version == "v1beta1"
    assert req.resource_name == RESOURCE
    assert req.endpoint == socket_name_for(RESOURCE) == "omaticaya-example.com-gpu.sock"
    assert "/" not in req.endpoint
    assert req.options.pre_start_required and req.options.get_preferred_allocation_available
    assert (rig.folder / req.endpoint).is_socket()


def test_options(rig: Rig) -> None:
    opts = rig.stub().GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert opts.pre_start_required is True
    assert opts.get_preferred_allocation_available is True


# -- ListAndWatch ---------------------------------------------------------------------------


def test_list_and_watch_follows_the_fault_trace(rig: Rig) -> None:
    stream = rig.stub().ListAndWatch(api_pb2.Empty(), timeout=30)
    first = next(stream)
    assert health(first) == dict.fromkeys(UUID, "Healthy")
    assert [d.ID for d in first.devices] == UUID
    steps = [
        (11, {1}),  # remap pending
        (15, set()),  # remap done: GPU 1 back
        (20, {2}),  # Xid 79
        (24, {3}),  # Xid quiet (3 s) over; GPU 3 lost
        (28, set()),  # GPU 3 back
        (33, {0, 1, 2, 3}),  # driver not loaded: all listed, all unhealthy
        (36, set()),
    ]
    for t, bad in steps:
        rig.at(t)
        resp = next(stream)  # bounded by the stream's timeout; how fast is bench/'s business
        assert unhealthy(resp) == bad, f"t={t}"
        assert len(resp.devices) == 4
    stream.cancel()


def test_list_and_watch_sends_only_changes(rig: Rig) -> None:
    stream = rig.stub().ListAndWatch(api_pb2.Empty(), timeout=30)
    next(stream)
    for t in (1, 2, 3, 4, 5, 6, 7):  # nothing changes health (Xid 13 at 5 s is ignored)
        rig.at(t)
    rig.at(11)
    assert unhealthy(next(stream)) == {1}
    stream.cancel()


def test_polls_the_cache_without_notify(rig: Rig) -> None:
    stream = rig.stub().ListAndWatch(api_pb2.Empty(), timeout=30)
    next(stream)
    rig.reader.at_s = 12
    rig.agent.tick()  # no notify(): the 0.2 s poll sees it
    assert unhealthy(next(stream)) == {1}
    stream.cancel()


# -- Allocate / PreStartContainer -----------------------------------------------------------


def test_allocate_returns_visible_devices(rig: Rig) -> None:
    resp = rig.stub().Allocate(
        api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devicesIDs=[UUID[3]]),
                api_pb2.ContainerAllocateRequest(devicesIDs=[UUID[0], UUID[2]]),
            ]
        ),
        timeout=5,
    )
    envs = [dict(c.envs) for c in resp.container_responses]
    assert envs == [
        {"NVIDIA_VISIBLE_DEVICES": UUID[3]},
        {"NVIDIA_VISIBLE_DEVICES": f"{UUID[0]},{UUID[2]}"},
    ]


def test_allocate_refuses_unknown_and_unhealthy(rig: Rig) -> None:
    stub = rig.stub()

    def allocate(*ids: str) -> None:
        stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=list(ids))]
            ),
            timeout=5,
        )

    with pytest.raises(grpc.RpcError) as err:
        allocate("GPU-nope")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    rig.at(12)
    with pytest.raises(grpc.RpcError) as err:
        allocate(UUID[0], UUID[1])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "remap-pending" in err.value.details()
    allocate(UUID[0])


def test_pre_start_refuses_a_gpu_that_turned_unhealthy(rig: Rig) -> None:
    stub = rig.stub()
    request = api_pb2.PreStartContainerRequest(devicesIDs=[UUID[2]])
    stub.PreStartContainer(request, timeout=5)  # healthy: allowed
    rig.at(20)  # Xid 79 on GPU 2
    with pytest.raises(grpc.RpcError) as err:
        stub.PreStartContainer(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "xid-79" in err.value.details() and UUID[2] in err.value.details()
    rig.at(24)  # quiet window over: allowed again
    stub.PreStartContainer(request, timeout=5)


# -- GetPreferredAllocation -----------------------------------------------------------------


def prefer(rig: Rig, available: list[int], size: int, must: list[int] = ()) -> list[int]:
    resp = rig.stub().GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[UUID[i] for i in available],
                    must_include_deviceIDs=[UUID[i] for i in must],
                    allocation_size=size,
                )
            ]
        ),
        timeout=5,
    )
    (one,) = resp.container_responses
    return [UUID.index(d) for d in one.deviceIDs]


def test_preferred_allocation_most_free_memory(rig: Rig) -> None:
    # free MiB in the trace: GPU 0 81080, GPU 1 60599 (loaded), GPU 2 19638 (loaded), GPU 3 81080
    assert prefer(rig, [0, 1, 2, 3], 1) == [0]
    assert prefer(rig, [1, 2, 3], 1) == [3]
    assert prefer(rig, [2, 1], 1) == [1]
    assert prefer(rig, [0, 1, 2, 3], 3) == [0, 3, 1]
    assert prefer(rig, [1, 2], 2) == [1, 2]


def test_preferred_allocation_honours_must_include(rig: Rig) -> None:
    assert prefer(rig, [0, 1, 2, 3], 2, must=[2]) == [2, 0]
    assert prefer(rig, [0, 1, 2, 3], 1, must=[2]) == [2]
    assert prefer(rig, [0, 1, 2, 3], 3, must=[1, 2]) == [1, 2, 0]


def test_preferred_allocation_puts_unhealthy_last(rig: Rig) -> None:
    rig.at(12)  # GPU 1 remap pending: more free memory than GPU 2, but unhealthy
    assert prefer(rig, [1, 2], 1) == [2]


def test_preferred_pure() -> None:
    states = {
        "a": DeviceState("a", 0, True, free_mib=10),
        "b": DeviceState("b", 1, True, free_mib=None),
        "c": DeviceState("c", 2, False, ("lost",), free_mib=99),
        "d": DeviceState("d", 3, True, free_mib=50),
    }
    assert preferred(states, ["a", "b", "c", "d", "x"], [], 5) == ["d", "a", "b", "c", "x"]
    assert preferred(states, ["a", "d"], ["a"], 1) == ["a"]
    assert preferred(states, ["a", "d"], [], 0) == []


# -- kubelet restarts, stop ------------------------------------------------------------------


def test_reregisters_after_kubelet_restart(rig: Rig) -> None:
    serves = rig.plugin.serves
    rig.kubelet.stop()
    # what a starting kubelet does: delete every socket in the folder, serve a new kubelet.sock
    for path in rig.folder.iterdir():
        path.unlink()
    # the plugin notices its socket is gone and serves again
    wait_for("the plugin to serve again", lambda: rig.plugin.serves > serves, 10)
    rig.kubelet = FakeKubelet(rig.folder)
    rig.kubelet.start()
    assert rig.kubelet.registered.wait(10), "no re-registration after the kubelet restarted"
    assert rig.plugin.socket_path.is_socket()
    if rig.channel is not None:
        rig.channel.close()
        rig.channel = None
    assert rig.stub().GetDevicePluginOptions(api_pb2.Empty(), timeout=5).pre_start_required


def test_retries_until_the_kubelet_answers(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder)
    rig = Rig(folder, load_settings(xid_quiet_s=3))
    rig.at(0.0)
    (folder / "kubelet.sock").touch()  # stale socket file of a dead kubelet
    failures: list[str] = []
    sink = logger.add(lambda m: failures.append(str(m)), filter=lambda r: "registration with" in r["message"])
    rig.plugin.start()
    try:
        wait_for("two failed registrations", lambda: len(failures) >= 2, 20)
        assert rig.plugin.registrations == 0
        (folder / "kubelet.sock").unlink()
        rig.kubelet.start()
        assert rig.kubelet.registered.wait(5)
    finally:
        logger.remove(sink)
        rig.plugin.stop(0)
        rig.kubelet.stop()


def test_stop_ends_streams_and_removes_the_socket(rig: Rig) -> None:
    stream = rig.stub().ListAndWatch(api_pb2.Empty(), timeout=30)
    next(stream)
    rig.plugin.stop(0.5)
    with pytest.raises((grpc.RpcError, StopIteration)):
        next(stream)
    assert not rig.plugin.socket_path.exists()


# -- devices from the trace, settings ------------------------------------------------------


def test_devices_from_the_trace_before_any_reading() -> None:
    assert trace_devices(FAULTS_TRACE) == list(enumerate(UUID))
    plugin = DevicePlugin(CacheFeed(SnapshotCache()), devices=trace_devices(FAULTS_TRACE))
    states = plugin.devices()
    assert [s.id for s in states] == UUID
    assert not any(s.healthy for s in states)


def test_from_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(
        trace=str(FAULTS_TRACE), device_plugin_resource="omaticaya.io/h100",
        device_plugin_dir=str(tmp_path),
    )
    plugin = DevicePluginSet.from_settings(CacheFeed(SnapshotCache()), settings).plugins[None]
    assert plugin.resource_name == "omaticaya.io/h100"
    assert plugin.kubelet_socket == tmp_path / "kubelet.sock"
    assert [s.id for s in plugin.devices()] == UUID


@pytest.mark.parametrize("good", ["nvidia.com/gpu", "example.com/gpu.shared", "a.b/G_1"])
def test_resource_name_accepted(good: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings(device_plugin_resource=good).device_plugin_resource == good


@pytest.mark.parametrize(
    "bad", ["gpu", "kubernetes.io/gpu", "x.kubernetes.io/gpu", "nvidia.com/", "Nvidia.com/gpu",
            "nvidia.com/-gpu", "nvidia.com/a/b", "nvidia.com/" + "g" * 64]
)
def test_resource_name_refused(bad: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match="OMATICAYA_DEVICE_PLUGIN_RESOURCE"):
        load_settings(device_plugin_resource=bad)


# four idle GPUs: a-b on one PCIe switch, c-d on another, across the system between them
_WIRED = NodeTopology(
    tuple(GpuTopology(i) for i in range(4)),
    {(a, b): PairLink(TOPOLOGY_SINGLE if (a, b) in {(0, 1), (2, 3)} else TOPOLOGY_SYSTEM)
     for a in range(4) for b in range(a + 1, 4)},
)  # fmt: skip


@pytest.mark.parametrize(
    ("must", "size", "expected"),
    [
        pytest.param([], 2, ["a", "b"], id="closest-pair-by-index"),
        pytest.param(["c"], 2, ["c", "d"], id="partner-of-must-include"),
        pytest.param(["b"], 3, ["b", "a", "c"], id="fills-closest-first"),
    ],
)
def test_preferred_topology_chooses_between_equally_free_gpus(must, size, expected) -> None:
    states = {d: DeviceState(d, i, True, free_mib=80896) for i, d in enumerate("abcd")}
    assert preferred(states, list("abcd"), must, size, _WIRED) == expected


def test_preferred_free_memory_beats_topology() -> None:
    states = {d: DeviceState(d, i, True, free_mib=80896) for i, d in enumerate("abcd")}
    states["d"] = DeviceState("d", 3, True, free_mib=1024)
    assert preferred(states, list("abcd"), ["c"], 2, _WIRED) == ["c", "a"]
