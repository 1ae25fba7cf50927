"""The telemetry follows what no label shows: exact free memory and the pods holding each GPU.

Labels move in 1,024 MiB steps and, in Lease mode, the telemetry annotation used to be
rewritten only with a label change: NVML free 10,900 -> 10,300 MiB left it at 10,900 for good,
and a pod that started on a GPU never reached it. Now (``core.publish.budget.telemetry_change``, applied
by ``agent/node_writer.py``) free memory down by more than ``OMATICAYA_TELEMETRY_FREE_DROP_MIB`` (256)
or a new holder rewrites it at once; the same rise or a holder leaving waits like any change for
the better (the write budget's interval, and calm).

Pure tables for the rule and the marks; then agents on the real kube-apiserver replaying small
traces (Lease mode, a hand-driven clock), with the extender's decision taken from the Node they
wrote, and the holders from a PodResources server speaking the kubelet's v1 API (the real kubelet
is in ``tests/agent/test_podresources_kubelet.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from omaticaya_py.agent import Agent
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.core.model.snapshot import MigReading
from omaticaya_py.core.publish.budget import BETTER, WORSE, UnitMark, telemetry_change
from omaticaya_py.core.publish.render_telemetry import (
    TelemetryOptions,
    published_marks,
    telemetry_document,
    telemetry_marks,
)
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.schema import Telemetry
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc
from tests.conftest import node_metadata
from tests.core.publish.telemetry_rewrite_support import (  # the names moved out, for this file's tests
    MIB,  # noqa: F401
    lease_agent,  # noqa: F401
    small_trace,  # noqa: F401
    uuid_of,  # noqa: F401
)
from tests.helpers import Clock, evaluate, gpu, snapshot
from tests.kube.lease_cluster_support import namespace  # noqa: F401  (fixture)

P = "omaticaya.io/"


def mark(free: int | None, *pods: str) -> UnitMark:
    return UnitMark(free, frozenset(("ml", p, "main") for p in pods))


G0, G1, MIG = (0, -1), (1, -1), (1, 0)

CHANGE_CASES = [
    # (id, published, now, drop_mib, expected)
    ("nothing moved", {G0: mark(10900)}, {G0: mark(10900)}, 256, None),
    ("a drop within the threshold", {G0: mark(10900)}, {G0: mark(10644)}, 256, None),
    ("the issue's drop, 600 MiB", {G0: mark(10900)}, {G0: mark(10300)}, 256, WORSE),
    ("the same rise waits", {G0: mark(10300)}, {G0: mark(10900)}, 256, BETTER),
    ("one GPU down, another up: worse wins", {G0: mark(10900), G1: mark(100)},
     {G0: mark(10300), G1: mark(9000)}, 256, WORSE),
    ("a MIG device's drop", {G1: mark(0), MIG: mark(9000)}, {G1: mark(0), MIG: mark(8000)}, 256, WORSE),
    ("free memory no longer read", {G0: mark(10900)}, {G0: mark(None)}, 256, WORSE),
    ("a unit gone", {G0: mark(10900), G1: mark(5)}, {G0: mark(10900)}, 256, WORSE),
    ("a new unit with free memory", {G0: mark(10900)}, {G0: mark(10900), G1: mark(5000)}, 256, BETTER),
    ("a new holder, no memory yet", {G0: mark(10900)}, {G0: mark(10900, "a")}, 256, WORSE),
    ("a holder replaced by another", {G0: mark(10900, "a")}, {G0: mark(10900, "b")}, 256, WORSE),
    ("a holder left", {G0: mark(10900, "a", "b")}, {G0: mark(10900, "a")}, 256, BETTER),
    ("threshold 0: free memory not followed", {G0: mark(10900)}, {G0: mark(1)}, 0, None),
    ("threshold 0: holders still are", {G0: mark(10900)}, {G0: mark(1, "a")}, 0, WORSE),
    ("nothing published (an unreadable annotation)", {}, {G0: mark(10900)}, 256, BETTER),
]  # fmt: skip


@pytest.mark.parametrize(("published", "now", "drop_mib", "expected"),
                         [c[1:] for c in CHANGE_CASES], ids=[c[0] for c in CHANGE_CASES])  # fmt: skip
def test_telemetry_change(published, now, drop_mib, expected):
    assert telemetry_change(published, now, drop_mib) == expected


def _holding(uuid: str, *pods: str) -> GpuAttribution:
    return GpuAttribution(
        uuid, holders=tuple(ContainerDevices("ml", p, "main", "nvidia.com/gpu", (uuid,)) for p in pods)
    )


def _mig_gpu() -> Any:
    migs = tuple(
        MigReading(index=i, uuid=f"MIG-{i}", profile="3g.40gb", gpu_instance_id=i + 1,
                   memory_total_mib=40192, memory_free_mib=free, memory_used_mib=40192 - free,
                   process_count=0)  # fmt: skip
        for i, free in enumerate((40000, 12345))
    )
    return gpu(1, mig_enabled=True, mig_devices=migs, utilization_pct=None)


@pytest.mark.parametrize(
    ("gpus", "attribution"),
    [
        ((gpu(0, memory_free_mib=10900),), None),
        ((gpu(0, memory_free_mib=10900), gpu(1, memory_free_mib=None)), {}),
        ((gpu(0), gpu(1)), {gpu(0).uuid: _holding(gpu(0).uuid, "a", "b")}),
        ((gpu(0), _mig_gpu()), {"MIG-1": _holding("MIG-1", "m")}),
    ],
    ids=["one GPU", "an unreadable GPU", "two holders", "MIG devices and their holders"],
)
def test_marks_of_a_reading_are_those_of_its_published_telemetry(gpus, attribution):
    snap = snapshot(*gpus)
    health, _ = evaluate(snap)
    doc, problem = Telemetry.parse(telemetry_document(snap, health, TelemetryOptions(attribution=attribution)).to_json())
    assert problem is None and doc is not None
    assert published_marks(doc) == telemetry_marks(snap, attribution)
    assert telemetry_marks(snap, attribution)  # not vacuous


# --------------------------------------------------------------- on the real API server ----







def published(admin_api, node: str) -> list[dict[str, Any]]:
    """The GPUs of the telemetry on the Node, as the API server has it."""
    return json.loads(node_metadata(admin_api, node)[1][P + "telemetry"])["gpus"]


def verdict(admin_api, node: str, need_mib: int, count: int = 1) -> str | None:
    """The extender's filter on the Node as the API server has it (the wall clock)."""
    from tests.scheduler.exact_free_support import extender_verdict

    labels, annotations = node_metadata(admin_api, node)
    return extender_verdict(labels, annotations, need_mib, count, now=None)


