"""End to end (issue 37, "preemption by GPU memory"): a real kube-scheduler (1.22 or later) runs
DefaultPreemption itself and asks the extender's ``/preempt`` (``scheduler.preempt``) which pods
go, over Nodes and pods on a real kube-apiserver.

The kube-scheduler reads the example KubeSchedulerConfiguration of its release
(``ExtenderScheduler``: ``examples/scheduler/scheduler-config-v1.yaml``, whose extender entry is
the chart's: ``filterVerb``, ``prioritizeVerb``, ``preemptVerb``, ``nodeCacheCapable``), with
its profile's DefaultPreemption on. Older kube-schedulers never call ``preemptVerb``
(kubernetes#102971, v1.20.2 among them): the module skips there, saying so (read from
``/version``).

Nodes are written as an agent writes them (labels and telemetry rendered by core from synthetic
snapshots, each GPU with the pods the kubelet gave it: ``tests/test_preemption.gpu_node``, valid
for an hour) and given ``nvidia.com/gpu`` in their allocatable, one per GPU, as a device plugin
advertises them; no kubelet runs, so the pods holding the GPUs are created already bound
(``spec.nodeName``), each asking ``nvidia.com/gpu: 1``, with a ``status.startTime`` that fixes
kube-scheduler's order among pods of one priority (the ``gpu-*`` PriorityClasses of
``examples/scheduler/priorityclasses.yaml``):

    fits    GPU 0: 2000 MiB free, held by batch-big (75000 MiB, gpu-batch, started 10 min in)
            GPU 1: 1000 MiB free, held by batch-small (10000 MiB, gpu-batch, started first);
            batch-idle holds no GPU
    decoy   GPU 0: 76000 MiB free, held by resident (5000 MiB, gpu-serving: never a victim)
            GPU 1: 1000 MiB free, held by batch-one (20000 MiB, gpu-batch, started 20 min in)
    spare   GPU 0: no holder, 1000 MiB free (the rest used outside Kubernetes)

A ``gpu-serving`` pod asking one ``nvidia.com/gpu`` and 60 GiB fits kube-scheduler's count
(spare has a GPU to give) but no free GPU's memory. kube-scheduler's own dry run names one victim
on each full node (fits: batch-big, the newest; decoy: batch-one), the extender keeps fits and
drops decoy, whose only roomy GPU stays with a pod of the preemptor's priority (the extender
before b3949fb kept decoy too, counting that GPU's memory as room, and kube-scheduler, preferring
the newest victim, evicted batch-one for nothing, then batch-big). So exactly batch-big is evicted;
once the "agent" republishes fits without it, the pod binds there, its reservation on GPU 0.
(kube-scheduler's own victims stay victims: were its pick on fits batch-small, both would go.)
A ``gpu-training`` pod of 79000 MiB, which no eviction makes room for, evicts nothing and stays
Pending with the extender's reason.

Issue 48 item 6, nodes kube-scheduler cannot offer: a fourth Node, made by its test, is the
multi-GPU trace's case (``COUNTED``): four priority-0 30 GiB pods on GPUs 1, 2, 5 and 6, GPUs 3
and 7 free by count with 9 and 3 GiB free, GPUs 0 and 4 held by ``gpu-serving`` pods. Its count
fits a one-GPU pod, so kube-scheduler's dry run names no victim there and drops it ("expected at
least one victim pod on node"); the extender adds it, since its filter failed it for room
alone, and names the one pod whose GPU then holds 60 GiB (the extender before this kept only the
nodes offered: on this cluster none, and the pod stayed Pending).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import yaml

from tests.scheduler.burst_cluster_support import ledger_scheduler
from tests.scheduler.preemption_cluster_support import (  # the names moved out, for this file's tests
    server_minor,  # noqa: F401
)
from tests.scheduler.preemption_support import gpu_node
from tests.scheduler.scheduling_cluster_support import (  # noqa: F401  (api: a module fixture)
    EXAMPLES,
    api,
    schedulable,
    unschedulable_message,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SCHEDULER = "omaticaya-preempt"
GPU = "nvidia.com/gpu"
TOTAL_MIB = 81_559
#: node role -> its GPUs: (free MiB, the pod the kubelet gave it and the MiB its processes use)
LAYOUT: dict[str, list[tuple[int, tuple[str, int] | None]]] = {
    "fits": [(2_000, ("batch-big", 75_000)), (1_000, ("batch-small", 10_000))],
    "decoy": [(76_000, ("resident", 5_000)), (1_000, ("batch-one", 20_000))],
    "spare": [(1_000, None)],
}
#: bound pod -> (node role, PriorityClass, minutes after the first started, whether it holds a GPU)
PODS = {
    "batch-small": ("fits", "gpu-batch", 0, True),
    "batch-big": ("fits", "gpu-batch", 10, True),
    "batch-idle": ("fits", "gpu-batch", 5, False),
    "resident": ("decoy", "gpu-serving", 0, True),
    "batch-one": ("decoy", "gpu-batch", 20, True),
}




def write_node(
    core: Any, node: str, ns: str, gpus: list[tuple[int, tuple[str, int] | None]]
) -> None:
    """Labels and telemetry on ``node`` as the agent would write them now (valid for an hour)."""
    named = [(free, [(f"{ns}/{h[0]}", h[1])] if h else []) for free, h in gpus]
    doc = gpu_node(node, named, read_at=datetime.now(timezone.utc), refresh_s=3600,
                   total_mib=TOTAL_MIB)  # fmt: skip
    core.patch_node(node, {"metadata": {k: doc["metadata"][k] for k in ("labels", "annotations")}})


def make_node(core: Any, node: str, ns: str, role: str) -> None:
    """A schedulable Node as its agent and device plugin leave it, and the pods bound to it."""
    on_node = {pod: rest for pod, (where, *rest) in PODS.items() if where == role}
    add_node(core, node, ns, LAYOUT[role], on_node)


def add_node(core: Any, node: str, ns: str, gpus: list[tuple[int, tuple[str, int] | None]],
             pods: dict[str, Any]) -> None:  # fmt: skip
    """``node`` with ``gpus`` (as ``LAYOUT``'s) and ``pods`` bound to it: name ->
    (PriorityClass or ``None``: priority 0, minutes after the first started, holds a GPU)."""
    core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
    schedulable(core, node)
    count = {GPU: str(len(gpus))}
    core.patch_node_status(node, {"status": {"capacity": count, "allocatable": count}})
    write_node(core, node, ns, gpus)
    first = datetime.now(timezone.utc) - timedelta(hours=1)
    for pod, (klass, minutes, holds) in pods.items():
        resources = {"limits": {GPU: "1"}} if holds else {}
        spec = {"nodeName": node, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "busybox", "resources": resources}]}
        if klass is not None:
            spec["priorityClassName"] = klass
        core.create_namespaced_pod(ns, {"metadata": {"name": pod}, "spec": spec})  # fmt: skip
        started = (first + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
        core.patch_namespaced_pod_status(pod, ns, {"status": {"startTime": started}})


@pytest.fixture(scope="module")
def full(api, scheduling_cluster, tmp_path_factory) -> Iterator[dict[str, Any]]:  # noqa: F811
    """The example PriorityClasses, a namespace, the three Nodes and their pods, and a
    kube-scheduler whose extender (binpack, settle 600 s) fills the yielded ``ledger``."""
    from kubernetes import client

    minor = server_minor(api)
    if minor < 22:
        pytest.skip(f"kube-scheduler 1.{minor} never calls an extender's preemptVerb "
                    "(kubernetes#102971; docs/scheduling.md, Preemption): 1.22 or later")  # fmt: skip
    scheduling = client.SchedulingV1Api(api.api_client)
    made: list[str] = []
    ns = f"preempt-{os.getpid()}"
    names = {f"preempt-{role}-{os.getpid()}": role for role in LAYOUT}
    try:
        for doc in yaml.safe_load_all((EXAMPLES / "priorityclasses.yaml").read_text()):
            try:
                scheduling.create_priority_class(doc)
                made.append(doc["metadata"]["name"])
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        # preemption kube-scheduler does not ask for (the single-node case) is on: where it asks,
        # as in every other test here, the extender leaves the pod to it
        os.environ["OMATICAYA_EXTENDER_PREEMPT_UNASKED"] = "true"
        try:
            setup = ledger_scheduler(api, scheduling_cluster, tmp_path_factory.mktemp("preempt"),
                                     ns, SCHEDULER, names,
                                     lambda node, role: make_node(api, node, ns, role))  # fmt: skip
            first = next(setup)
        finally:
            os.environ.pop("OMATICAYA_EXTENDER_PREEMPT_UNASKED", None)
        try:
            yield first | {"roles": {role: n for n, role in names.items()}}
        finally:
            with suppress(client.ApiException):  # no kubelet: nothing else deletes them
                api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            setup.close()  # kube-scheduler and extender stopped, Nodes and namespace deleted
    finally:
        for name in made:
            scheduling.delete_priority_class(name)


def _pods(core: Any, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(ns).items}


def _preempt_decisions(url: str, verb: str = "preempt") -> Counter[tuple[str, str]]:
    """The extender's ``/preempt`` outcomes so far, per node (``verb`` preempt-unasked: its
    own preemption's, per pod): (result, reason) -> count."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Counter[tuple[str, str]] = Counter()
    for m in re.finditer(r"^omaticaya_extender_decisions_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("verb") == verb:
            out[(labels["result"], labels["reason"])] += int(float(m.group(2)))
    return out


def _preemptor(name: str, klass: str, memory: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {"omaticaya.io/gpu-memory-mib": memory}},
        "spec": {"schedulerName": SCHEDULER, "priorityClassName": klass,
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {GPU: "1"}}}]},
    }  # fmt: skip


