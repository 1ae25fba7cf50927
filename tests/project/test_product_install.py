"""The install as docs/install.md gives it, goal by goal next to the GPU Operator (issue 31),
ending in the whole product as a user installs it (issue 30): the scheduler, the device plugin
and sharing on, then ``kubectl apply`` of GPU pods and of every example, on the real v1.37.2 dev
cluster (``scripts/dev-cluster up --full``: the agent's image and the chart's default
``registry.k8s.io/kube-scheduler:v1.37.2``, both built without a Docker daemon).

The DaemonSet pod runs the agent, the device plugin and the PodResources attribution, replaying
``multi-gpu-trace.json`` (8 H100s; GPUs 0-3 shared in 1 GiB units, free 81,079 / 50,359 /
70,839 / 9,399 MiB; GPUs 4-7 whole, free 81,079 / 34,999 / 75,959 / 3,255 MiB). The scheduler
pod runs kube-scheduler with the extender beside it. Pods are busybox: they use no GPU memory,
so only the kubelet's books (published by the agent from PodResources) show them, the case
where the extender used to pass a node the device plugin then refused (``UnexpectedAdmissionError``).

Every wait is on a condition; nothing asserts a latency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.helm_install_support import (  # noqa: F401 - cluster and tools are fixtures
    CHART,
    NAMESPACE,
    PREFIX,
    RELEASE,
    Kube,
    cluster,
    tools,
    values_file,
    wait_for,
)
from tests.kubelet import IMAGE
from tests.project.product_install_support import (  # the names moved out, for this file's tests
    DEV_TAINT,  # noqa: F401
    SCHEDULER,  # noqa: F401
    STACK,  # noqa: F401
    extender_reason,  # noqa: F401
    running,  # noqa: F401
    unschedulable,  # noqa: F401
    uuid,  # noqa: F401
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

TRACE = "multi-gpu-trace.json"
WORK = "gpu-work"




def pod(name: str, *, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A busybox pod for the chart's scheduler that prints the devices it was handed."""
    script = ("echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo LIMIT=$OMATICAYA_GPU_MEMORY_LIMIT_MIB; "
              "echo MOUNTS=$(ls /var/run/nvidia-container-devices 2>/dev/null | tr '\\n' ' '); "
              "sleep 3600")  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORK, "annotations": annotations or {}},
        "spec": {
            "schedulerName": SCHEDULER,
            "tolerations": [DEV_TAINT],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script], "resources": {"limits": limits},
            }],
        },
    }  # fmt: skip


def apply(kube: Kube, tmp: Path, *docs: dict[str, Any]) -> None:
    path = tmp / f"pods-{len(list(tmp.glob('pods-*')))}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    kube.kubectl("apply", "-f", str(path))


def work_pods(kube: Kube) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.json("-n", WORK, "get", "pods")["items"]}








def devices(kube: Kube, name: str) -> dict[str, str]:
    """What the container printed: VISIBLE, LIMIT and MOUNTS."""
    out = kube.kubectl("-n", WORK, "logs", name).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def admission_failures(kube: Kube) -> list[str]:
    """Pods Failed at admission, and the kubelet's UnexpectedAdmissionError events."""
    failed = [n for n, p in work_pods(kube).items() if p["status"].get("phase") == "Failed"]
    events = kube.json("-n", WORK, "get", "events")["items"]
    return failed + [e["message"] for e in events if e.get("reason") == "UnexpectedAdmissionError"]


def allocatable(kube: Kube, node: str) -> dict[str, str]:
    return kube.json("get", "node", node)["status"].get("allocatable") or {}


INSTALL = CHART.parent.parent / "examples" / "install"
SCHEDULER_EXAMPLES = CHART.parent.parent / "examples" / "scheduler"

#: docs/install.md's goals, in its order: (values file, device plugin on, units of sharing)
GOALS = [
    ("labels.yaml", False, False, False),
    ("scheduler.yaml", True, False, False),
    ("device-plugin.yaml", True, True, False),
    ("whole-stack.yaml", True, True, True),
]

#: the GPU Operator's RuntimeClass; the dev cluster's containerd has a handler of that name
#: (plain runc), as an operator node has the NVIDIA runtime under it
RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                 "metadata": {"name": "nvidia"}, "handler": "nvidia"}


