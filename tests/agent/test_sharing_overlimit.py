"""Over-use of a shared GPU's slice, seen (issue 25, item 5), on the real API server.

An agent replays the multi-GPU trace held still, GPU 0 shared (``OMATICAYA_SHARED_GPUS=0``) and
running a process of 10,240 MiB in a pod; the kubelet's PodResources (a local gRPC server
speaking its v1 API, as in ``tests/agent/test_attribution_publish.py``) says that pod's container
holds 8 memory units of GPU 0 (8,192 MiB). The pod exists in the API server, with its real UID
in the process's cgroup and its container's ID in its status: the agent names the process
through the API and finds the container over its slice.

What must come out: one ``GpuMemoryOverLimit`` Warning Event on the pod (its UID set, so that
``kubectl describe pod`` shows it), none more while the episode lasts, none when the slice
grows to 12 units, a second one when it is back to 8; the telemetry on the Node marks GPU 0
``shared`` and the pod ``over_limit`` with its ``limit_mib``; the metrics carry
``omaticaya_pod_gpu_memory_limit_bytes`` and the pod's own used bytes beside the GPU's; a unit
naming no GPU of the node is skipped and counted."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.agent.events import OVER_LIMIT
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.model.sharing import unit_ids
from omaticaya_py.kube import NodeClient
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.agent.attribution_publish_support import (
    CONTAINER_ID,
    IN_POD_MIB,
    IN_POD_PID,
    host_proc,
    trace_with_processes,
)
from tests.conftest import ensure_namespace

pytestmark = pytest.mark.cluster

P = "omaticaya.io/"
MIB = 1024 * 1024
RESOURCE = "omaticaya.io/gpu-memory"
STRANGER = "GPU-ffffffff-0000-0000-0000-000000000000"
_namespaces = itertools.count()


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """PodResources v1 ``List``: pod ``namespace/infer-0``, container ``server``, ``units`` memory
    units of ``gpu`` (changeable between calls), and one unit of a GPU on no node."""

    def __init__(self, namespace: str, gpu: str, units: int) -> None:
        self.namespace, self.gpu, self.units = namespace, gpu, units

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        devices = api_pb2.ContainerDevices(
            resource_name=RESOURCE, device_ids=[*unit_ids(self.gpu, self.units), f"{STRANGER}::0"]
        )
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name="infer-0",
                    namespace=self.namespace,
                    containers=[api_pb2.ContainerResources(name="server", devices=[devices])],
                )
            ]
        )


@pytest.fixture
def shared_rig(dev_cluster, admin_api, make_node, tmp_path: Path) -> Iterator[tuple]:
    namespace = ensure_namespace(admin_api, f"slices-{os.getpid()}-{next(_namespaces)}")
    pod = admin_api.create_namespaced_pod(namespace, {
        "metadata": {"name": "infer-0"},
        "spec": {"containers": [{"name": "server", "image": "pause"}]},
    })  # fmt: skip
    uid = pod.metadata.uid
    admin_api.patch_namespaced_pod_status("infer-0", namespace, {"status": {"containerStatuses": [{
        "name": "server", "containerID": f"containerd://{CONTAINER_ID}", "ready": True,
        "restartCount": 0, "image": "pause", "imageID": "", "state": {"running": {}},
    }]}})  # fmt: skip
    trace, uuids = trace_with_processes(tmp_path)
    proc = host_proc(tmp_path)
    pod_slice = "kubepods-burstable-pod" + uid.replace("-", "_") + ".slice"
    (proc / str(IN_POD_PID) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/{pod_slice}/cri-containerd-{CONTAINER_ID}.scope\n"
    )
    kubelet = _Kubelet(namespace, uuids[0], 8)
    socket_path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    node = make_node()
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    settings = load_settings(node_name=node, min_patch_interval_s=0, shared_gpus="0")
    agent = Agent(settings, TraceReader(trace, at_s=1.0), NodeApi(client, lease=None),
                  attribution=Attribution(socket_path, proc))  # fmt: skip
    try:
        yield agent, kubelet, namespace, uid, uuids, node
    finally:
        agent.attribution.close()
        server.stop(None)
        client.close()
        admin_api.delete_namespace(namespace)


def test_over_limit_event_once_per_episode_telemetry_and_metrics(shared_rig, admin_api):
    agent, kubelet, namespace, uid, uuids, node = shared_rig

    def events():
        return admin_api.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name=infer-0,reason={OVER_LIMIT}"
        ).items

    agent.tick()  # the pod is read from the API; its processes are named from the next tick
    assert events() == []
    for _ in range(3):
        result = agent.tick()
    (event,) = events()
    assert event.type == "Warning" and event.involved_object.kind == "Pod"
    assert event.involved_object.uid == uid  # `kubectl describe pod` matches on it
    assert f"container server holds {IN_POD_MIB} MiB on GPU 0" in event.message
    assert "over its slice of 8192 MiB (8 units of omaticaya.io/gpu-memory)" in event.message
    assert agent.events_posted[OVER_LIMIT] == 1

    doc = json.loads(admin_api.read_node(node).metadata.annotations[P + "telemetry"])
    gpu0 = doc["gpus"][0]
    assert doc["share_unit_mib"] == 1024 and gpu0["shared"] is True and gpu0["share_units"] == 79
    assert "shared" not in doc["gpus"][1]
    assert gpu0["pods"] == [{
        "namespace": namespace, "pod": "infer-0", "container": "server", "limit_mib": 8192,
        "memory_used_mib": IN_POD_MIB, "over_limit": True,
    }]  # fmt: skip
    labels = result.desired.labels
    # GPU 0 is not a whole GPU any more: 7 of the trace's 8 GPUs count as whole
    assert labels[P + "gpu.count"] == "8"
    assert int(labels[P + "gpu.healthy-count"]) == 7
    # the largest slice: GPU 0's 71 units not held, or its live free memory, whichever is less
    gpu0_free = result.snapshot.gpus[0].memory_free_mib
    assert labels[P + "gpu.shared.memory.free-mib"] == str(min(gpu0_free, 71 * 1024) // 1024 * 1024)

    registry = CollectorRegistry()
    agent_registry(agent, registry)
    key = {"gpu": "0", "uuid": uuids[0], "pod": "infer-0", "namespace": namespace,
           "container": "server"}  # fmt: skip
    assert registry.get_sample_value("omaticaya_pod_gpu_memory_limit_bytes", key) == 8192 * MIB
    assert registry.get_sample_value("omaticaya_pod_gpu_memory_used_bytes", key) == IN_POD_MIB * MIB
    assert registry.get_sample_value("omaticaya_gpu_memory_used_bytes", key) is not None
    assert registry.get_sample_value(
        "omaticaya_pod_resources_skipped_total", {"reason": "unknown-gpu"}
    ) == agent.attribution.skipped["unknown-gpu"] >= 4
    assert registry.get_sample_value(
        "omaticaya_events_total", {"reason": OVER_LIMIT}
    ) == 1

    kubelet.units = 12  # the slice is resized (a new pod in real life): under its limit
    agent.tick()
    agent.tick()
    assert len(events()) == 1
    doc = json.loads(admin_api.read_node(node).metadata.annotations[P + "telemetry"])
    assert "over_limit" not in doc["gpus"][0]["pods"][0]
    kubelet.units = 8  # over again: a new episode
    agent.tick()
    agent.tick()
    assert len(events()) == 2
    assert agent.events_posted[OVER_LIMIT] == 2


def test_a_slice_pod_gone_from_the_api_is_forgotten_and_nothing_is_said(shared_rig, admin_api):
    """The pod is deleted from the API while the kubelet still lists it: its processes cannot be
    named, so its use is unknown and no Event is posted; the agent goes on."""
    agent, _kubelet, namespace, _uid, _uuids, _node = shared_rig
    admin_api.delete_namespaced_pod("infer-0", namespace, grace_period_seconds=0)
    for _ in range(3):
        result = agent.tick()
    assert agent.events_posted[OVER_LIMIT] == 0
    assert agent.slices.names.known == {}
    doc = json.loads(result.desired.annotations[P + "telemetry"])
    assert doc["gpus"][0]["pods"] == [
        {"namespace": namespace, "pod": "infer-0", "container": "server", "limit_mib": 8192}
    ]