def tick_at(agent: Agent, clock: Clock, t: float):
    clock.t = t
    return agent.tick()


@pytest.mark.cluster
def test_the_issues_drop_is_published_at_once_and_refused(
    dev_cluster, admin_api, make_node, namespace, tmp_path  # noqa: F811
):
    """NVML free 10,900 -> 10,300 MiB on one GPU, Lease mode, defaults: the drop changes no
    label (10,240 either way) yet is on the Node at once, alone; a pod asking 10,500 is refused
    by the extender; with the rule off (threshold 0, the old behaviour) the telemetry stays at
    10,900 and the extender still refuses it, by the labels."""
    trace = small_trace(tmp_path, [(0.0, (10900,)), (10.0, (10300,))], "drop")
    results = {}
    for drop_mib in (256, 0):
        node = make_node()
        clock = Clock(0.0)
        agent = lease_agent(dev_cluster.kubeconfig, node, namespace, trace, clock,
                            telemetry_free_drop_mib=drop_mib)  # fmt: skip
        assert tick_at(agent, clock, 0.0).sent  # the first patch
        labels = node_metadata(admin_api, node)[0]
        assert labels[P + "gpu-0.memory.free-mib"] == "10240"
        assert [g["memory_free_mib"] for g in published(admin_api, node)] == [10900]
        result = tick_at(agent, clock, 11.0)  # 11 s after the last patch, under the 30 s budget
        results[drop_mib] = result
        assert node_metadata(admin_api, node)[0] == labels  # no label changed
        free = [g["memory_free_mib"] for g in published(admin_api, node)]
        verdict_10500 = verdict(admin_api, node, 10500)
        assert verdict_10500 is not None and "10500 MiB" in verdict_10500
        assert verdict(admin_api, node, 10240) is None
        if drop_mib:
            assert result.sent and free == [10300]
            assert set(result.patch["metadata"]) == {"annotations"}  # the telemetry alone
        else:
            assert not result.sent and result.patch is None and free == [10900]
        Daemon(agent).shutdown()