def as_applied(doc: dict[str, Any]) -> dict[str, Any]:
    """An example pod as the dev cluster can run it: in the work namespace, tolerating the dev
    node's taint, its image swapped for the cluster's busybox (nothing is pulled here); the
    rest, the scheduler, annotations, command and limits, as written."""
    doc = json.loads(json.dumps(doc))
    doc["metadata"]["namespace"] = WORK
    spec = doc["spec"]
    spec.setdefault("tolerations", []).append(DEV_TAINT)
    spec["terminationGracePeriodSeconds"] = 0
    for c in spec["containers"]:
        c["image"], c["imagePullPolicy"] = IMAGE, "Never"
    return doc


def test_each_goal_installs_as_documented_then_the_whole_product_runs(cluster, tools, tmp_path):  # noqa: F811
    """docs/install.md on a GPU Operator cluster, goal by goal (issue 31): each goal's values
    file with examples/install/gpu-operator.yaml, upgraded in place; the pods run under the
    RuntimeClass "nvidia", are system-node-critical with the device plugin, the scheduler pod
    passes its probes, and allocatable shows what the goal promises. On the last goal (the
    whole stack) the product runs as a user runs it (issue 30: ``_the_whole_stack_...``), then
    every example of examples/scheduler/ is applied and each pod lands where its comment
    says; ``helm uninstall`` leaves nothing behind."""
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    socket = cluster.state_dir / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
    dev = values_file(tmp_path, cluster, node, trace=TRACE, podResourcesSocket=str(socket),
                      scheduler={"tolerations": [DEV_TAINT]})  # fmt: skip
    apply(kube, tmp_path, RUNTIME_CLASS)
    try:
        for goal, scheduler, plugin, sharing in GOALS:
            out = kube.helm("upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE,
                            "--create-namespace", "-f", str(INSTALL / goal),
                            "-f", str(INSTALL / "gpu-operator.yaml"), "-f", str(dev),
                            "--wait", "--timeout", "300s").stdout  # fmt: skip
            notes = " ".join(out.split())
            ds = kube.json("-n", NAMESPACE, "get", "daemonset", RELEASE)
            spec = ds["spec"]["template"]["spec"]
            assert spec["runtimeClassName"] == "nvidia", goal
            assert spec.get("priorityClassName") == ("system-node-critical" if plugin else None)
            wait_for(f"{goal}: the agent's pod Running and Ready under RuntimeClass nvidia", lambda: [
                p for p in kube.pods()
                if p["spec"].get("runtimeClassName") == "nvidia"
                and p["metadata"].get("deletionTimestamp") is None
                and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
            ])  # fmt: skip
            wait_for(f"{goal}: the live labels", lambda: "gpu.memory.free-mib" in kube.node_labels(node))
            deploys = kube.json("-n", NAMESPACE, "get", "deployments")["items"]
            assert len(deploys) == int(scheduler), goal
            if scheduler:  # --wait saw it Available: both containers passed their readiness probes
                (deploy,) = deploys
                assert deploy["status"].get("readyReplicas") == 1
                assert "Preemption is on (scheduler.preemption auto)" in notes, notes
            if plugin:
                want = {"nvidia.com/gpu": "4" if sharing else "8"}
                if sharing:
                    want["omaticaya.io/gpu-memory"] = "316"
                wait_for(f"{goal}: allocatable {want}", lambda want=want: all(
                    allocatable(kube, node).get(k) == v for k, v in want.items()))
            else:
                assert "nvidia.com/gpu" not in allocatable(kube, node)

        # --- the whole product as a user runs it (issue 30), on the last goal's install
        _the_whole_stack_places_every_pod_on_a_gpu_that_holds_it(kube, node, tmp_path)

        # --- every example of examples/scheduler/ on the whole stack
        kube.kubectl("create", "namespace", WORK)
        kube.kubectl("apply", "-f", str(SCHEDULER_EXAMPLES / "priorityclasses.yaml"))
        pods = [as_applied(yaml.safe_load((SCHEDULER_EXAMPLES / f).read_text()))
                for f in ("pod-affinity.yaml", "pod-extender.yaml", "pod-slice.yaml")]  # fmt: skip
        apply(kube, tmp_path, *pods)
        names = [p["metadata"]["name"] for p in pods]
        wait_for("every example pod Running", lambda: all(
            running(work_pods(kube).get(n, {"status": {}})) for n in names))
        # the whole GPU: one of the whole GPUs 4-7, named by the device plugin, as it says
        given = wait_for("needs-30gib's GPU printed", lambda: [
            line.split()[1] for line in kube.kubectl("-n", WORK, "logs", "needs-30gib").stdout.splitlines()
            if line.startswith("given ")])  # fmt: skip
        assert given[0] in {uuid(i) for i in range(4, 8)}, given
        assert admission_failures(kube) == []
    except BaseException:
        kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "300s", check=False)
        raise
    finally:
        kube.kubectl("delete", "namespace", WORK, "--wait=true", "--timeout=120s", check=False)
        kube.kubectl("delete", "-f", str(SCHEDULER_EXAMPLES / "priorityclasses.yaml"), check=False)
    _uninstall_leaves_nothing(kube, node)


