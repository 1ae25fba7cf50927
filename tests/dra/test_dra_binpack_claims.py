"""Issue 51, item 2: binpack and spread by live memory under DRA, without the extender: the
claims of docs/dra.md ("Binpack and spread by live memory, without the extender"), applied as
written against the real kube-scheduler of the light dev cluster (kube-apiserver, etcd and the
default kube-scheduler, v1.37.2; no kubelet: the scheduler allocates each claim, writes
``status.allocation`` and binds the pod, which then stays Pending for want of a kubelet).

Each test makes three Nodes (schedulable as a kubelet would make them) whose ResourceSlices
the real agent publishes (``Agent.tick`` replaying a trace, DRA on): 8 H100s each, their free
memory from ``tests/data/multi-gpu-trace.json`` (79 49 69 9 79 34 74 3 GiB once rounded down to
1 GiB steps) or from traces written here with chosen free GiB per GPU (``write_frees``). The
pods select these Nodes by a label, so nothing else in the cluster competes.

The placements are compared with our extender's choice on the same GPUs, by the product's
placement model: ``core.allocation.placement.pick_memory(..., policy)`` over every GPU of the
three nodes not yet taken (the tightest GPU that fits under ``binpack``, the roomiest under
``spread``), and for slices ``pick_slice`` over the shared GPUs with their room.

a. ``binpack-example: whole-gpu`` (20 GiB, ranges cut at 1, 2, 4 ... GiB above the need): five
   pods in turn land on the GPU with the least free memory that fits, across the nodes (the
   extender's choice); the sixth has only GPUs of the last range left, all on one node, and gets
   the first of them in slice order (79 GiB) where the extender takes 69 GiB: the granularity
   the docs state.
b. ``binpack-example: whole-gpu-spread`` (ranges even, most free first): seven pods land on the
   roomiest GPU that fits, in the extender's spread order; the eighth finds no GPU with 20 GiB
   and stays Pending with the scheduler's reason.
c. ``binpack-example: shared-slice`` (20 GiB slices of shared GPUs, consumable capacity): the
   first slice goes to the tightest shared GPU; once its memory use is published (the agent's
   next tick on a trace where that GPU has 20 GiB less), the next goes to the next tightest.
d. The other scores: node X has a GPU in ``r0`` but 60 of its 64 CPUs requested, node Y a GPU
   in ``r1`` and none: the default profile sends the pod to Y (NodeResourcesFit and
   BalancedAllocation outweigh one range), a second kube-scheduler whose profile weighs
   DynamicResources 10 (the docs' setting) sends the next to X.

Every wait is on a condition with a deadline; the time each took is printed. Kubernetes 1.37
only (DRA's ``resource.k8s.io/v1``, the prioritized list's scoring, consumable capacity on by
default): skipped, saying why, on an older dev cluster.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.dra_binpack import claim_template
from devtools.devcluster.cluster import K8S_VERSION, minor
from omaticaya_py.core.allocation.placement import pick_memory, pick_slice
from omaticaya_py.core.publish.dra import DRIVER, slice_name
from omaticaya_py.core.schema import GpuInfo
from tests.dra.claims_support import (
    ClaimSpace,
    chart_device_classes,
    create_device_classes,
    delete_device_classes,
    marked_blocks,
    resource_api,
)
from tests.helpers import MULTI_TRACE
from tests.scheduler.scheduling_cluster_support import (
    bound_node,
    schedulable,
    unschedulable_message,
)
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]

GIB = 1024
NEED_MIB = 20 * GIB
#: the marked blocks of the docs' section: the arguments of the generator that gives each
EXAMPLES = {
    "whole-gpu": {"policy": "binpack", "spacing": "doubling", "shared": False},
    "whole-gpu-spread": {"policy": "spread", "spacing": "even", "shared": False},
    "shared-slice": {"policy": "binpack", "spacing": "doubling", "shared": True},
}
#: the multi-GPU trace's free memory per GPU as published (rounded down to 1 GiB steps)
MULTI_FREE_GIB = (79, 49, 69, 9, 79, 34, 74, 3)
#: the label the test's Nodes carry and its pods select (not under omaticaya.io/: the agent
#: owns its prefix and removes any label there it did not write)
MINE = "binpack-test.example.com/run"
BIND_S, PENDING_S = 30.0, 30.0

on_137 = pytest.mark.skipif(
    minor() < 35,
    reason=f"Kubernetes {K8S_VERSION}: these claims need DRA's resource.k8s.io/v1 (1.34) and the "
    "scheduler's scoring of prioritized lists (from 1.35: kubernetes/kubernetes#134711; 1.34 takes "
    "the first node that fits); consumable capacity is on by default from 1.36, and the dev "
    "cluster turns its gate on for 1.35 (devtools/devcluster/cluster.py, feature_gates)",
)

def doc_examples() -> dict[str, dict[str, Any]]:
    """The YAML blocks of docs/dra.md marked ``<!-- binpack-example: NAME -->``, by NAME."""
    return marked_blocks("binpack-example")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_docs_example_is_what_the_generator_prints(name):
    """No cluster: each marked block is there once and is exactly the generator's claim
    (``bench/dra_binpack.py --claim 20 --gpu-gib 80 ...``) for a 20 GiB need on 80 GiB GPUs."""
    blocks = doc_examples()
    assert set(blocks) == set(EXAMPLES)
    body = blocks[name]
    want = claim_template(body["metadata"]["name"], NEED_MIB, 80 * GIB, **EXAMPLES[name])
    assert body == want
    subs = body["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert 1 < len(subs) <= 8  # resourceapi.FirstAvailableDeviceRequestMaxSize


# -- the cluster's side --------------------------------------------------------------------------


def write_frees(path: Path, free_gib: list[int], later_gib: list[int] | None = None) -> Path:
    """A trace of the multi-GPU trace's 8 H100s whose GPU ``k`` has ``free_gib[k]`` GiB free
    (``later_gib[k]`` from its second sample on, at t = 1 s: what the agent's next tick reads)."""
    base = json.loads(MULTI_TRACE.read_text())
    first = base["samples"][0]

    def sample(t: float, gib: list[int]) -> dict[str, Any]:
        out = copy.deepcopy(first)
        out["t"] = t
        for g, free_gib_k in zip(out["gpus"], gib, strict=True):
            total = g["memory_bytes"]["total"]
            free = free_gib_k * GIB * GIB * GIB
            g["memory_bytes"].update(free=free, used=total - free)
            if "memory_v2_bytes" in g:
                v2 = g["memory_v2_bytes"]
                v2.update(free=free, used=max(0, total - free - v2["reserved"]))
        return out

    base["samples"] = [sample(0.0, free_gib), sample(1.0, later_gib or free_gib)]
    path.write_text(json.dumps(base))
    return path


class Published:
    """The real agent of one Node (DRA on) replaying ``trace``: its first tick publishes the
    Node's labels and ResourceSlice; ``next`` reads the trace's second sample and ticks again."""

    def __init__(self, dev_cluster: Any, node: str, trace: Path, shared: bool) -> None:
        from omaticaya_py.agent import Agent, NodeApi
        from omaticaya_py.core.config.settings import load_settings
        from omaticaya_py.kube import NodeClient
        from omaticaya_py.sources.replay import TraceReader
        from tests.helpers import Clock

        self.clock = Clock()
        sharing: dict[str, Any] = (
            {"shared_gpus": "all", "share_enforcement": "none"} if shared else {}
        )
        settings = load_settings(node_name=node, dra=True, **sharing)
        self.reader = TraceReader(str(trace), at_s=0.0, loop=False, clock=self.clock)
        client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
        self.agent = Agent(
            settings, self.reader, NodeApi(client, lease=None), clock=self.clock, attribution=None
        )
        self.agent.tick()
        assert self.agent.cache.slice_writes == 1, "the agent wrote no ResourceSlice"

    def next(self) -> None:
        before = self.agent.cache.slice_writes
        self.reader.at_s = 1.0
        self.clock.t += 10.0
        self.agent.tick()
        assert self.agent.cache.slice_writes == before + 1, "the drop was not written at once"


def published_free_gib(admin_client: Any, node: str) -> dict[str, int]:
    """Device name -> ``freeMemoryMiB`` / 1024 as the API server stores the Node's slice."""
    s = resource_api(admin_client).read_resource_slice(slice_name(node))
    out = {}
    for d in s.spec.devices:
        free = d.attributes["freeMemoryMiB"].int
        assert free % GIB == 0, (d.name, free)
        out[d.name] = free // GIB
    return out


@pytest.fixture(scope="module")
def device_classes(helm: dict[str, Any], admin_client: Any) -> Iterator[None]:
    """The chart's DeviceClasses, rendered with ``dra.enabled`` for this release (created, and
    deleted after the module, unless one of that name was there)."""
    if minor() < 35:
        pytest.skip(f"Kubernetes {K8S_VERSION}: no resource.k8s.io/v1")
    classes = chart_device_classes(helm)
    assert {DRIVER, f"shared.{DRIVER}"} <= {c["metadata"]["name"] for c in classes}
    created = create_device_classes(admin_client, classes)
    yield
    delete_device_classes(admin_client, created)


class Space(ClaimSpace):
    """A namespace of the test's (``claims_support.ClaimSpace``) with pods of one claim each."""

    def template(self, body: dict[str, Any]) -> None:
        self.resource.create_namespaced_resource_claim_template(self.name, body)

    def pod(self, name: str, template: str, run: str, scheduler: str | None = None) -> None:
        """A pod of one container using a claim ``gpu`` from ``template``, on the Nodes labelled
        ``MINE=run``; its ResourceClaim made as the resourceclaim controller makes it (the
        template's spec, owned by the pod, the pod's claim name annotated, recorded in the pod's
        ``status.resourceClaimStatuses``)."""
        self.core.create_namespaced_pod(self.name, {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {MINE: run},
                **({"schedulerName": scheduler} if scheduler else {}),
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                "containers": [{"name": "app", "image": "my-cuda-app",
                                "resources": {"claims": [{"name": "gpu"}]}}],
            },
        })  # fmt: skip
        self.claims_from_templates(name)

    def placed(self, pod: str) -> tuple[str, str, str]:
        """(node, device, subrequest) the scheduler gave ``pod``'s claim, once bound (at most
        ``BIND_S``); prints how long it took."""
        start = time.monotonic()
        try:
            node = bound_node(self.core, self.name, pod, BIND_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.why_not(pod)}") from None
        st = self.core.read_namespaced_pod(pod, self.name).status.resource_claim_statuses
        claim = st[0].resource_claim_name

        def result() -> tuple[str, str, str] | None:
            c = self.resource.read_namespaced_resource_claim(claim, self.name)
            alloc = c.status.allocation if c.status else None
            if alloc is None:
                return None
            (r,) = alloc.devices.results
            assert r.driver == DRIVER and r.pool == node, r
            return node, r.device, r.request

        got = wait_for(f"{pod}'s claim to be allocated", result, BIND_S)
        print(f"{pod}: {got[0]} {got[1]} by subrequest {got[2]}, "
              f"{time.monotonic() - start:.2f} s")  # fmt: skip
        return got