def test_kube_scheduler_evicts_exactly_the_pod_whose_gpu_then_holds_the_preemptor(api, full):  # noqa: F811
    ns, roles, sched = full["ns"], full["roles"], full["sched"]
    before = _pods(api, ns)
    assert {p: before[p].spec.priority for p in PODS} == {
        "batch-small": 1000, "batch-big": 1000, "batch-idle": 1000, "resident": 100000,
        "batch-one": 1000}  # fmt: skip
    decided = _preempt_decisions(sched.url)
    api.create_namespaced_pod(ns, _preemptor("serving", "gpu-serving", "60Gi"))

    # kube-scheduler's DefaultPreemption asks /preempt and evicts what the extender kept
    wait_for("the serving pod to be nominated", lambda: api.read_namespaced_pod(
        "serving", ns).status.nominated_node_name, 60)  # fmt: skip
    assert api.read_namespaced_pod("serving", ns).status.nominated_node_name == roles["fits"]
    wait_for("batch-big to be evicted", lambda: "batch-big" not in _pods(api, ns), 30)
    asked = _preempt_decisions(sched.url) - decided
    assert asked[("kept", "")] >= 1 and asked[("dropped", "too-little")] >= 1, asked  # decoy
    preempted = wait_for("the Preempted event", lambda: {
        e.involved_object.name for e in api.list_namespaced_event(ns).items
        if e.reason == "Preempted"}, 30)  # fmt: skip
    assert preempted == {"batch-big"}
    left = _pods(api, ns)
    assert set(left) == set(before) - {"batch-big"} | {"serving"}, sorted(left)
    assert not any(p.metadata.deletion_timestamp for p in left.values())
    assert not left["serving"].spec.node_name, "nothing made room yet: the telemetry says so"

    # the agent on fits reads GPU 0 again: batch-big's memory is free, its holder gone
    freed = [(77_000, None), LAYOUT["fits"][1]]
    write_node(api, roles["fits"], ns, freed)

    def bound() -> str | None:
        return api.read_namespaced_pod("serving", ns).spec.node_name

    assert wait_for("the serving pod to bind", bound, 60) == roles["fits"]
    placed = full["ledger"].get(api.read_namespaced_pod("serving", ns).metadata.uid)
    assert placed is not None and placed.node == roles["fits"] and placed.gpus == (0,), placed
    left = _pods(api, ns)
    assert set(left) == set(before) - {"batch-big"} | {"serving"}, sorted(left)
    assert not any(p.metadata.deletion_timestamp for p in left.values())


