"""End to end: pods placed by live GPU state on a real kube-apiserver + kube-scheduler of the dev
cluster's release (``OMATICAYA_KUBERNETES_VERSION``: v1.37.2 by default, v1.31.0 the oldest).

Five Nodes, each labelled by a real agent (``omaticaya run`` replaying a one-GPU trace, ticking
every second, heartbeat 1 s, so ``read_at`` stays fresh):

    big    70000 MiB free, Healthy
    mid    35000 MiB free, Healthy
    small  20000 MiB free, Healthy
    sick   70000 MiB free, Unhealthy (uncorrectable ECC error)
    crash  (extender tests) 60000 MiB free, Healthy; its agent is killed with SIGKILL

1. The stock scheduler with ``nodeAffinity`` on the labels (``examples/scheduler/pod-affinity.yaml``).
2. Two more kube-schedulers from the example configuration (``scheduler_config``:
   ``examples/scheduler/scheduler-config-v1.yaml``), each with its own in-process
   ``omaticaya extender`` (binpack / spread), pods annotated ``omaticaya.io/gpu-memory-mib``.

Everything listens on 127.0.0.1. No kubelet runs: the test makes Nodes schedulable itself (taint
removed, capacity and a Ready condition set through the status subresource) and creates the
``default`` ServiceAccount (no controller-manager).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.devcluster import DevCluster
from tests.scheduler.scheduling_cluster_support import (  # the names moved out, for this file's tests
    EXAMPLES,  # noqa: F401
    GRACE_S,  # noqa: F401
    MIB,  # noqa: F401
    REPO,  # noqa: F401
    SCHEDULER_STARTED,  # noqa: F401
    TTL_S,  # noqa: F401
    Agents,  # noqa: F401
    ExtenderScheduler,  # noqa: F401
    api,  # noqa: F401
    bound_node,  # noqa: F401
    gpu_pod,  # noqa: F401
    load_pod,  # noqa: F401
    schedulable,  # noqa: F401
    scheduler_config,  # noqa: F401
    unschedulable_message,  # noqa: F401
    write_trace,  # noqa: F401
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


FREE = {"big": 70000, "mid": 35000, "small": 20000, "sick": 70000, "crash": 60000}




# ------------------------------------------------------------------------------ fixtures ----




@pytest.fixture(scope="module")
def namespace(api: Any) -> Iterator[str]:
    name = f"sched-{os.getpid()}"
    api.create_namespace({"metadata": {"name": name}})
    api.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    yield name
    api.delete_namespace(name)








@pytest.fixture(scope="module")
def nodes(api: Any, scheduling_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory):
    """{role: node name}: big, mid, small, sick (crash is per test), labelled by live agents."""
    tmp = tmp_path_factory.mktemp("agents")
    agents = Agents(scheduling_cluster, tmp)
    names = {role: f"sched-{role}-{os.getpid()}" for role in ("big", "mid", "small", "sick")}
    try:
        for role, name in names.items():
            api.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
            schedulable(api, name)
            agents.start(name, FREE[role], unhealthy=role == "sick")
        prefix = "omaticaya.io/"

        def labelled() -> bool:
            for name in names.values():
                labels = api.read_node(name).metadata.labels or {}
                if prefix + "gpu.health" not in labels:
                    return False
            return True

        wait_for("the agents to label the nodes", labelled, 30)
        yield {"names": names, "agents": agents, "tmp": tmp}
    finally:
        agents.stop_all()
        for name in names.values():
            try:
                api.delete_node(name)
            except Exception:  # noqa: BLE001
                pass








# ---------------------------------------------------------------- 1. stock scheduler ----


def test_affinity_pod_binds_to_the_node_with_room(api, namespace, nodes):
    pod = load_pod(EXAMPLES / "pod-affinity.yaml", "affinity-fits")
    api.create_namespaced_pod(namespace, pod)
    assert bound_node(api, namespace, "affinity-fits") == nodes["names"]["big"]


def test_affinity_pod_that_fits_nowhere_stays_pending_with_the_reason(api, namespace, nodes):
    pod = load_pod(EXAMPLES / "pod-affinity.yaml", "affinity-too-big")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["75000"]
    api.create_namespaced_pod(namespace, pod)
    message = unschedulable_message(api, namespace, "affinity-too-big")
    assert "node(s) didn't match Pod's node affinity" in message, message


def test_affinity_never_picks_the_unhealthy_node(api, namespace, nodes):
    """Health In [Healthy, Degraded] excludes sick (70000 free, Unhealthy) though it has room."""
    for i in range(3):
        pod = load_pod(EXAMPLES / "pod-affinity.yaml", f"affinity-health-{i}")
        api.create_namespaced_pod(namespace, pod)
    for i in range(3):
        assert bound_node(api, namespace, f"affinity-health-{i}") == nodes["names"]["big"]


# -------------------------------------------------------------- 2. with the extender ----








@pytest.fixture(scope="module")
def schedulers(scheduling_cluster, nodes, tmp_path_factory) -> Iterator[dict[str, ExtenderScheduler]]:
    tmp = tmp_path_factory.mktemp("schedulers")
    made: dict[str, ExtenderScheduler] = {}
    try:
        made["binpack"] = ExtenderScheduler(scheduling_cluster, tmp, "omaticaya-scheduler", "binpack")
        made["spread"] = ExtenderScheduler(scheduling_cluster, tmp, "omaticaya-spread", "spread")
        yield made
    finally:
        for s in made.values():
            s.close()




def test_binpack_picks_the_tighter_fit(api, namespace, nodes, schedulers):
    api.create_namespaced_pod(namespace, gpu_pod("binpack-30g", "omaticaya-scheduler"))
    assert bound_node(api, namespace, "binpack-30g") == nodes["names"]["mid"]


def test_spread_picks_the_emptier_node(api, namespace, nodes, schedulers):
    api.create_namespaced_pod(namespace, gpu_pod("spread-30g", "omaticaya-spread"))
    assert bound_node(api, namespace, "spread-30g") == nodes["names"]["big"]


def test_pod_that_fits_nowhere_stays_pending_with_readable_reasons(
    api, namespace, nodes, schedulers
):
    api.create_namespaced_pod(namespace, gpu_pod("binpack-75g", "omaticaya-scheduler", 75000))
    message = unschedulable_message(api, namespace, "binpack-75g")
    assert "node(s) had no room: pod needs a GPU with 75000 MiB free (omaticaya.io)" in message
    assert "node(s) had GPU health Unhealthy (omaticaya.io)" in message


def test_unhealthy_node_is_never_chosen(api, namespace, nodes, schedulers):
    """sick has the most free memory: spread would pick it, were it healthy."""
    for i in range(3):
        api.create_namespaced_pod(namespace, gpu_pod(f"spread-health-{i}", "omaticaya-spread"))
    for i in range(3):
        assert bound_node(api, namespace, f"spread-health-{i}") != nodes["names"]["sick"]


def test_node_whose_agent_died_is_skipped_after_the_ttl(api, namespace, nodes, schedulers):
    crash = f"sched-crash-{os.getpid()}"
    agents: Agents = nodes["agents"]
    api.create_node({"metadata": {"name": crash, "labels": {"kubernetes.io/hostname": crash}}})
    try:
        schedulable(api, crash)
        agents.start(crash, FREE["crash"])
        wait_for(
            "the crash node's labels",
            lambda: "omaticaya.io/gpu.health" in (api.read_node(crash).metadata.labels or {}),
            30,
        )
        # binpack for 50000 MiB: crash (60000) is the tightest fit of big (70000) and crash
        api.create_namespaced_pod(namespace, gpu_pod("before-crash", "omaticaya-scheduler", 50000))
        assert bound_node(api, namespace, "before-crash") == crash
        agents.kill(crash)
        killed = time.monotonic()
        labels = api.read_node(crash).metadata.labels or {}
        assert labels.get("omaticaya.io/gpu.memory.free-mib"), "SIGKILL must leave the labels"
        time.sleep(max(0.0, TTL_S + GRACE_S + 1.5 - (time.monotonic() - killed)))
        api.create_namespaced_pod(namespace, gpu_pod("after-crash", "omaticaya-scheduler", 50000))
        assert bound_node(api, namespace, "after-crash") == nodes["names"]["big"]
        # and a pod only the crashed node could hold says why it waits
        api.create_namespaced_pod(namespace, gpu_pod("only-crash", "omaticaya-scheduler", 71000))
        message = unschedulable_message(api, namespace, "only-crash")
        assert "node(s) had stale GPU telemetry" in message, message
    finally:
        api.delete_node(crash)


def test_pod_without_the_annotation_passes_through(api, namespace, nodes, schedulers):
    pod = load_pod(EXAMPLES / "pod-extender.yaml", "no-need", schedulerName="omaticaya-scheduler")
    del pod["metadata"]["annotations"]
    api.create_namespaced_pod(namespace, pod)
    assert bound_node(api, namespace, "no-need")  # any node, the sick one included
