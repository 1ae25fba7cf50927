"""The DRA kubelet plugin (omaticaya_py/dra/plugin.py) served for real: its gRPC servers on real
unix sockets (short folders under /tmp), called as the kubelet calls them (its plugin watcher's
GetInfo and NotifyRegistrationStatus, DRAPlugin v1, DRAResourceHealth v1 and v1alpha1); the
ResourceClaims read from the dev cluster's real kube-apiserver (marked ``cluster``; no kubelet
is started). The reading is the agent's ``TickResult`` of a test snapshot."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from omaticaya_py.core.model.sharing import IndexMoved
from omaticaya_py.core.publish.dra import device_name
from omaticaya_py.core.publish.readings import TickListener, TickResult
from omaticaya_py.dra.health.v1 import api_pb2 as h1
from omaticaya_py.dra.health.v1 import api_pb2_grpc as h1_grpc
from omaticaya_py.dra.health.v1alpha1 import api_pb2 as h0
from omaticaya_py.dra.health.v1alpha1 import api_pb2_grpc as h0_grpc
from omaticaya_py.dra.host import (
    CHECKPOINT_FILE,
    INDICES_FILE,
    Checkpoint,
    Entry,
    load_indices,
    save_indices,
)
from omaticaya_py.dra.metrics import DraCounters
from omaticaya_py.dra.plugin import DraPlugin, PluginTiming
from omaticaya_py.dra.pluginregistration import api_pb2 as reg
from omaticaya_py.dra.pluginregistration import api_pb2_grpc as reg_grpc
from omaticaya_py.dra.prepare import cdi_file_name
from omaticaya_py.dra.v1 import api_pb2 as dra
from omaticaya_py.dra.v1 import api_pb2_grpc as dra_grpc
from tests.dra.dra_prepare_support import check_cdi
from tests.helpers import evaluate, gpu, settings, snapshot, xid

NODE = "dra-node-1"
#: h100-trace.json's one GPU
H100_UUID = "GPU-178dd196-7fda-b7ae-a94e-630097a14ca4"
G0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
G1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
#: the devices of GPUs 0 and 1 (tests.helpers.gpu's UUIDs), named by UUID
D0, D1 = device_name(G0), device_name(G1)


@dataclass
class Cache:
    last: TickResult | None = None


@dataclass
class Feed:
    """The agent as the plugin reads it (``core.publish.readings.AgentFeed``), ticked by the test."""

    cache: Cache = field(default_factory=Cache)
    now: float = 1000.0
    on_tick: list[TickListener] = field(default_factory=list)
    last_listed: tuple[frozenset[str], float] | None = None
    topology: None = None

    @property
    def clock(self) -> Any:
        return lambda: self.now

    def tick(self, *gpus: Any, xids: Any = (), error: str | None = None) -> None:
        snap = snapshot(*gpus, xid_events=xids, error=error)
        health, desired = evaluate(snap)
        self.cache.last = TickResult(snap, health, desired, None, False)
        for listener in list(self.on_tick):
            listener(self.cache.last)


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    out = {k: root / k for k in ("plugin", "registry", "cdi", "dev")}
    out["dev"].mkdir(parents=True)
    yield out
    shutil.rmtree(root, ignore_errors=True)


def make(feed: Feed, dirs: dict[str, Path], session: Any = None, **kw: Any) -> DraPlugin:
    s = settings(dra=True, node_name=NODE, dra_plugin_dir=dirs["plugin"],
                 dra_registry_dir=dirs["registry"], dra_cdi_dir=dirs["cdi"],
                 dra_dev_root=dirs["dev"], **kw)
    return DraPlugin(feed, s, session, timing=PluginTiming(resync_s=0.2, poll_s=0.05))


@pytest.fixture
def feed() -> Feed:
    f = Feed()
    f.tick(gpu(0), gpu(1))
    return f


@pytest.fixture
def plugin(feed: Feed, dirs: dict[str, Path]) -> Iterator[DraPlugin]:
    p = make(feed, dirs)
    p.start()
    yield p
    p.stop(0)


def channel(path: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


def wait_for(check: Any, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return False


# -- registration ----------------------------------------------------------------------------


def test_get_info_answers_as_the_kubelet_expects(plugin: DraPlugin, dirs: dict[str, Path]) -> None:
    sock = dirs["registry"] / "gpu.omaticaya.io-reg.sock"
    assert sock.is_socket() and (dirs["plugin"] / "dra.sock").is_socket()
    assert len(str(sock).encode()) <= 107
    with channel(sock) as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = stub.GetInfo(reg.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin", "gpu.omaticaya.io", str(dirs["plugin"] / "dra.sock"))
        assert list(info.supported_versions) == [
            "v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
        assert not plugin.wait_registered(0)
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
    assert plugin.wait_registered(1) and plugin.registrations == 1


def test_a_refused_registration_serves_the_socket_again(plugin: DraPlugin, dirs: dict[str, Path]) -> None:
    sock = dirs["registry"] / "gpu.omaticaya.io-reg.sock"
    assert plugin.registration_serves == 1
    with channel(sock) as ch:
        reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="endpoint taken"), timeout=5)
    assert plugin.registration_errors == ["endpoint taken"]
    # a new socket: the kubelet's watcher sees a create and tries again
    assert wait_for(lambda: plugin.registration_serves == 2 and sock.is_socket())
    with channel(sock) as ch:
        assert reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5).name == "gpu.omaticaya.io"


@pytest.mark.parametrize("which", ["registry", "plugin"])
def test_a_removed_socket_is_served_again(plugin: DraPlugin, dirs: dict[str, Path], which: str) -> None:
    sock = dirs[which] / ("gpu.omaticaya.io-reg.sock" if which == "registry" else "dra.sock")
    sock.unlink()
    assert wait_for(sock.is_socket)
    with channel(dirs["registry"] / "gpu.omaticaya.io-reg.sock") as ch:
        assert reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5).type == "DRAPlugin"
    with channel(dirs["plugin"] / "dra.sock") as ch:
        answer = dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=[dra.Claim(namespace="a", name="b", uid="u")]), timeout=5)
        assert answer.claims["u"].error == ""


def test_stop_removes_both_sockets_and_keeps_the_checkpoint(feed: Feed, dirs: dict[str, Path]) -> None:
    p = make(feed, dirs)
    p.start()
    (dirs["plugin"] / CHECKPOINT_FILE).write_text('{"version": 1, "claims": {}}\n')
    p.stop(0)
    assert not (dirs["registry"] / "gpu.omaticaya.io-reg.sock").exists()
    assert not (dirs["plugin"] / "dra.sock").exists()
    assert (dirs["plugin"] / CHECKPOINT_FILE).exists()


def test_a_corrupt_checkpoint_is_moved_aside(feed: Feed, dirs: dict[str, Path]) -> None:
    dirs["plugin"].mkdir(parents=True)
    (dirs["plugin"] / CHECKPOINT_FILE).write_text("{not json")
    p = make(feed, dirs)
    p.start()
    try:
        assert p.checkpoint.claims == {}
        aside = list(dirs["plugin"].glob(f"{CHECKPOINT_FILE}.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_text() == "{not json"
    finally:
        p.stop(0)


def test_unprepare_of_an_unknown_claim_is_success(plugin: DraPlugin, dirs: dict[str, Path]) -> None:
    left = dirs["cdi"] / cdi_file_name("left-behind")
    left.write_text("{}")  # a spec written before a crash, never checkpointed
    with channel(dirs["plugin"] / "dra.sock") as ch:
        answer = dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(
            claims=[dra.Claim(namespace="a", name="b", uid="left-behind")]), timeout=5)
    assert dict(answer.claims) == {"left-behind": dra.NodeUnprepareResourceResponse()}
    assert not left.exists()
    assert plugin.counts.unprepare["unknown"] == 1


def test_prepare_without_an_api_session_is_refused(plugin: DraPlugin, dirs: dict[str, Path]) -> None:
    with channel(dirs["plugin"] / "dra.sock") as ch:
        answer = dra_grpc.DRAPluginStub(ch).NodePrepareResources(dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace="a", name="b", uid="u1")]), timeout=5)
    assert "no Kubernetes API session" in answer.claims["u1"].error
    assert list(dirs["cdi"].iterdir()) == []
    assert plugin.counts.prepare["refused"] == 1


# -- health ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("pb2", "grpc_mod"), [(h1, h1_grpc), (h0, h0_grpc)], ids=["v1", "v1alpha1"])
def test_health_stream_sends_every_device_then_a_change(
    plugin: DraPlugin, feed: Feed, dirs: dict[str, Path], pb2: Any, grpc_mod: Any
) -> None:
    with channel(dirs["plugin"] / "dra.sock") as ch:
        stream = grpc_mod.DRAResourceHealthStub(ch).NodeWatchResources(pb2.NodeWatchResourcesRequest(), timeout=10)
        first = next(stream)
        assert [(d.device.pool_name, d.device.device_name, d.health, d.message) for d in first.devices] == [
            (NODE, D0, pb2.HEALTHY, ""), (NODE, D1, pb2.HEALTHY, "")]
        assert all(d.health_check_timeout_seconds == plugin.health_timeout_s for d in first.devices)
        assert abs(first.devices[0].last_updated_time - time.time()) < 5
        feed.tick(gpu(0), gpu(1), xids=[xid(1, 79, at_s=99.0)])  # a fatal Xid on GPU 1
        second = next(stream)
        assert [(d.device.device_name, d.health, d.message) for d in second.devices] == [
            (D0, pb2.HEALTHY, ""), (D1, pb2.UNHEALTHY, "xid-79")]
        feed.tick(gpu(0), gpu(1))  # recovered
        third = next(stream)
        assert [d.health for d in third.devices] == [pb2.HEALTHY, pb2.HEALTHY]
        stream.cancel()


def test_health_before_the_first_reading_is_unknown_for_prepared_devices(dirs: dict[str, Path]) -> None:
    dirs["plugin"].mkdir(parents=True)
    (dirs["plugin"] / CHECKPOINT_FILE).write_text(json.dumps({"version": 1, "claims": {"u": {
        "namespace": "a", "name": "b", "cdi_file": None, "spec": None,
        "devices": [{"device_name": "gpu-3", "pool_name": NODE}]}}}))
    p = make(Feed(), dirs)
    p.start()
    try:
        with channel(dirs["plugin"] / "dra.sock") as ch:
            stream = h1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(h1.NodeWatchResourcesRequest(), timeout=10)
            first = next(stream)
            assert [(d.device.device_name, d.health) for d in first.devices] == [("gpu-3", h1.UNKNOWN)]
            assert "no reading" in first.devices[0].message
            stream.cancel()
    finally:
        p.stop(0)


def test_stop_ends_the_health_stream(feed: Feed, dirs: dict[str, Path]) -> None:
    p = make(feed, dirs)
    p.start()
    with channel(dirs["plugin"] / "dra.sock") as ch:
        stream = h1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(h1.NodeWatchResourcesRequest(), timeout=10)
        next(stream)
        done = threading.Event()

        def drain() -> None:
            try:
                for _ in stream:
                    pass
            except grpc.RpcError:
                pass
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        p.stop(0.5)
        assert done.wait(5)


# -- prepare and unprepare, claims from the real kube-apiserver ------------------------------

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


def api(admin_client: Any, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
    answer = admin_client.call_api(
        *admin_client.param_serialize(method, path, header_params={"Content-Type": content_type,
                                                                   "Accept": "application/json"}, body=body),
        _request_timeout=10,
    )
    data = answer.response.data
    assert 200 <= answer.status < 300, data
    return json.loads(data)


@pytest.fixture
def make_claim(admin_client: Any) -> Iterator[Any]:
    """Create a real ResourceClaim and write its status.allocation (the status subresource), as
    kube-scheduler would; delete them after."""
    made: list[str] = []

    def make(results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> tuple[str, str]:
        name = f"claim-{uuidlib.uuid4().hex[:10]}"
        requests = sorted({r["request"] for r in results})
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [
                    {"name": r, "exactly": {"deviceClassName": "gpu.omaticaya.io"}} for r in requests]}}}
        created = api(admin_client, "POST", CLAIMS.format(ns="default"), body)
        made.append(name)
        devices: dict[str, Any] = {"results": results}
        if config is not None:
            devices["config"] = config
        patch = {"status": {"allocation": {"devices": devices, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}}
        api(admin_client, "PATCH", CLAIMS.format(ns="default") + f"/{name}/status", patch,
            "application/merge-patch+json")
        return name, created["metadata"]["uid"]

    yield make
    for name in made:
        try:
            api(admin_client, "DELETE", CLAIMS.format(ns="default") + f"/{name}")
        except AssertionError:
            pass


def result(device: str, request: str = "gpu") -> dict[str, Any]:
    return {"request": request, "driver": "gpu.omaticaya.io", "pool": NODE, "device": device}


@pytest.fixture
def session(dev_cluster: Any) -> Iterator[Any]:
    from omaticaya_py.kube.session import ApiSession

    s = ApiSession(kubeconfig=str(dev_cluster.kubeconfig), attempts=2, sleep=lambda _s: None)
    yield s
    s.close()


def prepare(sock: Path, *claims: tuple[str, str, str]) -> Any:
    with channel(sock) as ch:
        return dra_grpc.DRAPluginStub(ch).NodePrepareResources(dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]), timeout=20)


def unprepare(sock: Path, *claims: tuple[str, str, str]) -> Any:
    with channel(sock) as ch:
        return dra_grpc.DRAPluginStub(ch).NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(
            claims=[dra.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]), timeout=20)


def char_node(dev: Path, name: str) -> None:
    """A device node as the plugin finds it: a link to /dev/null (a character device)."""
    (dev / name).symlink_to("/dev/null")


@pytest.mark.cluster
def test_prepare_twice_unprepare_and_restart(feed: Feed, dirs: dict[str, Path], session: Any,
                                             make_claim: Any) -> None:
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        char_node(dirs["dev"], name)
    p = make(feed, dirs, session)
    p.start()
    sock = dirs["plugin"] / "dra.sock"
    name, uid = make_claim([result(D0)])
    ref = ("default", name, uid)
    try:
        first = prepare(sock, ref)
        assert first.claims[uid].error == ""
        (device,) = first.claims[uid].devices
        assert (list(device.request_names), device.pool_name, device.device_name, list(device.cdi_device_ids)) == (
            ["gpu"], NODE, D0, [f"gpu.omaticaya.io/claim={uid}-{D0}"])
        spec_file = dirs["cdi"] / f"gpu.omaticaya.io-claim_{uid}.json"
        spec = json.loads(spec_file.read_text())
        check_cdi(spec)
        edits = spec["devices"][0]["containerEdits"]
        assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={G0}"]
        assert [(n["path"], n["hostPath"], n["type"], n["major"], n["minor"]) for n in edits["deviceNodes"]] == [
            ("/dev/nvidia0", "/dev/nvidia0", "c", 1, 3),  # found under the dev root: numbers of
            ("/dev/nvidiactl", "/dev/nvidiactl", "c", 1, 3),  # what it links to (/dev/null)
            ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "c", 1, 3)]  # no nvidia-uvm-tools here
        assert not [f for f in dirs["cdi"].iterdir() if f.name.startswith(".")]  # no temporary left

        # again, after the GPU turned unhealthy: the same answer, from the checkpoint
        feed.tick(gpu(0), gpu(1), xids=[xid(0, 79, at_s=99.0)])
        assert prepare(sock, ref) == first
        # the CDI file went missing: written again
        spec_file.unlink()
        assert prepare(sock, ref) == first
        assert json.loads(spec_file.read_text()) == spec
        assert (p.counts.prepare["prepared"], p.counts.prepare["repeated"]) == (1, 2)

        # a restarted plugin keeps its checkpoint
        p.stop(0)
        p = make(feed, dirs, session)
        p.start()
        assert uid in p.checkpoint.claims
        assert prepare(sock, ref) == first
        assert unprepare(sock, ref).claims[uid].error == ""
        assert not spec_file.exists()
        assert uid not in json.loads((dirs["plugin"] / CHECKPOINT_FILE).read_text())["claims"]
        assert unprepare(sock, ref).claims[uid].error == ""  # idempotent
        assert (p.counts.unprepare["unprepared"], p.counts.unprepare["unknown"]) == (1, 1)
        families = {f.name: {s.labels["result"]: s.value for s in f.samples if s.name.endswith("_total")}
                    for f in DraCounters(p.counts).collect()}
        assert families["omaticaya_dra_unprepare"] == {"unprepared": 1.0, "unknown": 1.0, "failed": 0.0}
        assert families["omaticaya_dra_prepare"]["repeated"] == 1.0
    finally:
        p.stop(0)


@pytest.mark.cluster
def test_failed_claims_leave_nothing(feed: Feed, dirs: dict[str, Path], session: Any, make_claim: Any) -> None:
    feed.tick(gpu(0), gpu(1), xids=[xid(1, 79, at_s=99.0)])
    p = make(feed, dirs, session)
    p.start()
    sock = dirs["plugin"] / "dra.sock"
    try:
        unhealthy, u1 = make_claim([result(D1)])
        unknown, u2 = make_claim([result("gpu-7")])
        bad_config, u3 = make_claim([result(D0)], config=[{"source": "FromClaim", "opaque": {
            "driver": "gpu.omaticaya.io",
            "parameters": {"apiVersion": "gpu.omaticaya.io/v1alpha1", "kind": "GpuConfig", "timeSlice": 1}}}])
        good, u4 = make_claim([result(D0)])
        answer = prepare(sock, ("default", unhealthy, u1), ("default", unknown, u2),
                         ("default", bad_config, u3), ("default", "no-such-claim", "u5"),
                         ("default", good, "not-its-uid"), ("default", good, u4))
        errors = {u: answer.claims[u].error for u in (u1, u2, u3, "u5", "not-its-uid", u4)}
        assert f"{D1} is unhealthy: xid-79" in errors[u1]
        assert "gpu-7: not in the node's reading" in errors[u2]
        assert "opaque.parameters.timeSlice: unknown field" in errors[u3]
        assert errors["u5"] == "ResourceClaim default/no-such-claim not found"
        assert "not not-its-uid: it was deleted and created again" in errors["not-its-uid"]
        assert errors[u4] == ""
        assert [f.name for f in dirs["cdi"].iterdir()] == [cdi_file_name(u4)]
        assert set(json.loads((dirs["plugin"] / CHECKPOINT_FILE).read_text())["claims"]) == {u4}
        assert p.counts.prepare["refused"] == 5
    finally:
        p.stop(0)


@pytest.mark.cluster
def test_unwritable_cdi_folder_fails_and_records_nothing(feed: Feed, dirs: dict[str, Path], session: Any,
                                                         make_claim: Any) -> None:
    p = make(feed, dirs, session)
    p.start()
    try:
        name, uid = make_claim([result(D0)])
        shutil.rmtree(dirs["cdi"])
        dirs["cdi"].write_text("not a folder")
        answer = prepare(dirs["plugin"] / "dra.sock", ("default", name, uid))
        assert answer.claims[uid].error.startswith(f"cannot record claim {uid}")
        assert uid not in p.checkpoint.claims
        assert p.counts.prepare["failed"] == 1
    finally:
        p.stop(0)


@pytest.mark.cluster
def test_a_shared_slice_under_mps(feed: Feed, dirs: dict[str, Path], session: Any, make_claim: Any) -> None:
    """A 20 GiB slice of a shared GPU (consumable capacity, written by the API server as the
    scheduler would) is refused while the GPU's MPS probe is not up; with the real supervisor
    running (the stand-in ``nvidia-cuda-mps-control``) it becomes the client of a daemon of its
    own whose default limit is the slice (issue 47), and its unprepare lets that daemon go."""
    import shutil
    import tempfile

    from omaticaya_py.core.allocation.mps import Layout
    from omaticaya_py.dra.prepare import claim_slice_id
    from omaticaya_py.mps.supervisor import Gpu, Supervisor, SupervisorOptions
    from tests.mps_rig import STANDIN
    from tests.waiting import wait_for

    short = Path(tempfile.mkdtemp(prefix="om-dra-", dir="/tmp"))  # a socket path's 107 bytes
    layout = Layout(short / "mps", short / "state")
    p = make(feed, dirs, session, shared_gpus="0", share_enforcement="mps",
             mps_root=layout.root, mps_state_dir=layout.state_dir)
    p.start()
    sup = Supervisor(layout, [Gpu(0, G0, 79)], 1024,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=10, shm_mib=0))  # fmt: skip
    stop = threading.Event()
    sock = dirs["plugin"] / "dra.sock"
    share = str(uuidlib.uuid4())
    slice_result = {**result(D0), "shareID": share, "consumedCapacity": {"memory": "20Gi"}}
    try:
        name, uid = make_claim([slice_result])
        down = prepare(sock, ("default", name, uid))
        assert f"{D0}: its MPS daemon is not up (mps-state-missing)" in down.claims[uid].error
        sup.start()
        threading.Thread(target=sup.run_forever, args=(stop,), daemon=True).start()
        p.mps.min_interval_s = 0  # type: ignore[union-attr]
        answer = prepare(sock, ("default", name, uid))
        assert answer.claims[uid].error == ""
        (device,) = answer.claims[uid].devices
        assert device.share_id == share
        sid = claim_slice_id(uid, D0)
        spec = json.loads((dirs["cdi"] / cdi_file_name(uid)).read_text())
        check_cdi(spec)
        assert spec["devices"][0]["containerEdits"]["env"] == [
            f"NVIDIA_VISIBLE_DEVICES={G0}", f"CUDA_MPS_PIPE_DIRECTORY={layout.slice_pipe(sid)}",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "OMATICAYA_GPU_MEMORY_LIMIT_MIB=20480"]
        state = sup.slice_states()[sid]
        assert (state.state, state.limit_mib, state.uuid) == ("up", 20480, G0)
        assert (layout.slice_pipe(sid) / "control").is_socket()
        assert unprepare(sock, ("default", name, uid)).claims[uid].error == ""
        wait_for("the slice's daemon let go", lambda: sid not in sup.slice_states()
                 and not layout.slice_dir(sid).exists(), 10)  # fmt: skip
        # a claim unprepared while the plugin was down: a restarted plugin lets its daemon go
        assert prepare(sock, ("default", name, uid)).claims[uid].error == ""
        p.stop(0)
        with p._lock:
            p.checkpoint.load()
            del p.checkpoint.claims[uid]
            p.checkpoint.save()
        assert layout.request(sid).exists()
        p.start()
        assert not layout.request(sid).exists()
        wait_for("its daemon gone", lambda: sid not in sup.slice_states(), 10)
    finally:
        p.stop(0)
        stop.set()
        sup.stop()
        shutil.rmtree(short, ignore_errors=True)


@pytest.mark.cluster
def test_a_slice_its_gpu_cannot_hold_is_refused(feed: Feed, dirs: dict[str, Path], session: Any,
                                                 make_claim: Any) -> None:
    """A 20 GiB slice of a shared GPU with 30 GiB free is prepared; a second one is refused while
    the first does not show in the reading (as the device plugin's Allocate refuses it), the
    first prepared again is not; once the first is unprepared the second fits, and once the
    reading shows the second in use it no longer counts as pending, but the GPU's 10 GiB free
    cannot hold a third."""
    feed.tick(gpu(0, memory_free_mib=30720), gpu(1))
    p = make(feed, dirs, session, shared_gpus="0", share_enforcement="none")
    p.start()
    sock = dirs["plugin"] / "dra.sock"

    def slice_claim() -> tuple[str, str, str]:
        name, uid = make_claim([{**result(D0), "shareID": str(uuidlib.uuid4()),
                                 "consumedCapacity": {"memory": "20Gi"}}])
        return "default", name, uid

    no_room = ("device " + D0 + ": GPU 0 {g} has {free} MiB free by its live reading, {pending} MiB of it "
               "prepared for slices not in use yet: a slice of 20480 MiB does not fit")
    try:
        a, b, c = slice_claim(), slice_claim(), slice_claim()
        first = prepare(sock, a)
        assert first.claims[a[2]].error == ""
        assert prepare(sock, b).claims[b[2]].error == no_room.format(g=G0, free=30720, pending=20480)
        assert not (dirs["cdi"] / cdi_file_name(b[2])).exists()
        assert prepare(sock, a) == first  # prepared again: from the checkpoint, not refused
        assert [s.claim_uid for s in p.slices[G0]] == [a[2]]

        assert unprepare(sock, a).claims[a[2]].error == ""
        assert p.slices == {}
        assert prepare(sock, b).claims[b[2]].error == ""
        assert [(s.claim_uid, s.mib, s.baseline_free_mib) for s in p.slices[G0]] == [(b[2], 20480, 30720)]

        feed.tick(gpu(0, memory_free_mib=10240), gpu(1))  # the second slice in use
        assert prepare(sock, c).claims[c[2]].error == no_room.format(g=G0, free=10240, pending=0)
        assert p.slices == {}
        assert (p.counts.prepare["prepared"], p.counts.prepare["refused"]) == (2, 2)
    finally:
        p.stop(0)


# -- issue 48: identity across a reboot that loses a GPU --------------------------------------


def checkpoint_claim(folder: Path, cdi: Path, uid: str, name: str, uuid: str) -> Path:
    """A claim prepared before the reboot on device ``name`` (GPU ``uuid``): its checkpoint
    entry and CDI spec as ``DraPlugin._record`` writes them; the spec's path."""
    cp = Checkpoint(folder)
    cp.load()
    spec = {"cdiVersion": "0.6.0", "kind": "gpu.omaticaya.io/claim", "devices": [
        {"name": f"{uid}-{name}", "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}}]}
    cp.claims[uid] = Entry("default", f"claim-{uid}", ({
        "request_names": ["gpu"], "pool_name": NODE, "device_name": name,
        "cdi_device_ids": [f"gpu.omaticaya.io/claim={uid}-{name}"], "uuid": uuid},), spec,
        cdi_file_name(uid))  # fmt: skip
    cp.save()
    cdi.mkdir(parents=True, exist_ok=True)
    path = cdi / cdi_file_name(uid)
    path.write_text(json.dumps(spec))
    return path


def test_after_a_reboot_a_claim_whose_gpu_is_gone_fails_alone(dirs: dict[str, Path]) -> None:
    """Two claims prepared before a reboot, on GPU 0 (G0) and GPU 1 (G1); the node comes back
    without G0, G1 renumbered 0. Prepared again in one call, G1's claim is answered (its name
    is G1's, whatever its index) and G0's fails with the reason: its CDI spec, gone, is not
    written again (before the fix, names were gpu-<index>: gpu-0 was answered from the
    checkpoint with G0's spec while kube-scheduler could give the new gpu-0, G1, to another
    claim)."""
    dirs["plugin"].mkdir(parents=True)
    checkpoint_claim(dirs["plugin"], dirs["cdi"], "u1", D1, G1)
    gone = checkpoint_claim(dirs["plugin"], dirs["cdi"], "u0", D0, G0)
    gone.unlink()
    feed = Feed()
    feed.tick(gpu(0, uuid=G1))  # G0 lost at boot: G1 is index 0 now
    p = make(feed, dirs)
    p.start()
    try:
        answer = prepare(dirs["plugin"] / "dra.sock", ("default", "claim-u1", "u1"),
                         ("default", "claim-u0", "u0"))  # fmt: skip
        assert answer.claims["u1"].error == ""
        assert [d.device_name for d in answer.claims["u1"].devices] == [D1]
        assert answer.claims["u0"].error == (
            f"device {D0!r} (GPU {G0}) prepared for this claim is no longer on this node (lost at "
            "a reboot, or repartitioned): not prepared again on another GPU")
        assert not gone.exists()
        assert (p.counts.prepare["repeated"], p.counts.prepare["refused"]) == (1, 1)
        feed.tick(gpu(0, uuid=G1), error="NVMLError_DriverNotLoaded")
        why = prepare(dirs["plugin"] / "dra.sock", ("default", "claim-u1", "u1")).claims["u1"].error
        assert why.startswith("cannot check the prepared claim's GPUs against the node's: NVML cannot be read")
    finally:
        p.stop(0)


def test_a_shared_index_that_names_another_gpu_is_reported(dirs: dict[str, Path]) -> None:
    """OMATICAYA_SHARED_GPUS=0 by index; at the last start index 0 was G0, now (G0 lost) it is
    G1: the gauge says so, the map of this start is written beside the checkpoint, and the next
    start reports nothing."""
    dirs["plugin"].mkdir(parents=True)
    save_indices(dirs["plugin"], {0: G0, 1: G1})
    feed = Feed()
    feed.tick(gpu(0, uuid=G1))
    p = make(feed, dirs, shared_gpus="0", share_enforcement="none")
    p.start()
    try:
        assert wait_for(lambda: p.indices_checked)
        assert p.counts.moved == (IndexMoved(0, G0, G1),)
        (gauge,) = [f for f in DraCounters(p.counts).collect() if f.name == "omaticaya_shared_gpu_index_moved"]
        assert [(s.labels, s.value) for s in gauge.samples] == [({"index": "0", "before": G0, "now": G1}, 1.0)]
        assert load_indices(dirs["plugin"]) == {0: G1}
        assert json.loads((dirs["plugin"] / INDICES_FILE).read_text()) == {"version": 1, "gpus": {"0": G1}}
    finally:
        p.stop(0)
    again = make(feed, dirs, shared_gpus="0", share_enforcement="none")
    assert again.check_indices() == ()


@pytest.mark.parametrize("text", ["{not json", '{"version": 2, "gpus": {}}', '{"version": 1, "gpus": []}', "[]"])
def test_an_unreadable_index_map_compares_nothing(dirs: dict[str, Path], text: str) -> None:
    dirs["plugin"].mkdir(parents=True)
    (dirs["plugin"] / INDICES_FILE).write_text(text)
    feed = Feed()
    feed.tick(gpu(0, uuid=G1))
    p = make(feed, dirs, shared_gpus="0", share_enforcement="none")
    assert p.check_indices() == () and p.check_indices() is None  # once per start
    assert load_indices(dirs["plugin"]) == {0: G1}


@pytest.mark.cluster
def test_a_moved_shared_index_is_an_event_on_the_node(feed: Feed, dirs: dict[str, Path], session: Any,
                                                       admin_client: Any) -> None:  # fmt: skip
    dirs["plugin"].mkdir(parents=True)
    save_indices(dirs["plugin"], {1: G0})
    p = make(feed, dirs, session, shared_gpus="1", share_enforcement="none")
    assert p.check_indices() == (IndexMoved(1, G0, G1),)
    events = api(admin_client, "GET", f"/api/v1/namespaces/default/events?fieldSelector="
                 f"involvedObject.kind%3DNode,involvedObject.name%3D{NODE},reason%3DSharedGpuIndexMoved")["items"]  # fmt: skip
    assert events, "no SharedGpuIndexMoved Event"
    ev = events[-1]
    assert ev["type"] == "Warning" and G0 in ev["message"] and G1 in ev["message"], ev
    assert "name GPUs by UUID" in ev["message"], ev


# -- the daemon: `omaticaya run` with OMATICAYA_DRA ------------------------------------------


@pytest.mark.cluster
def test_run_serves_the_dra_plugin_and_its_counters(dev_cluster: Any, make_node: Any,
                                                     dirs: dict[str, Path]) -> None:
    import signal
    import subprocess
    import sys
    import urllib.request

    from tests.helpers import H100_TRACE, free_port

    port = free_port()
    env = dict(dev_cluster.env(), NODE_NAME=make_node(), OMATICAYA_TRACE=str(H100_TRACE),
               OMATICAYA_SCHEDULE="@every 1s", OMATICAYA_METRICS_PORT=str(port),
               OMATICAYA_METRICS_ADDRESS="127.0.0.1", OMATICAYA_DRA="true",
               OMATICAYA_DRA_PLUGIN_DIR=str(dirs["plugin"]), OMATICAYA_DRA_REGISTRY_DIR=str(dirs["registry"]),
               OMATICAYA_DRA_CDI_DIR=str(dirs["cdi"]), OMATICAYA_DRA_DEV_ROOT=str(dirs["dev"]),
               PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "omaticaya_py", "run"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reg_sock = dirs["registry"] / "gpu.omaticaya.io-reg.sock"
    try:
        assert wait_for(reg_sock.is_socket, 30), "no registration socket"
        with channel(reg_sock) as ch:
            assert reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5).name == "gpu.omaticaya.io"
        with channel(dirs["plugin"] / "dra.sock") as ch:
            stream = h1_grpc.DRAResourceHealthStub(ch).NodeWatchResources(h1.NodeWatchResourcesRequest(), timeout=10)
            first = next(stream)
            stream.cancel()
        # h100-trace.json's one GPU, named by its UUID
        assert {d.device.device_name for d in first.devices} <= {device_name(H100_UUID)}
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'omaticaya_dra_prepare_total{result="prepared"} 0.0' in text
        assert 'omaticaya_dra_unprepare_total{result="unknown"} 0.0' in text
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert not reg_sock.exists() and not (dirs["plugin"] / "dra.sock").exists()