def test_where_no_eviction_makes_room_nothing_is_evicted(api, full):  # noqa: F811
    """79000 MiB: fits' GPUs free at most 77000 and 11000, decoy's only roomy GPU stays with
    resident (gpu-serving, above gpu-training), spare has 1000: the extender drops both full
    nodes kube-scheduler offers, and the pod waits with the extender's reason."""
    ns, sched = full["ns"], full["sched"]
    before = _pods(api, ns)
    decided = _preempt_decisions(sched.url)
    api.create_namespaced_pod(ns, _preemptor("training", "gpu-training", "79000"))
    try:

        def asked() -> Counter[tuple[str, str]]:
            got = _preempt_decisions(sched.url) - decided
            return got if got[("dropped", "too-little")] >= 2 else Counter()

        got = wait_for("kube-scheduler to ask /preempt about both full nodes", asked, 60)
        assert got[("kept", "")] == 0, got
        message = unschedulable_message(api, ns, "training", 30)
        assert "pod needs a GPU with 79000 MiB free (omaticaya.io)" in message, message
        left = _pods(api, ns)
        assert set(left) == set(before) | {"training"}, sorted(left)
        assert not any(p.metadata.deletion_timestamp for p in left.values())
        training = left["training"]
        assert not training.spec.node_name and not training.status.nominated_node_name
    finally:
        api.delete_namespaced_pod("training", ns, grace_period_seconds=0)


