"""A container's total over its slice, acted on within one tick; its pod evicted; a restarted MPS
daemon said to its pods (issue 47, items 2 and 3's Event), on the real API server.

An agent reads a node whose GPU 0 is shared, its MPS daemon up (a state file as ``omaticaya mps``
writes it); the kubelet's PodResources (a local gRPC server speaking its v1 API, as in
``tests/agent/test_sharing_overlimit.py``) says pod ``train-0``'s container ``trainer`` holds 8 units
(8,192 MiB) of GPU 0. The pod exists in the API server, with its UID in its processes' cgroups
(a host ``/proc`` in a temporary folder) and its container's ID in its status. Each test first
ticks with the processes under the slice (the pod is read from the API, so that the next tick
names its processes), then puts them over and ticks once:

- two processes of 6,000 MiB (each within the slice, the sum over): ``SliceOverLimitProcesses``
  on the pod, naming both pids and the sum, nothing on the Node; one of 12,000 MiB (escaped its
  daemon): ``MpsLimitNotEnforced`` on the pod and the Node; the gauge says which;
- the daemon restarted (a new pid, one more start in its state file): ``MpsDaemonRestarted`` on
  the pod, once;
- ``OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict``: the pod evicted through ``policy/v1`` Eviction
  after its Event; a PodDisruptionBudget that does not allow it: refused (429), counted, tried
  again each tick, evicted once the budget is gone; the UID precondition keeps a new pod of the
  same name.

And, without a cluster: the chart grants ``create`` on ``pods/eviction`` only with sharing on
and ``sharing.overLimitAction: evict``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.core.allocation.mps import DaemonState, slice_id, state_json
from omaticaya_py.core.allocation.slice_enforcement import (
    DAEMON_RESTARTED,
    NOT_ENFORCED,
    OVER_LIMIT_PROCESSES,
)
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.model.sharing import unit_ids
from omaticaya_py.core.model.snapshot import GpuProcess, NodeSnapshot
from omaticaya_py.kube import KubeNotFound, NodeClient
from omaticaya_py.kube.errors import KubeConflict, KubeTooManyRequests
from omaticaya_py.kube.pod_client import PodClient
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc
from tests.chart import RELEASE, render, template
from tests.conftest import ensure_namespace
from tests.helpers import gpu

RESOURCE = "omaticaya.io/gpu-memory"
CONTAINER_ID = "e" * 64
PIDS = (5101, 5102)
U0 = gpu(0).uuid
_namespaces = itertools.count()


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """PodResources v1 ``List``: pod ``namespace/train-0``, container ``trainer``, 8 units of
    GPU 0."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        devices = api_pb2.ContainerDevices(resource_name=RESOURCE, device_ids=unit_ids(U0, 8))
        return api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(
            name="train-0", namespace=self.namespace,
            containers=[api_pb2.ContainerResources(name="trainer", devices=[devices])],
        )])  # fmt: skip


class _Reader:
    """The node's reading, GPU 0 running ``mib`` (one figure per process of ``PIDS``)."""

    def __init__(self) -> None:
        self.mib: tuple[int, ...] = (3000, 3000)

    def read(self) -> NodeSnapshot:
        procs = tuple(GpuProcess(pid, m) for pid, m in zip(PIDS, self.mib, strict=False))
        g0 = gpu(0, processes=procs, process_count=len(procs))
        return NodeSnapshot(read_at=datetime.now(UTC), clock_s=time.monotonic(), gpus=(g0, gpu(1)))

    def close(self) -> None:
        pass


def _daemon(state_dir: Path, pid: int, starts: int) -> None:
    """GPU 0's probe daemon and the pod's slice's daemon (its 8 units) up, as ``omaticaya mps``
    writes their states."""
    state = DaemonState(U0, 0, "up", pid=pid, starts=starts, heartbeat_s=time.time())
    (state_dir / f"{U0}.json").write_text(state_json(state))
    sid = slice_id(",".join(sorted(unit_ids(U0, 8))))
    (state_dir / "slices").mkdir(exist_ok=True)
    (state_dir / "slices" / f"{sid}.state.json").write_text(
        state_json(replace(state, sid=sid)))  # fmt: skip


