"""End to end (issue 37, "sidecars"): a sidecar's slice of a shared GPU counts for the pod's life
behind a real kube-scheduler and kube-apiserver (1.29 or later, where an init container with
``restartPolicy: Always`` is a sidecar by default; the module skips on older servers, read from
``/version``).

One Node written as an agent sharing its one GPU writes it (``tests/test_slices_cluster``:
32,000 MiB free, 31 units of 1,024 MiB; 79 units of ``omaticaya.io/gpu-memory`` in its
allocatable, so kube-scheduler's own count never limits) and a kube-scheduler whose extender
fills the test's ledger (``tests/test_burst_cluster.ledger_scheduler``; no kubelet: a bound pod's
slice counts in the ledger until it goes). A pod of a 20-unit sidecar and a 5-unit app container
binds and is reserved as 25 units on the GPU; a 10-unit pod then fits beside it by kube-scheduler's
count but not by the GPU's memory, and stays Pending with the extender's reason; a 5-unit pod
binds. Before 8aa1718 the sidecar pod was reserved as 5 units and the 10-unit pod bound too
(the kubelet then refused it: ``UnexpectedAdmissionError``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.scheduler.burst_cluster_support import ledger_scheduler
from tests.scheduler.preemption_cluster_support import server_minor
from tests.scheduler.scheduling_cluster_support import (  # noqa: F401  (api: a module fixture)
    api,
    bound_node,
    unschedulable_message,
)
from tests.scheduler.slices_cluster_support import R, slice_pod, write_shared_node

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

FREE_MIB = 32_000  # 31 units
ALLOCATABLE = 79  # units in the Node's allocatable: more than the GPU's memory holds


@pytest.fixture
def setup(api, scheduling_cluster, tmp_path) -> Iterator[dict[str, Any]]:  # noqa: F811
    minor = server_minor(api)
    if minor < 29:
        pytest.skip(f"kube-apiserver 1.{minor}: an init container with restartPolicy Always is "
                    "a sidecar by default from 1.29 (SidecarContainers)")  # fmt: skip
    tag = os.getpid()
    yield from ledger_scheduler(api, scheduling_cluster, tmp_path, f"sidecar-{tag}",
                                "omaticaya-sidecar", {f"sidecar-{tag}": ([FREE_MIB], ALLOCATABLE)},
                                lambda name, v: write_shared_node(api, name, *v))  # fmt: skip


def sidecar_pod(name: str, scheduler: str) -> dict[str, Any]:
    pod = slice_pod(name, scheduler, 5)
    pod["spec"]["initContainers"] = [
        {"name": "sidecar", "image": "registry.k8s.io/pause:3.2", "restartPolicy": "Always",
         "resources": {"limits": {R: "20"}}}
    ]  # fmt: skip
    return pod


def test_a_sidecar_pod_holds_25_units_and_a_pod_that_does_not_fit_beside_it_waits(api, setup):  # noqa: F811
    ns, scheduler, ledger = setup["ns"], setup["name"], setup["ledger"]
    (node,) = setup["nodes"]
    api.create_namespaced_pod(ns, sidecar_pod("with-sidecar", scheduler))
    assert bound_node(api, ns, "with-sidecar", 30) == node
    held = ledger.get(api.read_namespaced_pod("with-sidecar", ns).metadata.uid)
    assert held is not None and held.slices == (20, 5) and held.gpus == (0, 0), held

    # 25 + 10 > 31 units of memory; kube-scheduler's count (25 + 10 <= 79) lets it through
    api.create_namespaced_pod(ns, slice_pod("too-big", scheduler, 10))
    message = unschedulable_message(api, ns, "too-big", 30)
    why = f"room taken by in-flight pods: pod needs 10 units of {R} on one shared GPU"
    assert why in message, message
    assert "Insufficient" not in message, message

    api.create_namespaced_pod(ns, slice_pod("beside", scheduler, 5))  # 25 + 5 <= 31
    assert bound_node(api, ns, "beside", 30) == node
    assert not api.read_namespaced_pod("too-big", ns).spec.node_name
    assert why in unschedulable_message(api, ns, "too-big", 30)