def _the_whole_stack_places_every_pod_on_a_gpu_that_holds_it(kube: Kube, node: str, tmp_path: Path) -> None:
    """Issue 30, on the installed whole stack: busybox pods for whole GPUs and slices, created
    as a user would, each lands on a GPU that holds it or stays Pending with the extender's
    reason; none fails admission; a helm upgrade keeps them running. Leaves the release
    installed, the work namespace deleted."""
    kube.kubectl("create", "namespace", WORK)
    try:
        # the device plugin serves 4 whole GPUs and 4 x 79 units; the agent publishes the books
        wait_for("the node's GPUs and units allocatable", lambda: (
            allocatable(kube, node).get("nvidia.com/gpu") == "4"
            and allocatable(kube, node).get("omaticaya.io/gpu-memory") == "316"))  # fmt: skip
        wait_for("the telemetry with its holders", lambda: '"pods"' in (
            kube.json("get", "node", node)["metadata"]["annotations"].get(PREFIX + "telemetry", "")))

        # --- a whole GPU: bound through the chart's scheduler, one GPU, the one predicted
        apply(kube, tmp_path, pod("whole", limits={"nvidia.com/gpu": "1"},
                                  annotations={"omaticaya.io/gpu-memory-mib": "60Gi"}))
        wait_for("the whole-GPU pod Running", lambda: running(work_pods(kube)["whole"]))
        got = wait_for("its devices printed", lambda: devices(kube, "whole").get("MOUNTS"))
        seen = devices(kube, "whole")
        # the most free of GPUs 4-7 (core.model.sharing.device_order): what the extender reserved
        assert seen["VISIBLE"] == uuid(4), seen
        assert got.split() == [uuid(4)], seen

        # --- a second 60 GiB pod: GPU 6 (75,959 free); a third has none left (GPU 4 is
        # assigned, though its memory is free: the pod loaded nothing)
        apply(kube, tmp_path, *(pod(f"whole-{i}", limits={"nvidia.com/gpu": "1"},
                                    annotations={"omaticaya.io/gpu-memory-mib": "60Gi"})
                                for i in (2, 3)))  # fmt: skip

        def whole_settled() -> bool:
            ps = work_pods(kube)
            states = [running(ps[n]) or unschedulable(ps[n]) is not None for n in ("whole-2", "whole-3")]
            return all(states)

        wait_for("the next whole-GPU pods Running or Unschedulable", whole_settled)
        ps = work_pods(kube)
        assert sorted(running(ps[n]) for n in ("whole-2", "whole-3")) == [False, True]
        bound = next(n for n in ("whole-2", "whole-3") if running(ps[n]))
        wait_for("its devices printed", lambda: devices(kube, bound).get("VISIBLE"))
        assert devices(kube, bound)["VISIBLE"] == uuid(6)
        left = next(n for n in ("whole-2", "whole-3") if not running(ps[n]))
        assert extender_reason(unschedulable(ps[left])), ps[left]["status"]

        # --- slices that fill the shared GPUs unevenly, created at once: 3 of 4 fit
        apply(kube, tmp_path, *(pod(f"slice-{i}", limits={"omaticaya.io/gpu-memory": str(n)})
                                for i, n in enumerate((50, 50, 40, 40))))  # fmt: skip

        def slices_settled() -> bool:
            ps = [p for n, p in work_pods(kube).items() if n.startswith("slice-")]
            return len(ps) == 4 and all(running(p) or unschedulable(p) is not None for p in ps)

        wait_for("the slice pods Running or Unschedulable", slices_settled)
        ps = {n: p for n, p in work_pods(kube).items() if n.startswith("slice-")}
        on = [n for n, p in ps.items() if running(p)]
        assert len(on) == 3, {n: p["status"] for n, p in ps.items()}
        (waiting,) = (p for p in ps.values() if not running(p))
        assert extender_reason(unschedulable(waiting)), waiting["status"]
        for n in on:
            got = wait_for(f"{n}'s devices printed", lambda n=n: devices(kube, n).get("LIMIT"))
            assert int(got) in (50 * 1024, 40 * 1024)
        assert admission_failures(kube) == []

        def held() -> dict[str, int]:
            """Pod -> the GPU the agent's telemetry says the kubelet gave it (PodResources)."""
            doc = json.loads(
                kube.json("get", "node", node)["metadata"]["annotations"][PREFIX + "telemetry"])
            return {p["pod"]: g["index"] for g in doc["gpus"] for p in g.get("pods") or []}

        wait_for("the telemetry naming every pod's GPU", lambda: set(on) | {"whole"} <= set(held()))
        # GPU 3 has every unit free but 9,399 MiB of memory: memory held by no pod steers the
        # slices away from it
        assert {held()[n] for n in on} <= {0, 1, 2} and held()["whole"] == 4, held()

        # --- helm upgrade (a new schedule) keeps the pods running
        restarts = {n: p["status"]["containerStatuses"][0]["restartCount"]
                    for n, p in work_pods(kube).items() if running(p)}  # fmt: skip
        kube.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--set",
                  "schedule=@every 3s", "--wait", "--timeout", "300s")  # fmt: skip
        wait_for("the node's GPUs allocatable again", lambda: (
            allocatable(kube, node).get("nvidia.com/gpu") == "4"))
        after = work_pods(kube)
        assert {n: after[n]["status"]["containerStatuses"][0]["restartCount"]
                for n in restarts if running(after[n])} == restarts  # fmt: skip
        assert admission_failures(kube) == []
    finally:
        kube.kubectl("delete", "namespace", WORK, "--wait=true", "--timeout=120s", check=False)