@pytest.fixture
def rig(dev_cluster, admin_api, make_node, tmp_path: Path) -> Iterator:
    """``make(action)`` -> the agent; and the namespace, the pod's UID, the Node, the state
    folder."""
    namespace = ensure_namespace(admin_api, f"slices-over-{os.getpid()}-{next(_namespaces)}")
    pod = admin_api.create_namespaced_pod(namespace, {
        "metadata": {"name": "train-0", "labels": {"app": "train"}},
        "spec": {"containers": [{"name": "trainer", "image": "pause"}]},
    })  # fmt: skip
    uid = pod.metadata.uid
    admin_api.patch_namespaced_pod_status("train-0", namespace, {"status": {
        "phase": "Running",  # a pending pod's eviction ignores PodDisruptionBudgets
        "containerStatuses": [{
            "name": "trainer", "containerID": f"containerd://{CONTAINER_ID}", "ready": True,
            "restartCount": 0, "image": "pause", "imageID": "", "state": {"running": {}},
        }],
    }})  # fmt: skip
    proc = tmp_path / "proc"
    pod_slice = "kubepods-burstable-pod" + uid.replace("-", "_") + ".slice"
    for pid in PIDS:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/{pod_slice}/"
            f"cri-containerd-{CONTAINER_ID}.scope\n"
        )
    state_dir = tmp_path / "mps-state"
    state_dir.mkdir()
    _daemon(state_dir, 100, 1)
    socket_path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(namespace), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    node = make_node()
    kube = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    agents: list[Agent] = []

    def make(action: str = "event") -> Agent:
        settings = load_settings(
            node_name=node, min_patch_interval_s=0, shared_gpus="0", share_enforcement="mps",
            device_plugin=True, mps_root=Path("/run/omaticaya/mps"), mps_state_dir=state_dir,
            slice_over_limit_action=action,
        )  # fmt: skip
        agent = Agent(settings, _Reader(), NodeApi(kube, lease=None),
                      attribution=Attribution(socket_path, proc))  # fmt: skip
        agents.append(agent)
        return agent

    try:
        yield make, namespace, uid, node, state_dir
    finally:
        for agent in agents:
            agent.attribution.close()
        server.stop(None)
        kube.close()
        admin_api.delete_namespace(namespace)


def _events(admin_api, namespace: str, reason: str, kind: str = "Pod") -> list:
    return admin_api.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},reason={reason}"
    ).items


def _warmed(agent: Agent) -> _Reader:
    """The first tick, under the slice: the pod is read from the API (its processes are named
    from the next tick on)."""
    agent.tick()
    assert agent.slices is not None and agent.slices.names.known
    assert agent.events_posted == {}
    return agent.reader  # type: ignore[return-value]


def _gauge(agent: Agent, reason: str) -> float | None:
    registry = CollectorRegistry()
    agent_registry(agent, registry)
    enforced = "true" if reason == NOT_ENFORCED else "false"
    return registry.get_sample_value(
        "omaticaya_slice_over_limit",
        {"gpu": "0", "uuid": U0, "enforced": enforced, "reason": reason},
    )


OVER_CASES = [
    # (id, each process's MiB, the pod's Event, on the Node too)
    ("several-within", (6000, 6000), OVER_LIMIT_PROCESSES, False),
    ("one-escaped", (12000,), NOT_ENFORCED, True),
]


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("mib", "reason", "on_node"), [c[1:] for c in OVER_CASES], ids=[c[0] for c in OVER_CASES]
)
def test_over_its_slice_the_event_comes_within_one_tick(rig, admin_api, mib, reason, on_node):
    make, namespace, uid, node, _state_dir = rig
    agent = make()
    reader = _warmed(agent)
    reader.mib = mib
    agent.tick()  # one tick over: said now
    (event,) = _events(admin_api, namespace, reason)
    assert event.type == "Warning" and event.involved_object.uid == uid
    if reason == OVER_LIMIT_PROCESSES:
        assert event.message.startswith(
            f"container trainer holds 12000 MiB on GPU 0 ({U0}) in 2 processes (pid {PIDS[0]}: "
            f"6000 MiB, pid {PIDS[1]}: 6000 MiB), over its slice of 8192 MiB (8 units of "
            f"{RESOURCE}) in sum"
        )
    on_the_node = admin_api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},reason={reason}"
    ).items
    assert len(on_the_node) == (1 if on_node else 0)
    assert _gauge(agent, reason) == 1
    agent.tick()  # once per episode; the default action evicts nothing
    assert len(_events(admin_api, namespace, reason)) == 1
    assert admin_api.read_namespaced_pod("train-0", namespace).metadata.uid == uid


@pytest.mark.cluster
def test_a_restarted_daemon_is_said_to_the_pod_once(rig, admin_api):
    make, namespace, uid, _node, state_dir = rig
    agent = make()
    _warmed(agent)
    agent.tick()
    assert _events(admin_api, namespace, DAEMON_RESTARTED) == []
    _daemon(state_dir, 200, 2)  # killed and restarted by the supervisor: a new pid, start 2
    agent.mps._cache.clear()  # type: ignore[union-attr]  # read now, not in a second
    agent.tick()
    (event,) = _events(admin_api, namespace, DAEMON_RESTARTED)
    assert event.type == "Warning" and event.involved_object.uid == uid
    assert "lost their MPS server and must be restarted" in event.message
    agent.mps._cache.clear()  # type: ignore[union-attr]
    agent.tick()
    assert len(_events(admin_api, namespace, DAEMON_RESTARTED)) == 1
    assert agent.events_posted[DAEMON_RESTARTED] == 1