@pytest.mark.cluster
def test_without_per_gpu_labels_the_rewrite_decides(
    dev_cluster, admin_api, make_node, namespace, tmp_path  # noqa: F811
):
    """Per-GPU labels off: only the node's best GPU is bounded by a label, so the telemetry's
    exact value decides for the others. Two GPUs, 50,400 and 10,900 -> 10,300 MiB free (no label moves, the free total included); a pod
    asking two GPUs of 10,500: with the rule off it passes on stale telemetry, with it refused."""
    trace = small_trace(tmp_path, [(0.0, (50400, 10900)), (10.0, (50400, 10300))], "two")
    verdicts = {}
    for drop_mib in (0, 256):
        node = make_node()
        clock = Clock(0.0)
        agent = lease_agent(dev_cluster.kubeconfig, node, namespace, trace, clock,
                            telemetry_free_drop_mib=drop_mib, per_gpu_labels=False)  # fmt: skip
        tick_at(agent, clock, 0.0)
        assert verdict(admin_api, node, 10500, count=2) is None  # 10,900 on the second GPU
        labels = node_metadata(admin_api, node)[0]
        tick_at(agent, clock, 11.0)
        assert node_metadata(admin_api, node)[0] == labels  # no label moved
        verdicts[drop_mib] = verdict(admin_api, node, 10500, count=2)
        Daemon(agent).shutdown()
    assert verdicts[0] is None  # the hole the rewrite closes
    assert verdicts[256] is not None and "10500 MiB" in verdicts[256]


@pytest.mark.cluster
def test_a_rise_waits_for_the_budget_and_calm(
    dev_cluster, admin_api, make_node, namespace, tmp_path  # noqa: F811
):
    """After the drop, free memory back up by 600 MiB (no label moves): not written at once;
    written once the last patch and the last drop are an interval (30 s) old."""
    trace = small_trace(
        tmp_path, [(0.0, (10900,)), (10.0, (10300,)), (20.0, (10900,))], "rise"
    )
    node = make_node()
    clock = Clock(0.0)
    agent = lease_agent(dev_cluster.kubeconfig, node, namespace, trace, clock)
    tick_at(agent, clock, 0.0)
    assert tick_at(agent, clock, 11.0).sent  # the drop, at once
    for t in (21.0, 31.0, 40.0):  # the rise: held (the drop was at 11 s)
        assert not tick_at(agent, clock, t).sent
        assert [g["memory_free_mib"] for g in published(admin_api, node)] == [10300]
    result = tick_at(agent, clock, 41.0)
    assert result.sent and set(result.patch["metadata"]) == {"annotations"}
    assert [g["memory_free_mib"] for g in published(admin_api, node)] == [10900]
    assert not tick_at(agent, clock, 51.0).sent  # nothing moved since: no write
    assert agent.cache.patches_sent == 3
    Daemon(agent).shutdown()


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources ``List``: ``holders`` (pod name -> GPU UUID) in namespace
    ``ml``, container ``main``; the test changes it between ticks."""

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=pod, namespace="ml",
                    containers=[api_pb2.ContainerResources(name="main", devices=[
                        api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid])
                    ])],
                )  # fmt: skip
                for pod, uuid in sorted(self.holders.items())
            ]
        )


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[_Kubelet, Path]]:
    socket_path = tmp_path / "kubelet.sock"
    servicer = _Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield servicer, socket_path
    finally:
        server.stop(None)


@pytest.mark.cluster
def test_a_new_holder_goes_at_once_and_one_leaving_waits(
    dev_cluster, admin_api, make_node, namespace, tmp_path, kubelet  # noqa: F811
):
    """A pod that starts on a GPU (no memory used yet, no label moves) is in the telemetry at
    the next tick, in Lease mode and under the budget; one that leaves is taken out once the
    budget lets a change for the better go."""
    servicer, socket_path = kubelet
    trace = small_trace(tmp_path, [(0.0, (10900, 10900))], "holders")
    uuid1 = uuid_of(json.loads(trace.read_text())["devices"][0]["uuid"], 1)
    node = make_node()
    clock = Clock(0.0)
    attribution = Attribution(socket_path, None)
    agent = lease_agent(dev_cluster.kubeconfig, node, namespace, trace, clock, attribution)

    def pods() -> list[list[str]]:
        return [[p["pod"] for p in g.get("pods", [])] for g in published(admin_api, node)]

    try:
        tick_at(agent, clock, 0.0)
        assert pods() == [[], []]
        servicer.holders = {"train-0": uuid1}
        result = tick_at(agent, clock, 5.0)  # 5 s after the first patch: at once
        assert result.sent and set(result.patch["metadata"]) == {"annotations"}
        assert pods() == [[], ["train-0"]]
        servicer.holders = {}
        for t in (10.0, 20.0, 34.0):  # left: waits (the new holder, worse, came at 5 s)
            assert not tick_at(agent, clock, t).sent
        assert pods() == [[], ["train-0"]]
        assert tick_at(agent, clock, 35.0).sent
        assert pods() == [[], []]
    finally:
        Daemon(agent).shutdown()
        attribution.close()
