"""The kubelet's PodResources API through ``kube.podresources.PodResourcesClient``: its errors
and its answer's shape on a local gRPC server, then on the dev cluster's real kubelet (1.37.2) with
our device plugin (``omaticaya device-plugin`` replaying ``tests/data/multi-gpu-trace.json``,
8 GPUs): a pod holding a GPU appears with its namespace, name, container and a trace UUID, its
container's PID resolves through its cgroup to the pod's UID (``sources.procs``), and the pod
leaves the list once deleted.

The kubelet serves PodResources v1 on ``<--root-dir>/pod-resources/kubelet.sock`` (feature
GA since 1.28; 1.37 lists a container's devices one entry per device: the client merges them). A pod's cgroup names its UID only
with ``--cgroups-per-qos=true`` (the kubelet's default); with ``false``, containerd puts a
container in ``/k8s.io/<id>`` and the PID check skips, saying so.
The kubelet tests need Linux and root, and skip when another kubelet runs on this machine (see
``tests/kubelet.py``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.core.rules.attribution import ContainerDevices, PodRef
from omaticaya_py.kube.podresources import (
    DEFAULT_SOCKET,
    PodResourcesAbsent,
    PodResourcesCallFailed,
    PodResourcesClient,
)
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.procs import read_pod_refs
from omaticaya_py.sources.replay import TraceReader
from tests.devcluster import REPO_ROOT, DevCluster
from tests.helpers import MULTI_TRACE as TRACE
from tests.kubelet import (
    default_service_account,
    delete_pods,
    kubelet_node,
    kubelet_pod,
    stop_plugin,
)
from tests.waiting import wait_for

# the machine's one kubelet: these tests run on one pytest-xdist worker (tests/conftest.py)
pytestmark = pytest.mark.kubelet

UUIDS = {d["uuid"] for d in json.loads(TRACE.read_text())["devices"]}
RESOURCE = "nvidia.com/gpu"
POD = "holds-a-gpu"


# --- the client on its own ----------------------------------------------------------------------


def test_default_socket_is_the_kubelets() -> None:
    assert DEFAULT_SOCKET == Path("/var/lib/kubelet/pod-resources/kubelet.sock")


def test_absent_socket(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "pod-resources" / "kubelet.sock")
    with pytest.raises(PodResourcesAbsent, match="no kubelet PodResources socket at"):
        client.list()
    (tmp_path / "file.sock").write_text("")
    with pytest.raises(PodResourcesAbsent, match="is not a socket"):
        PodResourcesClient(tmp_path / "file.sock").list()


def test_socket_nobody_answers_is_a_failed_call(tmp_path: Path) -> None:
    """A socket file left by a stopped kubelet: the call fails, UNAVAILABLE."""
    path = tmp_path / "kubelet.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens
    with PodResourcesClient(path, timeout_s=2) as client, pytest.raises(PodResourcesCallFailed) as err:
        client.list()
    assert err.value.code == "UNAVAILABLE"
    assert err.value.socket_path == path
    assert not isinstance(err.value, PodResourcesAbsent)


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.calls = 0

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        self.calls += 1
        gpu = api_pb2.ContainerDevices(
            resource_name=RESOURCE,
            device_ids=["GPU-a", "GPU-b"],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)]),
        )
        nic = api_pb2.ContainerDevices(resource_name="example.com/nic", device_ids=["eth1"])
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name="train",
                    namespace="ml",
                    containers=[
                        api_pb2.ContainerResources(name="main", devices=[gpu, nic], cpu_ids=[2, 3]),
                        api_pb2.ContainerResources(name="sidecar"),
                    ],
                ),
                api_pb2.PodResources(name="idle", namespace="default"),
            ]
        )


def test_list_flattens_pods_containers_and_devices(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    lister = _Lister()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    expected = (
        ContainerDevices("ml", "train", "main", RESOURCE, ("GPU-a", "GPU-b")),
        ContainerDevices("ml", "train", "main", "example.com/nic", ("eth1",)),
    )
    try:
        with PodResourcesClient(path, timeout_s=5) as client:
            assert client.list() == expected
            channel = client._channel
            assert channel is not None
            # the channel is kept between calls, and each list() asks the server again
            assert client.list() == expected
            assert client._channel is channel
            assert lister.calls == 2
            # close() drops it; the next list() opens a new one that answers the same
            client.close()
            assert client._channel is None
            assert client.list() == expected
            assert client._channel is not None and client._channel is not channel
            assert lister.calls == 3
    finally:
        server.stop(None)


# --- on the real kubelet ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningPod:
    uid: str
    container_id: str  # without the runtime's "containerd://"
    pid: int  # the container's main process, in the host's PID namespace


@pytest.fixture(scope="module")
def kubelet(dev_cluster: DevCluster) -> Iterator[str]:
    yield from kubelet_node(dev_cluster)


@pytest.fixture(scope="module")
def pod_resources(kubelet: str, dev_cluster: DevCluster) -> Iterator[PodResourcesClient]:
    path = dev_cluster.state_dir / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
    with PodResourcesClient(path) as client:
        # the Node can be Ready (from an earlier kubelet of this cluster) and the socket file
        # there (left by it) before this kubelet serves PodResources: wait until it answers
        def answers() -> bool:
            try:
                client.list()
            except PodResourcesCallFailed:
                return False
            return True

        wait_for("the kubelet to serve PodResources", answers, 30)
        yield client


@pytest.fixture(scope="module")
def plugin(kubelet: str, admin_api) -> Iterator[subprocess.Popen]:
    """Our device plugin serving the trace's 8 GPUs, registered and in the Node's capacity."""
    log = Path(tempfile.mkdtemp(prefix="omaticaya-pr-")) / "device-plugin.log"
    env = dict(os.environ, OMATICAYA_METRICS_PORT="0", PYTHONPATH=str(REPO_ROOT))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omaticaya_py", "device-plugin", "--trace", str(TRACE)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def registered() -> bool:
            assert proc.poll() is None, f"plugin exited:\n{log.read_text(errors='replace')}"
            return "device plugin registered" in log.read_text(errors="replace")

        wait_for("the device plugin's registration", registered, 60)
        wait_for("8 GPUs on the Node", lambda: _allocatable(admin_api, kubelet) == 8, 30)
        yield proc
    finally:
        stop_plugin(proc)


def _allocatable(admin_api, node: str) -> int:
    return int((admin_api.read_node(node).status.allocatable or {}).get(RESOURCE, "0"))


@pytest.fixture(scope="module")
def gpu_pod(admin_api, kubelet: str, plugin) -> Iterator[RunningPod]:
    """A running pod holding one GPU. It shares the host's PID namespace only to write its own
    host PID to a host folder; the test deletes it (``test_deleted_pod_leaves_the_list``)."""
    default_service_account(admin_api)
    out = Path(tempfile.mkdtemp(prefix="omaticaya-pr-out-"))
    # "$$$$": the kubelet turns "$$" into "$" (its $(VAR) escape), the shell "$$" into its PID
    body = kubelet_pod(POD, kubelet, "echo $$$$ > /out/pid; exec sleep 3600", {RESOURCE: "1"},
                       out, container="cuda", host_pid=True, out_type="Directory")  # fmt: skip
    admin_api.create_namespaced_pod("default", body)
    try:

        def running() -> RunningPod | None:
            pod = admin_api.read_namespaced_pod(POD, "default")
            assert pod.status.phase != "Failed", f"{pod.status.reason} {pod.status.message}"
            pid_file = out / "pid"
            if pod.status.phase != "Running" or not pid_file.is_file():
                return None
            pid = pid_file.read_text().strip()
            (status,) = pod.status.container_statuses
            if not pid or not status.container_id:
                return None
            return RunningPod(pod.metadata.uid, status.container_id.split("://", 1)[-1], int(pid))

        yield wait_for(f"pod {POD} running", running, 60)
    finally:
        delete_pods(admin_api, [POD])


def _holders(client: PodResourcesClient) -> list[ContainerDevices]:
    return [d for d in client.list() if (d.namespace, d.pod) == ("default", POD)]


@pytest.mark.cluster
@pytest.mark.slow
def test_kubelet_serves_pod_resources(pod_resources: PodResourcesClient) -> None:
    assert pod_resources.socket_path.is_socket()
    assert isinstance(pod_resources.list(), tuple)


@pytest.mark.cluster
@pytest.mark.slow
def test_pod_holding_a_gpu_is_listed(pod_resources: PodResourcesClient, gpu_pod: RunningPod) -> None:
    (held,) = wait_for(f"{POD} in PodResources", lambda: _holders(pod_resources), 20)
    assert (held.container, held.resource_name) == ("cuda", RESOURCE)
    assert len(held.device_ids) == 1 and held.device_ids[0] in UUIDS


@pytest.mark.cluster
@pytest.mark.slow
def test_container_pid_resolves_to_its_pod(gpu_pod: RunningPod) -> None:
    cgroup = Path(f"/proc/{gpu_pod.pid}/cgroup").read_text()
    if "kubepods" not in cgroup:
        pytest.skip(
            "the kubelet runs without per-pod cgroups (--cgroups-per-qos=false): the "
            f"container's cgroup names no pod ({cgroup.splitlines()[0]})"
        )
    assert read_pod_refs([gpu_pod.pid]) == {gpu_pod.pid: PodRef(gpu_pod.uid, gpu_pod.container_id)}


@pytest.fixture(scope="module")
def agent(pod_resources: PodResourcesClient) -> Iterator[Agent]:
    """An agent over the plugin's trace that asks this kubelet who holds its GPUs (no host
    /proc here: holders only)."""
    from omaticaya_py.core.config.settings import load_settings

    edge = Attribution(pod_resources.socket_path, None)
    settings = load_settings(node_name="n", min_patch_interval_s=0)
    yield Agent(
        settings, TraceReader(TRACE, at_s=1.0), NodeApi(None, dry_run=True), attribution=edge
    )
    edge.close()


def _held_series(agent: Agent) -> set[tuple[str, ...]]:
    """One tick, then the (uuid, pod, namespace, container) of every used-memory series with a
    pod on the agent's /metrics collector."""
    agent.tick()
    registry = CollectorRegistry()
    agent_registry(agent, registry)
    family = registry.collect()
    return {
        (s.labels["uuid"], s.labels["pod"], s.labels["namespace"], s.labels["container"])
        for f in family
        if f.name == "omaticaya_gpu_memory_used_bytes"
        for s in f.samples
        if s.labels["pod"]
    }