@pytest.fixture
def space(scheduling_cluster: Any, admin_client: Any, admin_api: Any, device_classes: None,
          request: pytest.FixtureRequest) -> Iterator[Space]:  # fmt: skip
    name = f"binpack-{os.getpid()}-{request.node.name[5:28].replace('_', '-')}".rstrip("-")
    s = Space(admin_client, admin_api, name)
    try:
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def gpu_nodes(scheduling_cluster: Any, admin_client: Any, admin_api: Any,
              make_node: Callable[..., str], tmp_path: Path,
              request: pytest.FixtureRequest) -> Iterator[Callable[..., tuple[str, Published]]]:  # fmt: skip
    """Make a schedulable Node labelled ``MINE=<this test>`` whose GPUs the agent publishes
    from a trace (the multi-GPU trace, or ``write_frees``'); its slice deleted after."""
    from kubernetes.client.exceptions import ApiException

    run = f"{os.getpid()}-{request.node.name[5:40].replace('_', '-')}".rstrip("-")
    slices = []

    def make(free_gib: list[int] | None = None, later_gib: list[int] | None = None,
             shared: bool = False) -> tuple[str, Published]:  # fmt: skip
        node = make_node(labels={MINE: run})
        schedulable(admin_api, node)
        trace = MULTI_TRACE if free_gib is None else write_frees(
            tmp_path / f"{node}.json", free_gib, later_gib)  # fmt: skip
        agent = Published(scheduling_cluster, node, trace, shared)
        slices.append(slice_name(node))
        want = list(MULTI_FREE_GIB) if free_gib is None else free_gib
        assert sorted(published_free_gib(admin_client, node).values()) == sorted(want)
        return node, agent

    make.run = run  # type: ignore[attr-defined]
    yield make
    api = resource_api(admin_client)
    for name in slices:
        try:
            api.delete_resource_slice(name)
        except ApiException:
            pass


