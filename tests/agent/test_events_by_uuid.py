"""GPU health Events follow the GPU, not its index: after NVML is re-initialised with one GPU
gone, the remaining GPUs' indices shift; a GPU that stayed unhealthy must not get a second
``GpuUnhealthy`` Event, and a healthy GPU that moved into an unhealthy one's old index must not
get a ``GpuRecovered``. Against the real API server (Events read back as admin)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.model.snapshot import NodeSnapshot
from omaticaya_py.kube import NodeClient
from tests.helpers import gpu

pytestmark = pytest.mark.cluster

A, B, C = (f"GPU-0000000{i}-7fda-b7ae-a94e-630097a14ca4" for i in (1, 2, 3))


class Snapshots:
    """A ``Reader`` that returns the given snapshots in turn (the NVML sessions of a node)."""

    def __init__(self, *snapshots: NodeSnapshot) -> None:
        self.snapshots = list(snapshots)

    def read(self) -> NodeSnapshot:
        return self.snapshots.pop(0)

    def close(self) -> None:
        pass


def snap(*gpus) -> NodeSnapshot:
    return NodeSnapshot(read_at=datetime.now(timezone.utc), clock_s=0.0, gpus=tuple(gpus))


def test_events_follow_the_gpu_when_indices_shift(dev_cluster, admin_api, make_node) -> None:
    node = make_node()
    sick = {"remapped_rows_pending": True}
    reader = Snapshots(
        # first session: A (0) healthy, B (1) unhealthy, C (2) healthy
        snap(gpu(0, uuid=A), gpu(1, uuid=B, **sick), gpu(2, uuid=C)),
        # after a re-init A is gone: B is now 0 (still unhealthy), C is 1 (still healthy)
        snap(replace(gpu(0, **sick), uuid=B), replace(gpu(1), uuid=C)),
        # B recovers
        snap(replace(gpu(0), uuid=B), replace(gpu(1), uuid=C)),
    )
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    agent = Agent(load_settings(node_name=node), reader, NodeApi(client))
    for _ in range(3):
        agent.tick()
    events = admin_api.list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
    # in the order the API server stored them (etcd revisions increase)
    got = sorted((int(e.metadata.resource_version), e.reason, e.message) for e in events.items)
    assert [(reason, message) for _, reason, message in got] == [
        ("GpuUnhealthy", "GPU 1 unhealthy: remap-pending"),
        ("GpuRecovered", "GPU 0 healthy again"),
    ]
