"""Issue 38 item 4: the seam between the extender and the device plugin, end to end on the
chart's whole stack, as a new user meets it: ``helm install`` of ``examples/install/whole-stack.yaml``
on the full dev cluster (``scripts/dev-cluster up --full``), the whole-GPU resource renamed
(``devicePluginResource: example.com/gpu``), busybox pods by ``kubectl apply``.

The DaemonSet replays ``multi-gpu-trace.json`` (8 H100s, a steady load): GPUs 0-3 shared in
1 GiB units of ``omaticaya.io/gpu-memory`` (free 81,079 / 50,359 / 70,839 / 9,399 MiB: 79 / 49 /
69 / 9 units of room), GPUs 4-7 whole as ``example.com/gpu`` (free 81,079 / 34,999 / 75,959 /
3,255 MiB). Busybox uses no GPU memory: only the kubelet's books (PodResources, published by the
agent as each GPU's ``pods`` in the telemetry) show which GPU a pod holds.

What a new user saw before the fixes (issue 38), in the shapes used here:

- (a) a pod whose init container asks 40 units, on a node where no shared GPU has 40 GiB free,
  was bound and Failed with ``UnexpectedAdmissionError``: it must stay Pending with the
  extender's reason;
- (b) with ``devicePluginResource`` renamed, the GPUs assigned to running 60 GiB pods looked free
  (the agent kept only ``nvidia.com/*`` holders) and a third 60 GiB pod ran on a GPU without
  60 GiB free: the next pod must never be given an assigned GPU;
- (c) a pod of a 40 GiB whole GPU and 5 units was judged by its slice alone, and the 40 GiB pod
  applied after it was given a GPU with 9 GiB free: the first must get both, on a whole GPU with
  its 40 GiB, and the next exclusive pod neither of them.

And issue 48 (items 2 and 8): (d) a pod asking ``example.com/gpu`` alone (no memory annotation)
passed the extender unrecorded, so a 60 GiB pod filtered in the same window was reserved on the
GPU the device plugin then gave the first, and got one without 60 GiB: every GPU pod must count
in flight, and each pod be admitted on a GPU that holds it.

One install (module-scoped) serves the four cases; each case runs in a namespace of its own,
deleted at its end, and starts once the telemetry shows no pod holding a GPU. The GPU a
container got is read three ways, as the other full-stack tests do: what it printed
(``NVIDIA_VISIBLE_DEVICES`` and its device mounts, the device plugin's answer to ``Allocate``)
and the telemetry's holders (the kubelet's PodResources). Every wait is on a condition; nothing
asserts a latency.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import waiting
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
from tests.project.product_install_support import (
    DEV_TAINT,
    SCHEDULER,
    STACK,
    extender_reason,
    running,
    unschedulable,
    uuid,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

TRACE = "multi-gpu-trace.json"
#: the renamed whole-GPU resource (the chart's devicePluginResource)
GPU = "example.com/gpu"
UNITS = "omaticaya.io/gpu-memory"
MEMORY = "omaticaya.io/gpu-memory-mib"
SHARED = {0, 1, 2, 3}
#: whole GPUs with at least 40 GiB free in the trace (GPU 5 has 34,999 MiB, GPU 7 3,255): the
#: two with the most free, 81,079 and 75,959 MiB, so with 60 GiB free too
ROOM_40GIB = {4, 6}


@dataclass
class Stack:
    kube: Kube
    node: str
    tmp: Path


@pytest.fixture(scope="module")
def stack(cluster, tools, tmp_path_factory) -> Iterator[Stack]:  # noqa: F811
    """The whole stack installed once: agent + device plugin (GPUs 0-3 shared, 4-7 whole as
    ``example.com/gpu``) + the chart's scheduler with the extender."""
    helm, kubectl = tools
    node = cluster.start_full()
    tmp = tmp_path_factory.mktemp("seam")
    kube = Kube(cluster, helm, kubectl, tmp / "helm")
    socket = cluster.state_dir / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
    dev = values_file(tmp, cluster, node, trace=TRACE, podResourcesSocket=str(socket),
                      devicePluginResource=GPU, scheduler={"tolerations": [DEV_TAINT]})  # fmt: skip
    kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
              "-f", str(STACK), "-f", str(dev), "--wait", "--timeout", "300s")  # fmt: skip
    try:
        want = {GPU: "4", UNITS: "316", "nvidia.com/gpu": None}
        wait_for(f"allocatable {want}", lambda: all(
            allocatable(kube, node).get(k) == v for k, v in want.items()))  # fmt: skip
        yield Stack(kube, node, tmp)
    finally:
        kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "300s", check=False)
        wait_for("the agent pods gone", lambda: not kube.pods())