def _uninstall_leaves_nothing(kube: Kube, node: str) -> None:
    """helm uninstall leaves no dynamic label, no Lease, no RBAC, no device-plugin socket."""
    kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "300s")
    wait_for("the agent pods gone", lambda: not kube.pods())
    wait_for("the dynamic labels gone", lambda: not {
        k for k in kube.node_labels(node)
        if k.startswith(("gpu.memory.free", "gpu.utilization", "gpu.health", "gpu.idle"))})
    leases = kube.json("-n", NAMESPACE, "get", "leases")["items"]
    assert [x["metadata"]["name"] for x in leases] == []
    rbac = kube.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout
    assert RELEASE not in rbac.replace("system:", "")
    plugin_dir = Path("/var/lib/kubelet/device-plugins")
    wait_for("the device-plugin sockets gone",
             lambda: not list(plugin_dir.glob("omaticaya-*.sock")))


#: faults-trace.json: 4 GPUs; GPU 3 is lost from t=24 s to t=28 s of each 40 s loop
FAULTS = "faults-trace.json"


# GPU 3 shared: its 79 units leave (served whole, its one device leaves the same way, by the
# same health: ("none", "nvidia.com/gpu", "4") passed too; left out to keep the suite short)
@pytest.mark.parametrize(("shared", "resource", "full"), [
    ("3", "omaticaya.io/gpu-memory", "79"),
])  # fmt: skip
def test_a_lost_gpu_leaves_allocatable_and_comes_back(cluster, tools, tmp_path, shared, resource, full):  # noqa: F811
    """The whole stack's DaemonSet on the faults trace: while GPU 3 is lost its device (or units)
    turn Unhealthy and leave the Node's allocatable, and come back when it is read again."""
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    socket = cluster.state_dir / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
    # the agent and its device plugin only: no pod is scheduled here (CI time)
    dev = values_file(tmp_path, cluster, node, trace=FAULTS, podResourcesSocket=str(socket),
                      sharing={"gpus": shared}, scheduler={"enabled": False})  # fmt: skip
    kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "-f",
              str(STACK), "-f", str(dev), "--wait", "--timeout", "300s")  # fmt: skip
    try:
        # GPU 3 lost: fewer than ``full`` (GPU 2's Xid 79 may take another whole GPU for good)
        wait_for(f"GPU 3 out of {resource}", lambda: (
            int(allocatable(kube, node).get(resource, full)) < int(full)
            and _gpu3_unhealthy(kube, node)), timeout=150)  # fmt: skip
        # back: the device plugin reads the agent's reading itself (the labels may wait for the
        # write budget's calm); GPU 2's Xid 79 keeps it out for xidQuietS, so the whole GPUs
        # served are 0, 1 and 3 (GPU 1's remap phase takes it out for 5 s of each loop)
        back = "79" if shared == "3" else "3"
        wait_for(f"GPU 3 back in {resource}",
                 lambda: allocatable(kube, node).get(resource) == back, timeout=150)
    finally:
        kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "300s")
        wait_for("the agent pods gone", lambda: not kube.pods())


def _gpu3_unhealthy(kube: Kube, node: str) -> bool:
    return kube.node_labels(node).get("gpu-3.health") not in (None, "Healthy")