def gpus_of(admin_client: Any, nodes: list[str]) -> dict[tuple[str, str], int]:
    """(node, device) -> published free GiB, for every GPU of ``nodes``."""
    return {(n, d): f for n in nodes for d, f in published_free_gib(admin_client, n).items()}


def extender_pick(free: dict[tuple[str, str], int], taken: set[tuple[str, str]],
                  policy: str) -> tuple[str, str] | None:  # fmt: skip
    """The GPU our placement model gives a 20 GiB need among the GPUs not ``taken``
    (``pick_memory`` under ``policy``), as (node, device)."""
    keys = [k for k in sorted(free) if k not in taken]
    infos = [GpuInfo(i, free[k] * GIB, True) for i, k in enumerate(keys)]
    got = pick_memory(infos, 1, NEED_MIB, policy)
    return keys[got[0].index] if got else None


@pytest.mark.cluster
@on_137
def test_binpack_whole_gpus_land_on_the_tightest_gpu_that_fits(space, gpu_nodes, admin_client):
    """(a) The docs' ``whole-gpu`` claim: the extender's binpack choice five times, then the
    first GPU of the last range on the one node that has any."""
    a, _ = gpu_nodes()  # the multi-GPU trace: 79 49 69 9 79 34 74 3
    b, _ = gpu_nodes([22, 15, 10, 10, 10, 10, 10, 10])
    c, _ = gpu_nodes([20, 26, 12, 12, 12, 12, 12, 12])
    free = gpus_of(admin_client, [a, b, c])
    body = doc_examples()["whole-gpu"]
    space.template(body)
    template = body["metadata"]["name"]
    taken: set[tuple[str, str]] = set()
    expected_gib = [20, 22, 26, 34, 49]
    for k, gib in enumerate(expected_gib):
        want = extender_pick(free, taken, "binpack")
        space.pod(f"pack-{k}", template, gpu_nodes.run)
        node, device, _ = space.placed(f"pack-{k}")
        assert (node, device) == want, (k, free[(node, device)], free[want])
        assert free[(node, device)] == gib
        taken.add((node, device))
    # only node a has GPUs of the last range (>= 52 GiB): 79 (GPU 0), 69, 79, 74; the
    # allocator takes the first in slice (index) order, the extender the tightest (69)
    want = extender_pick(free, taken, "binpack")
    assert want is not None and want[0] == a and free[want] == 69
    space.pod("pack-5", template, gpu_nodes.run)
    node, device, sub = space.placed("pack-5")
    assert node == a and free[(node, device)] == 79 and sub.endswith("/r6"), (device, sub)
    index0 = sorted(d for n, d in free if n == a)[0]
    assert device == index0