# --- helpers ----------------------------------------------------------------------------------


def allocatable(kube: Kube, node: str) -> dict[str, str]:
    return kube.json("get", "node", node)["status"].get("allocatable") or {}


def pod(ns: str, name: str, *, limits: dict[str, str], annotations: dict[str, str] | None = None,
        init: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A busybox pod for the chart's scheduler that prints the devices it was handed; ``init``:
    the limits of a plain init container that runs to completion first."""
    script = ("echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo LIMIT=$OMATICAYA_GPU_MEMORY_LIMIT_MIB; "
              "echo MOUNTS=$(ls /var/run/nvidia-container-devices 2>/dev/null | tr '\\n' ' '); "
              "sleep 3600")  # fmt: skip
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "tolerations": [DEV_TAINT],
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script], "resources": {"limits": limits}}],
    }  # fmt: skip
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": IMAGE, "imagePullPolicy": "Never",
                                   "command": ["sh", "-c", "echo init"],
                                   "resources": {"limits": init}}]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": spec}  # fmt: skip


def whole(ns: str, name: str, memory: str) -> dict[str, Any]:
    """One whole GPU of the renamed resource with ``memory`` free (the extender's annotation)."""
    return pod(ns, name, limits={GPU: "1"}, annotations={MEMORY: memory})


def apply(s: Stack, *docs: dict[str, Any]) -> None:
    path = s.tmp / f"pods-{len(list(s.tmp.glob('pods-*')))}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    s.kube.kubectl("apply", "-f", str(path))


def pods_in(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.json("-n", ns, "get", "pods")["items"]}


def printed(kube: Kube, ns: str, name: str) -> dict[str, str]:
    """What the container printed: VISIBLE, LIMIT and MOUNTS (once it has printed MOUNTS)."""
    out = kube.kubectl("-n", ns, "logs", name, "-c", "c", check=False).stdout
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return seen if "MOUNTS" in seen else {}


def holders(kube: Kube, node: str) -> dict[tuple[str, str], set[int]]:
    """(namespace, pod) -> the GPUs the telemetry says the kubelet gave it (PodResources)."""
    notes = kube.json("get", "node", node)["metadata"].get("annotations") or {}
    doc = json.loads(notes.get(PREFIX + "telemetry", "{}"))
    out: dict[tuple[str, str], set[int]] = {}
    for g in doc.get("gpus") or []:
        for p in g.get("pods") or []:
            out.setdefault((p.get("namespace"), p["pod"]), set()).add(g["index"])
    return out


def failed_scheduling(kube: Kube, ns: str, name: str) -> list[str]:
    """The messages of ``name``'s FailedScheduling events."""
    events = kube.json("-n", ns, "get", "events")["items"]
    return [e.get("message", "") for e in events
            if e.get("reason") == "FailedScheduling" and e["involvedObject"].get("name") == name]  # fmt: skip


def admission_failures(kube: Kube, ns: str) -> list[str]:
    """Pods Failed at admission, and the kubelet's UnexpectedAdmissionError events."""
    failed = [n for n, p in pods_in(kube, ns).items() if p["status"].get("phase") == "Failed"]
    events = kube.json("-n", ns, "get", "events")["items"]
    return failed + [e["message"] for e in events if e.get("reason") == "UnexpectedAdmissionError"]


def waits_with_the_extenders_reason(kube: Kube, ns: str, name: str) -> str:
    """Wait until ``name`` is Unschedulable with the extender's reason, in its PodScheduled
    condition and in a FailedScheduling event; return the event's message. Fails at once when
    it is bound instead, naming the GPU the kubelet gave it once it printed it."""

    def settled() -> dict[str, Any] | None:
        p = pods_in(kube, ns)[name]
        return p if p["spec"].get("nodeName") or extender_reason(unschedulable(p)) else None

    p = wait_for(f"{name} Unschedulable by the extender (or bound)", settled)
    if p["spec"].get("nodeName"):
        got = waiting.wait_for(f"{name}'s devices printed", lambda: printed(kube, ns, name) or (
            pods_in(kube, ns)[name]["status"].get("phase") == "Failed" and {"phase": "Failed"}),
            timeout_s=60, every_s=0.5)  # fmt: skip
        pytest.fail(f"{name} was bound to {p['spec']['nodeName']} and got {got}; "
                    f"events: {failed_scheduling(kube, ns, name)} {admission_failures(kube, ns)}")  # fmt: skip
    return str(wait_for(f"{name}'s FailedScheduling event by the extender", lambda: next(
        (m for m in failed_scheduling(kube, ns, name) if extender_reason(m)), None)))  # fmt: skip


def never_bound(kube: Kube, ns: str, name: str) -> None:
    p = pods_in(kube, ns)[name]
    assert not p["spec"].get("nodeName"), p
    assert p["status"].get("phase") == "Pending", p["status"]


def gpu_of(uuid_text: str) -> int:
    """The trace's GPU index of a UUID (``uuid``)."""
    (index,) = [i for i in range(8) if uuid(i) == uuid_text]
    return index


@pytest.fixture
def ns(stack: Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the case's own, once no pod holds a GPU in the telemetry (the last case's
    pods gone from the kubelet's books); deleted at the end."""
    kube = stack.kube
    name = "seam-" + request.node.name.split("_")[1]
    wait_for("the telemetry with no pod holding a GPU", lambda: (
        '"gpus"' in (kube.json("get", "node", stack.node)["metadata"].get("annotations") or {}).get(
            PREFIX + "telemetry", "") and not holders(kube, stack.node)))  # fmt: skip
    kube.kubectl("create", "namespace", name)
    wait_for(f"{name}'s default ServiceAccount", lambda: kube.kubectl(
        "-n", name, "get", "serviceaccount", "default", check=False).returncode == 0)  # fmt: skip
    try:
        yield name
    finally:
        kube.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", check=False)


# --- (a) ----------------------------------------------------------------------------------------


def test_a_an_init_container_slice_no_gpu_holds_is_never_bound(stack: Stack, ns: str) -> None:
    """Three pods of 45 units take one shared GPU each (no GPU has room for two: the room left
    is 34 / 4 / 24 / 9 units on GPUs 0-3); a pod whose plain init container asks 40 units and
    its app container 5 fits nowhere: it stays Pending with the extender's reason, never bound,
    never Failed at admission. Its twin with a 30-unit init container fits GPU 0 and runs."""
    kube = stack.kube
    fillers = [f"fill-{i}" for i in range(3)]
    apply(stack, *(pod(ns, n, limits={UNITS: "45"}) for n in fillers))
    wait_for(
        "the 45-unit pods Running", lambda: all(running(p) for p in pods_in(kube, ns).values())
    )

    def fillers_held() -> dict[tuple[str, str], set[int]] | None:
        h = holders(kube, stack.node)
        return h if all((ns, n) in h for n in fillers) else None

    held = wait_for("the telemetry naming the 45-unit pods' GPUs", fillers_held)
    on = sorted(next(iter(held[(ns, n)])) for n in fillers)
    assert on == [0, 1, 2], held  # one each: 81,079 / 50,359 / 70,839 MiB hold one 45 GiB slice
    for n in fillers:
        assert wait_for(f"{n}'s devices printed", lambda n=n: printed(kube, ns, n))["LIMIT"] == str(
            45 * 1024
        )

    apply(stack, pod(ns, "init-40", limits={UNITS: "5"}, init={UNITS: "40"}))
    message = waits_with_the_extenders_reason(kube, ns, "init-40")
    assert f"40 units of {UNITS}" in message, message  # judged by its init container, not its 5
    never_bound(kube, ns, "init-40")

    # the same shape within room: 30 units fit on GPU 0 (34 left), the app container reuses them
    apply(stack, pod(ns, "init-30", limits={UNITS: "5"}, init={UNITS: "30"}))
    wait_for("init-30 Running", lambda: running(pods_in(kube, ns)["init-30"]))
    seen = wait_for("init-30's devices printed", lambda: printed(kube, ns, "init-30"))
    assert seen["VISIBLE"] == uuid(0), seen

    never_bound(kube, ns, "init-40")
    assert extender_reason(unschedulable(pods_in(kube, ns)["init-40"]))
    assert admission_failures(kube, ns) == []


# --- (b) ----------------------------------------------------------------------------------------


def test_b_with_the_gpu_resource_renamed_assigned_gpus_are_never_offered_again(
    stack: Stack, ns: str
) -> None:
    """Two 60 GiB pods of ``example.com/gpu`` get GPUs 4 and 6 (the only ones with 60 GiB free),
    which the telemetry then names as theirs (the kubelet's holders of the renamed resource);
    once it does, no reservation is needed to keep them: a third 60 GiB pod stays Pending with
    the extender's reason, and a 30 GiB pod gets GPU 5, the one left with room, never 4 or 6."""
    kube = stack.kube
    first = ["whole-1", "whole-2"]
    apply(stack, *(whole(ns, n, "60Gi") for n in first))
    wait_for(
        "the two 60 GiB pods Running", lambda: all(running(p) for p in pods_in(kube, ns).values())
    )
    got = {n: wait_for(f"{n}'s devices printed", lambda n=n: printed(kube, ns, n)) for n in first}
    given = {n: gpu_of(seen["VISIBLE"]) for n, seen in got.items()}
    assert sorted(given.values()) == [4, 6], got
    for n, seen in got.items():
        assert seen["MOUNTS"].split() == [uuid(given[n])], seen
    wait_for("the telemetry naming each 60 GiB pod's GPU (the renamed resource's holders)", lambda: all(
        holders(kube, stack.node).get((ns, n)) == {given[n]} for n in first))  # fmt: skip

    apply(stack, whole(ns, "whole-3", "60Gi"))
    waits_with_the_extenders_reason(kube, ns, "whole-3")
    never_bound(kube, ns, "whole-3")

    apply(stack, whole(ns, "whole-30", "30Gi"))
    wait_for("the 30 GiB pod Running", lambda: running(pods_in(kube, ns)["whole-30"]))
    seen = wait_for("its devices printed", lambda: printed(kube, ns, "whole-30"))
    assert seen["VISIBLE"] == uuid(5) and seen["MOUNTS"].split() == [uuid(5)], seen
    wait_for("the telemetry naming the 30 GiB pod's GPU", lambda: (
        holders(kube, stack.node).get((ns, "whole-30")) == {5}))  # fmt: skip

    never_bound(kube, ns, "whole-3")
    assert extender_reason(unschedulable(pods_in(kube, ns)["whole-3"]))
    assert admission_failures(kube, ns) == []


# --- (c) ----------------------------------------------------------------------------------------


def test_c_a_pod_of_a_slice_and_a_whole_gpu_gets_both_and_the_next_exclusive_pod_neither(
    stack: Stack, ns: str
) -> None:
    """A 60 GiB pod holds GPU 4, so of the whole GPUs only GPU 6 has 40 GiB free. A pod of a
    40 GiB whole GPU and 5 units gets both: GPU 6 (checked for its 40 GiB) and a slice of a
    shared GPU. A 40 GiB exclusive pod applied with it, right after it (scheduled before the
    telemetry can show the first: only the extender's reservation of its whole GPU keeps it), is
    placed on neither: with GPU 6 reserved it fits nowhere, and stays Pending with the extender's
    reason (before the fix it was bound and the kubelet gave it GPU 5, 34 GiB free)."""
    kube = stack.kube
    apply(stack, whole(ns, "holder", "60Gi"))
    wait_for("the 60 GiB pod Running", lambda: running(pods_in(kube, ns)["holder"]))
    seen = wait_for("its devices printed", lambda: printed(kube, ns, "holder"))
    held_by_holder = gpu_of(seen["VISIBLE"])
    assert held_by_holder in ROOM_40GIB, seen
    wait_for("the telemetry naming the 60 GiB pod's GPU", lambda: (
        holders(kube, stack.node).get((ns, "holder")) == {held_by_holder}))  # fmt: skip
    (free_whole,) = ROOM_40GIB - {held_by_holder}

    # one apply, "both" first: kube-scheduler takes them in that order (same priority, queued
    # first) and filters "next" right after "both", before the kubelet admits it: only the
    # extender's reservation of "both"'s whole GPU can keep "next" off it
    apply(stack, pod(ns, "both", limits={GPU: "1", UNITS: "5"}, annotations={MEMORY: "40Gi"}),
          whole(ns, "next", "40Gi"))  # fmt: skip

    wait_for("the slice + whole GPU pod Running", lambda: running(pods_in(kube, ns)["both"]))
    seen = wait_for("its devices printed", lambda: printed(kube, ns, "both"))
    mounts = {gpu_of(u) for u in seen["MOUNTS"].split()}
    assert len(mounts) == 2 and free_whole in mounts, seen  # the whole GPU with its 40 GiB
    (shared,) = mounts - {free_whole}
    assert shared in SHARED, seen  # and a slice of a shared GPU
    assert seen["LIMIT"] == str(5 * 1024), seen
    wait_for("the telemetry naming both of its GPUs", lambda: (
        holders(kube, stack.node).get((ns, "both")) == {free_whole, shared}))  # fmt: skip

    waits_with_the_extenders_reason(kube, ns, "next")
    never_bound(kube, ns, "next")
    assert (ns, "next") not in holders(kube, stack.node)
    assert admission_failures(kube, ns) == []


# --- (d) ----------------------------------------------------------------------------------------


def test_d_pods_of_the_gpu_resource_alone_count_in_flight(stack: Stack, ns: str) -> None:
    """Two pods asking ``example.com/gpu`` alone (no memory annotation) and a 60 GiB pod, in one
    apply. The device plugin hands the two the GPUs with the most free memory, 4 and 6 (the
    only ones with 60 GiB free), and the extender predicts it: the 60 GiB pod, filtered before
    the kubelet admits them, stays Pending with the extender's reason (before the fix the two
    passed unrecorded, the 60 GiB pod was reserved on GPU 4, bound, and given GPU 5, 34,999 MiB
    free). Once one of the two is deleted, the 60 GiB pod is admitted on the GPU it held, which
    holds 60 GiB: each pod on a GPU that holds it."""
    kube = stack.kube
    bare = ["bare-1", "bare-2"]
    # one apply, the two first: kube-scheduler filters the 60 GiB pod right after them, before
    # the telemetry can show either (only the extender's in-flight book can keep it off)
    apply(stack, *(pod(ns, n, limits={GPU: "1"}) for n in bare), whole(ns, "big", "60Gi"))
    wait_for("the two pods of the GPU resource alone Running", lambda: all(
        running(pods_in(kube, ns)[n]) for n in bare))  # fmt: skip
    seen = {n: wait_for(f"{n}'s devices printed", lambda n=n: printed(kube, ns, n)) for n in bare}
    given = {n: gpu_of(s["VISIBLE"]) for n, s in seen.items()}
    assert set(given.values()) == ROOM_40GIB, seen  # the two most free: the plugin's order
    waits_with_the_extenders_reason(kube, ns, "big")
    never_bound(kube, ns, "big")

    kube.kubectl("-n", ns, "delete", "pod", "bare-2", "--wait=true", "--timeout=120s")
    wait_for("the 60 GiB pod Running", lambda: running(pods_in(kube, ns)["big"]))
    got = wait_for("its devices printed", lambda: printed(kube, ns, "big"))
    assert gpu_of(got["VISIBLE"]) == given["bare-2"], (got, given)  # 81,079 or 75,959 MiB free
    wait_for("the telemetry naming the 60 GiB pod's GPU", lambda: (
        holders(kube, stack.node).get((ns, "big")) == {given["bare-2"]}))  # fmt: skip
    assert admission_failures(kube, ns) == []