@pytest.mark.cluster
def test_evict_the_pod_after_its_event(rig, admin_api):
    make, namespace, _uid, _node, _state_dir = rig
    agent = make("evict")
    reader = _warmed(agent)
    reader.mib = (6000, 6000)
    agent.tick()
    (event,) = _events(admin_api, namespace, OVER_LIMIT_PROCESSES)
    assert "the pod is evicted (OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict" in event.message
    assert agent.slices is not None and agent.slices.evictions == {"evicted": 1}
    with pytest.raises(ApiException) as gone:  # not bound to a node: deleted at once
        admin_api.read_namespaced_pod("train-0", namespace)
    assert gone.value.status == 404


@pytest.mark.cluster
def test_a_disruption_budget_puts_the_eviction_off_until_it_allows_it(rig, admin_api, admin_client):
    make, namespace, uid, _node, _state_dir = rig
    policy = k8s.PolicyV1Api(admin_client)
    policy.create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": "train"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
    })  # fmt: skip
    agent = make("evict")
    reader = _warmed(agent)
    reader.mib = (6000, 6000)
    agent.tick()
    agent.tick()
    assert agent.slices is not None and agent.slices.evictions == {"blocked": 2}
    assert admin_api.read_namespaced_pod("train-0", namespace).metadata.uid == uid
    assert len(_events(admin_api, namespace, OVER_LIMIT_PROCESSES)) == 1
    registry = agent_registry(agent, CollectorRegistry())
    assert registry.get_sample_value("omaticaya_slice_evictions_total", {"result": "blocked"}) == 2
    policy.delete_namespaced_pod_disruption_budget("train", namespace)
    agent.tick()
    assert agent.slices.evictions == {"blocked": 2, "evicted": 1}
    with pytest.raises(ApiException):
        admin_api.read_namespaced_pod("train-0", namespace)


@pytest.mark.cluster
def test_the_eviction_call(rig, admin_api, admin_client, dev_cluster):
    """``PodClient.evict_pod`` on its own: the UID precondition (another pod of the name now:
    409, nothing evicted), a pod gone (404), a budget that does not allow it (429, one request:
    no retries within the call)."""
    _make, namespace, uid, node, _state_dir = rig
    kube = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    try:
        pods = PodClient(kube.session, node)
        with pytest.raises(KubeConflict):
            pods.evict_pod(namespace, "train-0", "00000000-0000-0000-0000-000000000000")
        assert admin_api.read_namespaced_pod("train-0", namespace).metadata.uid == uid
        with pytest.raises(KubeNotFound):
            pods.evict_pod(namespace, "no-such-pod", uid)
        with pytest.raises(ValueError, match="no UID"):
            pods.evict_pod(namespace, "train-0", "")
        k8s.PolicyV1Api(admin_client).create_namespaced_pod_disruption_budget(namespace, {
            "metadata": {"name": "train"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
        })  # fmt: skip
        before = kube.session.requests[("create", "429")]
        with pytest.raises(KubeTooManyRequests):
            pods.evict_pod(namespace, "train-0", uid)
        assert kube.session.requests[("create", "429")] == before + 1
    finally:
        kube.close()


# --- the chart's grant --------------------------------------------------------------------------

GRANT_CASES = [
    # (id, values, pods/eviction granted)
    ("sharing-default", {"sharing": {"gpus": "all"}}, False),
    ("sharing-evict", {"sharing": {"gpus": "all", "overLimitAction": "evict"}}, True),
    ("no-sharing-evict", {"sharing": {"overLimitAction": "evict"}}, False),
]


@pytest.mark.parametrize(
    ("values", "granted"), [c[1:] for c in GRANT_CASES], ids=[c[0] for c in GRANT_CASES]
)
def test_the_chart_grants_evictions_only_with_evict(helm, values, granted):
    docs = render(helm, {**values, "devicePlugin": True})
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == RELEASE)
    evictions = [r for r in role["rules"] if "pods/eviction" in r["resources"]]
    assert evictions == ([{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
                         if granted else [])  # fmt: skip


def test_the_chart_refuses_another_action(helm):
    proc = template(helm, {"sharing": {"overLimitAction": "kill"}}, check=False)
    assert proc.returncode != 0 and "overLimitAction" in proc.stderr