@pytest.mark.cluster
@pytest.mark.slow
def test_agent_publishes_the_pod_holding_its_gpu(
    agent: Agent, pod_resources: PodResourcesClient, gpu_pod: RunningPod
) -> None:
    (held,) = wait_for(f"{POD} in PodResources", lambda: _holders(pod_resources), 20)
    (uuid,) = held.device_ids
    assert _held_series(agent) == {(uuid, POD, "default", "cuda")}
    # and the telemetry names it
    assert agent.cache.last is not None
    doc = json.loads(agent.cache.last.desired.annotations["omaticaya.io/telemetry"])
    (gpu,) = [g for g in doc["gpus"] if g["uuid"] == uuid]
    (holder,) = gpu["pods"]
    assert (holder["namespace"], holder["pod"], holder["container"]) == ("default", POD, "cuda")
    # its memory: 0 on an idle trace GPU, unsaid where the trace's processes cannot be placed
    assert holder.get("memory_used_mib", 0) == 0


@pytest.mark.cluster
@pytest.mark.slow
def test_deleted_pod_leaves_the_list(
    admin_api, agent: Agent, pod_resources: PodResourcesClient, gpu_pod: RunningPod
) -> None:
    wait_for(f"{POD} in PodResources", lambda: _holders(pod_resources), 20)
    admin_api.delete_namespaced_pod(POD, "default", grace_period_seconds=0)
    wait_for(f"{POD} gone from PodResources", lambda: not _holders(pod_resources), 30)
    assert _held_series(agent) == set()  # gone from the metrics at the next tick