@pytest.mark.cluster
@on_137
def test_spread_whole_gpus_land_on_the_roomiest_gpu_that_fits(space, gpu_nodes, admin_client,
                                                              admin_api):  # fmt: skip
    """(b) The docs' ``whole-gpu-spread`` claim: the extender's spread order seven times, then
    Pending with the scheduler's reason once no GPU has 20 GiB."""
    p, _ = gpu_nodes([60, 30, 25, 10, 10, 10, 10, 10])
    q, _ = gpu_nodes([72, 50, 10, 10, 10, 10, 10, 10])
    r, _ = gpu_nodes([38, 55, 10, 10, 10, 10, 10, 10])
    free = gpus_of(admin_client, [p, q, r])
    body = doc_examples()["whole-gpu-spread"]
    space.template(body)
    template = body["metadata"]["name"]
    taken: set[tuple[str, str]] = set()
    for k, gib in enumerate([72, 60, 55, 50, 38, 30, 25]):
        want = extender_pick(free, taken, "spread")
        space.pod(f"spread-{k}", template, gpu_nodes.run)
        node, device, _ = space.placed(f"spread-{k}")
        assert (node, device) == want and free[want] == gib, (k, free[(node, device)])
        taken.add((node, device))
    assert extender_pick(free, taken, "spread") is None
    space.pod("spread-7", template, gpu_nodes.run)
    start = time.monotonic()
    message = wait_for(
        "spread-7's scheduler reason to be its claims",
        lambda: (
            (m := unschedulable_message(admin_api, space.name, "spread-7", PENDING_S))
            and "cannot allocate all claims" in m
            and m
        ),
        PENDING_S,
    )
    print(f"spread-7: Unschedulable after {time.monotonic() - start:.2f} s: {message}")