#: the multi-GPU trace's node (issue 48 item 6): per GPU (free MiB, holder and its MiB)
COUNTED: list[tuple[int, tuple[str, int] | None]] = [
    (40_000, ("resident-0", 40_000)), (50_000, ("low-1", 30_720)), (50_000, ("low-2", 30_720)),
    (9_216, None), (40_000, ("resident-4", 40_000)), (50_000, ("low-5", 30_720)),
    (50_000, ("low-6", 30_720)), (3_072, None),
]  # fmt: skip
#: its pods: name -> (PriorityClass, None: priority 0; minutes after the first; holds a GPU)
COUNTED_PODS = {
    "resident-0": ("gpu-serving", 0, True), "resident-4": ("gpu-serving", 0, True),
    "low-1": (None, 1, True), "low-2": (None, 2, True), "low-5": (None, 5, True),
    "low-6": (None, 6, True),
}  # fmt: skip


def _filter_reason(url: str, node: str) -> str:
    """The extender's filter reason for ``node`` and a pod without a uid asking 60 GiB."""
    body = json.dumps({"Pod": {"metadata": {"name": "probe", "namespace": "x", "annotations": {
        "omaticaya.io/gpu-memory-mib": "61440"}}}, "NodeNames": [node]}).encode()  # fmt: skip
    req = urllib.request.Request(url + "/filter", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(json.loads(r.read())["FailedNodes"].get(node, ""))


def test_a_node_whose_count_fits_gets_the_victim_its_gpu_memory_needs(api, full):  # noqa: F811
    """kube-scheduler offers the full nodes only (each too little); the extender adds the
    trace's node, and exactly the newest 30 GiB pod there is evicted for the 60 GiB pod."""
    ns, sched = full["ns"], full["sched"]
    node = f"preempt-counted-{os.getpid()}"
    try:
        add_node(api, node, ns, COUNTED, COUNTED_PODS)
        wait_for("the extender to judge the new node by its room",
                 lambda: "no room" in _filter_reason(sched.url, node), 30)  # fmt: skip
        decided = _preempt_decisions(sched.url)
        api.create_namespaced_pod(ns, _preemptor("serving-counted", "gpu-serving", "60Gi"))
        wait_for("serving-counted to be nominated", lambda: api.read_namespaced_pod(
            "serving-counted", ns).status.nominated_node_name, 60)  # fmt: skip
        assert api.read_namespaced_pod("serving-counted", ns).status.nominated_node_name == node
        asked = _preempt_decisions(sched.url) - decided
        assert asked[("kept", "added")] >= 1, asked
        wait_for("low-6 to be evicted", lambda: "low-6" not in _pods(api, ns), 30)
        preempted = wait_for("the Preempted event", lambda: {
            e.involved_object.name for e in api.list_namespaced_event(ns).items
            if e.reason == "Preempted" and e.involved_object.name in COUNTED_PODS}, 30)  # fmt: skip
        assert preempted == {"low-6"}
        left = _pods(api, ns)
        assert set(COUNTED_PODS) - set(left) == {"low-6"}, sorted(left)

        # the agent reads GPU 6 again: low-6's memory free, its holder gone
        write_node(api, node, ns, [*COUNTED[:6], (80_720, None), COUNTED[7]])

        def bound() -> str | None:
            return api.read_namespaced_pod("serving-counted", ns).spec.node_name

        assert wait_for("serving-counted to bind", bound, 60) == node
        placed = full["ledger"].get(api.read_namespaced_pod("serving-counted", ns).metadata.uid)
        assert placed is not None and placed.node == node and placed.gpus == (6,), placed
        # low-6 gone, its GPU not yet read again: a later cycle charged nobody else
        left = _pods(api, ns)
        assert set(COUNTED_PODS) - set(left) == {"low-6"}, sorted(left)
        assert not any(left[p].metadata.deletion_timestamp for p in set(COUNTED_PODS) & set(left))
    finally:
        for pod in ("serving-counted", *COUNTED_PODS):
            with suppress(Exception):
                api.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
        with suppress(Exception):
            api.delete_node(node)


#: the trace's node again, its pods named alone-*: the only node the preemptor may go to
ALONE = [(free, (f"alone-{h[0]}", h[1]) if h else None) for free, h in COUNTED]
ALONE_PODS = {f"alone-{name}": rest for name, rest in COUNTED_PODS.items()}


def test_where_every_count_fits_the_extender_evicts_though_kube_scheduler_does_not_ask(api, full):  # noqa: F811
    """Issue 48 item 6, where kube-scheduler offers no node at all: a pod that asks its GPU
    memory by annotation alone passes every node's in-tree filters (as a one-GPU-node cluster's
    pod does), so kube-scheduler's dry run names no victim anywhere and never calls /preempt
    ("expected at least one victim pod on node"; before, the pod stayed Pending). With
    ``preemptUnasked`` the extender evicts what /preempt would have named, on the node
    kube-scheduler would pick: the trace's node, whose newest priority-0 30 GiB pod frees a GPU
    of 60 GiB (fits offers a gpu-batch victim when run alone: the least important goes), with
    its Events, and the pod binds there once the agent reads GPU 6 again. That last step is
    kube-scheduler's retry, not ours: a pod an in-tree plugin also rejected somewhere (pinned by
    a nodeSelector, or a tainted Node another module left: CI saw three) is retried after the
    Node's update only when that plugin's queueing hint allows, up to 5 minutes later; the pod
    tolerates every taint, and a retry not seen within 90 s is printed, not failed."""
    ns, sched = full["ns"], full["sched"]
    node = f"preempt-alone-{os.getpid()}"
    tainted = f"preempt-tainted-{os.getpid()}"
    pod = "serving-alone"
    try:
        add_node(api, node, ns, ALONE, ALONE_PODS)
        # a tainted Node without an agent, as the suite's other modules leave them (CI's run of
        # this test failed on three): tolerated, it is the extender's to refuse (no telemetry)
        api.create_node({"metadata": {"name": tainted}})
        schedulable(api, tainted)
        api.patch_node(tainted, {"spec": {"taints": [
            {"key": "example.com/other", "value": "x", "effect": "NoSchedule"}]}})  # fmt: skip
        wait_for("the extender to judge the new node by its room",
                 lambda: "no room" in _filter_reason(sched.url, node), 30)  # fmt: skip
        asked, done = _preempt_decisions(sched.url), _preempt_decisions(sched.url, "preempt-unasked")
        doc = _preemptor(pod, "gpu-serving", "60Gi")
        del doc["spec"]["containers"][0]["resources"]  # by annotation alone: every count fits
        # and every taint tolerated: the suite's other modules leave tainted Nodes behind, and a
        # pod that TaintToleration rejected somewhere is not retried on a Node's label update
        # (its queueing hint skips it) but up to 5 minutes later (docs/scheduling.md); rejected
        # by the extender alone, it is retried at the next event, as on a one-GPU-node cluster
        doc["spec"]["tolerations"] = [{"operator": "Exists"}]
        api.create_namespaced_pod(ns, doc)
        wait_for("alone-low-6 to be evicted", lambda: "alone-low-6" not in _pods(api, ns), 60)
        left = _pods(api, ns)
        assert set(ALONE_PODS) - set(left) == {"alone-low-6"}, sorted(left)
        # kube-scheduler's preemption failed before asking, and nominated nothing
        message = unschedulable_message(api, ns, pod)
        print(f"[preempt] alone: kube-scheduler said: {message[:300]}")
        assert "expected at least one victim pod" in message, message
        assert api.read_namespaced_pod(pod, ns).status.nominated_node_name is None
        own = _preempt_decisions(sched.url, "preempt-unasked") - done
        # one pod evicted; the node kept as /preempt would have (counted apart from its calls)
        assert own[("evicted", "")] == 1 and own[("kept", "added")] >= 1, own
        assert not own[("refused", "pdb")], own
        assert not (_preempt_decisions(sched.url) - asked)[("kept", "added")], "asked after all"
        told = wait_for("the Events on both pods", lambda: {
            (e.involved_object.name, e.reason) for e in api.list_namespaced_event(ns).items
            if e.reason in ("PreemptedForGpuMemory", "GpuPreemption")} or None, 30)  # fmt: skip
        assert told == {("alone-low-6", "PreemptedForGpuMemory"), (pod, "GpuPreemption")}, told

        # the agent reads GPU 6 again: low-6's memory free, its holder gone
        write_node(api, node, ns, [*ALONE[:6], (80_720, None), ALONE[7]])

        def bound() -> str | None:
            return api.read_namespaced_pod(pod, ns).spec.node_name

        try:
            bound_to = wait_for(f"{pod} to bind", bound, 90)
        except AssertionError:
            # kube-scheduler's retry, not ours: a Node another module left that an in-tree
            # plugin rejects (CI saw three) makes it wait for that plugin's queueing hint, up
            # to its 5 minutes in the unschedulable queue (docs/scheduling.md)
            message = unschedulable_message(api, ns, pod)
            print(f"[preempt] alone: not retried by kube-scheduler within 90 s: {message[:300]}")
            return
        assert bound_to == node
        placed = full["ledger"].get(api.read_namespaced_pod(pod, ns).metadata.uid)
        assert placed is not None and placed.node == node and placed.gpus == (6,), placed
        left = _pods(api, ns)
        assert set(ALONE_PODS) - set(left) == {"alone-low-6"}, sorted(left)
    finally:
        for name in (pod, *ALONE_PODS):
            with suppress(Exception):
                api.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        for name in (node, tainted):
            with suppress(Exception):
                api.delete_node(name)