@pytest.mark.cluster
@on_137
def test_binpack_slices_go_to_the_tightest_shared_gpu(space, gpu_nodes, admin_client):
    """(c) The docs' ``shared-slice`` claim on shared GPUs: the tightest first; once its memory
    use is published, the next tightest."""
    s1, _ = gpu_nodes([30, 10, 10, 10, 10, 10, 10, 10], shared=True)
    s2, agent2 = gpu_nodes([24, 10, 10, 10, 10, 10, 10, 10], [4, 10, 10, 10, 10, 10, 10, 10],
                           shared=True)  # fmt: skip
    body = doc_examples()["shared-slice"]
    space.template(body)
    template = body["metadata"]["name"]

    def extender(free: dict[tuple[str, str], int]) -> tuple[str, str]:
        keys = sorted(free)
        infos = [GpuInfo(i, free[k] * GIB, True, units_left=79) for i, k in enumerate(keys)]
        got = pick_slice(infos, NEED_MIB, GIB, "binpack")
        assert got is not None
        return keys[got.index]

    free = gpus_of(admin_client, [s1, s2])
    space.pod("slice-0", template, gpu_nodes.run)
    node, device, _ = space.placed("slice-0")
    assert (node, device) == extender(free) and node == s2 and free[(node, device)] == 24
    # the slice's process now holds its 20 GiB: the agent's next tick publishes the drop
    start = time.monotonic()
    agent2.next()
    free = gpus_of(admin_client, [s1, s2])
    assert free[(node, device)] == 4
    print(f"the drop to 4 GiB published in {time.monotonic() - start:.2f} s")
    space.pod("slice-1", template, gpu_nodes.run)
    node, device, _ = space.placed("slice-1")
    assert (node, device) == extender(free) and node == s1 and free[(node, device)] == 30


#: the docs' profile: DynamicResources weighed 10 instead of 2
WEIGHTED = {"score": {"enabled": [{"name": "DynamicResources", "weight": 10}]}}


@pytest.fixture
def weighted_scheduler(scheduling_cluster: Any, tmp_path: Path) -> Iterator[str]:
    """A second kube-scheduler, ``dra-weighted``, whose one profile is the default one with the
    docs' ``WEIGHTED`` score setting; its name (stopped after the test)."""
    import subprocess

    name = "dra-weighted"
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(scheduling_cluster.kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name, "plugins": WEIGHTED}],
    }
    path, log = tmp_path / f"{name}.yaml", tmp_path / f"{name}.log"
    path.write_text(yaml.safe_dump(config))
    proc = scheduling_cluster.spawn_scheduler(path, log)
    start = time.monotonic()

    def started() -> bool:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text().splitlines()[-5:])
            raise AssertionError(f"kube-scheduler {name} exited {proc.returncode}: {tail}")
        return "Starting Kubernetes Scheduler" in log.read_text()

    wait_for(f"kube-scheduler {name} to start", started, 30)
    print(f"kube-scheduler {name} started in {time.monotonic() - start:.2f} s")
    try:
        yield name
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.cluster
@on_137
def test_other_scores_outweigh_a_range_unless_the_profile_weighs_dra_more(
    space, gpu_nodes, admin_api, admin_client, weighted_scheduler
):
    """(d) One range (25 points at weight 2) against a node with 60 of 64 CPUs requested: the
    default profile picks the emptier node in ``r1``, the docs' weight 10 the GPU in ``r0``."""
    x, _ = gpu_nodes([20, 20, 10, 10, 10, 10, 10, 10])
    y, _ = gpu_nodes([21, 21, 10, 10, 10, 10, 10, 10])
    admin_api.create_namespaced_pod(space.name, {
        "metadata": {"name": "cpu-filler"},
        "spec": {"nodeName": x, "containers": [{"name": "app", "image": "my-app",
                                                "resources": {"requests": {"cpu": "60"}}}]},
    })  # fmt: skip
    body = doc_examples()["whole-gpu"]
    space.template(body)
    template = body["metadata"]["name"]
    free = gpus_of(admin_client, [x, y])
    space.pod("default-profile", template, gpu_nodes.run)
    node, device, sub = space.placed("default-profile")
    assert node == y and free[(node, device)] == 21 and sub == "gpu/r1", (node, device, sub)
    space.pod("weighted-profile", template, gpu_nodes.run, scheduler=weighted_scheduler)
    node, device, sub = space.placed("weighted-profile")
    assert node == x and free[(node, device)] == 20 and sub == "gpu/r0", (node, device, sub)
