"""Issue 50, item 6: the topology claims of docs/dra.md ("Topology: NVLink islands, PCIe roots,
NUMA nodes"), applied as written against the real kube-scheduler of the light dev cluster
(kube-apiserver, etcd and the default kube-scheduler, v1.37.2; no kubelet: the scheduler
allocates each claim, writes ``status.allocation`` and binds the pod, which then stays Pending
for want of a kubelet, as it should here).

The GPUs are the agent's own: ``Agent.tick()`` on a fake Node made schedulable
(``tests/scheduler/scheduling_cluster_support.schedulable``) publishes the Node's ResourceSlice
of ``tests/data/pcie-nvlink-bridge-topo-trace.json`` (8 H100 NVL, NVLink bridge pairs 0-1, 2-3,
4-5, 6-7: four islands of 2; GPUs 0-3 on NUMA node 0, 4-7 on node 1; each GPU its own PCIe root,
``pci0000:00``, ``:20``, ... ``:e0``, as tests/data/make_topology_traces.py chose them), or of
``tests/data/hgx-h100-topo-trace.json`` (one island of 8). A second driver's ResourceSlice,
``nic.example.com``, is written by the test as that driver would (``NICS``): two NICs on GPUs'
roots (GPU 1's and GPU 6's), two on roots no GPU has, one of them with no NUMA node.

The DeviceClasses: ours as the chart renders them (``helm template`` of charts/omaticaya with
``dra.enabled``, for 1.37.2; only the DeviceClass objects are created), the NIC's from the docs'
block. kube-controller-manager does not run on the light cluster, so its resourceclaim
controller's part is played by ``claims_from_templates``: for a pod's
``resourceClaimTemplateName`` it creates the ResourceClaim from the stored template (its spec
copied, owned by the pod as controller, annotated with the pod's claim name) and records it in
the pod's ``status.resourceClaimStatuses``, what that controller does
(pkg/controller/resourceclaim/controller.go, v1.37.2). For the same reason the test removes
the claims' ``delete-protection`` finalizer and finalizes the namespace at cleanup.

What is checked (every wait on a condition with a deadline; the time each took is printed):

a. ``two-gpus-one-island``: with GPU 1 taken first (a claim pinned to it), three pods of the
   docs' ``nccl-pair`` get the three whole bridged pairs left (2-3, 4-5, 6-7); placed in slice
   order without the constraint they would split pairs (0-2, 3-4, 5-6);
b. ``gpu-and-nic-one-pcie-root``: two claims get exactly GPU 1 with nic-0 and GPU 6 with nic-1
   (a shared root each), a third stays Pending (the free NICs' roots hold no GPU);
   ``gpu-and-nic-one-numa-node``: one claim gets a GPU and nic-2 of NUMA node 1, the next stays
   Pending (the last NIC has no ``numaNode``);
c. a claim of 4 GPUs on one island leaves its pod Pending, ``PodScheduled=False`` /
   ``Unschedulable``, the scheduler's message naming the claims it cannot allocate;
d. a second node (the HGX trace) appears: the same pod is bound there, its 4 GPUs one island.

Kubernetes 1.37 only (DRA's ``resource.k8s.io/v1`` and this scheduler): skipped, saying why, on
an older dev cluster; ``scripts/test``'s v1.31.0 lane lists its files and this is not one.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.devcluster.cluster import K8S_VERSION, minor
from omaticaya_py.core.publish.dra import DRIVER, slice_name
from tests.dra.claims_support import (
    ClaimSpace,
    chart_device_classes,
    create_device_classes,
    delete_device_classes,
    marked_blocks,
    resource_api,
)
from tests.scheduler.scheduling_cluster_support import (
    bound_node,
    schedulable,
    unschedulable_message,
)
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
BRIDGE = REPO / "tests" / "data" / "pcie-nvlink-bridge-topo-trace.json"
HGX = REPO / "tests" / "data" / "hgx-h100-topo-trace.json"
NIC_DRIVER = "nic.example.com"
STD = "resource.kubernetes.io"
ISLAND, ROOT, NUMA = f"{DRIVER}/nvlinkIsland", f"{STD}/pcieRoot", f"{STD}/numaNode"
#: the bridge server's NVLink pairs (the published matrix's NV12 pairs)
BRIDGED = ({0, 1}, {2, 3}, {4, 5}, {6, 7})
#: the NIC driver's devices on the bridge node: (name, PCIe root, NUMA node or None)
NICS = (
    ("nic-0", "pci0000:20", 0),  # GPU 1's root
    ("nic-1", "pci0000:c0", 1),  # GPU 6's root
    ("nic-2", "pci0000:f0", 1),  # no GPU's root
    ("nic-3", "pci0000:10", None),  # no GPU's root, NUMA node unknown
)
#: the marked blocks of docs/dra.md's topology section
EXAMPLES = {
    "two-gpus-one-island": "ResourceClaimTemplate",
    "pod-two-gpus": "Pod",
    "nic-device-class": "DeviceClass",
    "gpu-and-nic-one-pcie-root": "ResourceClaimTemplate",
    "gpu-and-nic-one-numa-node": "ResourceClaimTemplate",
}
#: the claim annotation kube-controller-manager's resourceclaim controller writes
BIND_S, PENDING_S, MOVE_S = 30.0, 30.0, 90.0

on_137 = pytest.mark.skipif(
    minor() < 34,
    reason=f"Kubernetes {K8S_VERSION}: these claims need DRA's resource.k8s.io/v1 (1.34)",
)

def doc_examples() -> dict[str, dict[str, Any]]:
    """The YAML blocks of docs/dra.md marked ``<!-- topology-example: NAME -->``, by NAME."""
    return marked_blocks("topology-example")


def test_the_docs_mark_each_topology_example_once_and_each_parses():
    """No cluster: the blocks the cluster tests apply are there, of the kinds they expect, with
    the constraints the section promises."""
    blocks = doc_examples()
    assert {n: b["kind"] for n, b in blocks.items()} == EXAMPLES
    constraint = {
        n: b["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"]
        for n, b in blocks.items() if b["kind"] == "ResourceClaimTemplate"
    }  # fmt: skip
    assert constraint == {
        "two-gpus-one-island": ISLAND,
        "gpu-and-nic-one-pcie-root": ROOT,
        "gpu-and-nic-one-numa-node": NUMA,
    }
    pod = blocks["pod-two-gpus"]["spec"]["resourceClaims"][0]
    assert pod["resourceClaimTemplateName"] == blocks["two-gpus-one-island"]["metadata"]["name"]
    assert blocks["nic-device-class"]["metadata"]["name"] == NIC_DRIVER


# -- the cluster's side --------------------------------------------------------------------------


def publish_gpus(dev_cluster: Any, node: str, trace: Path) -> None:
    """The real agent's first tick on ``node``, replaying ``trace`` (DRA on, no shared GPUs):
    the Node's labels and its ResourceSlice ``<node>-gpu.omaticaya.io``."""
    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.core.config.settings import load_settings
    from omaticaya_py.kube import NodeClient
    from omaticaya_py.sources.replay import TraceReader
    from tests.helpers import Clock

    clock = Clock()
    settings = load_settings(node_name=node, dra=True)
    reader = TraceReader(str(trace), at_s=0.0, loop=False, clock=clock)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    agent = Agent(settings, reader, NodeApi(client, lease=None), clock=clock, attribution=None)
    agent.tick()
    assert agent.cache.slice_writes == 1, "the agent wrote no ResourceSlice"


def nic_slice(node: str) -> dict[str, Any]:
    """The ResourceSlice a NIC driver ``nic.example.com`` would publish for ``node``: ``NICS``,
    with Kubernetes' standard ``pcieRoot`` and (when known) ``numaNode``."""
    devices = []
    for name, root, numa in NICS:
        attrs: dict[str, Any] = {ROOT: {"string": root}, "model": {"string": "example-nic"}}
        if numa is not None:
            attrs[NUMA] = {"int": numa}
        devices.append({"name": name, "attributes": attrs})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NIC_DRIVER}"},
        "spec": {
            "driver": NIC_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def stored_devices(admin_client: Any, node: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Every device the API server stores for ``node``, any driver: (driver, device) ->
    fully qualified attribute name -> value (a name without a domain is under its driver's)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in (
        resource_api(admin_client).list_resource_slice(field_selector=f"spec.nodeName={node}").items
    ):
        for d in s.spec.devices or []:
            attrs = {}
            for key, value in (d.attributes or {}).items():
                qualified = key if "/" in key else f"{s.spec.driver}/{key}"
                for kind in ("string", "int", "bool", "version"):
                    if getattr(value, kind, None) is not None:
                        attrs[qualified] = getattr(value, kind)
            out[(s.spec.driver, d.name)] = attrs
    return out


@pytest.fixture(scope="module")
def device_classes(helm: dict[str, Any], admin_client: Any) -> Iterator[None]:
    """The chart's DeviceClasses (rendered with ``dra.enabled`` for 1.37.2; created, and deleted
    after the module, unless one of that name was there) and the docs' NIC class."""
    if minor() < 34:
        pytest.skip(f"Kubernetes {K8S_VERSION}: no resource.k8s.io/v1")
    classes = chart_device_classes(helm)
    assert DRIVER in [c["metadata"]["name"] for c in classes]
    created = create_device_classes(admin_client, [*classes, doc_examples()["nic-device-class"]])
    yield
    delete_device_classes(admin_client, created)


class Namespace(ClaimSpace):
    """A namespace of the test's (``claims_support.ClaimSpace``) and what was applied in it."""

    def apply(self, body: dict[str, Any]) -> str:
        """Create ``body`` (a ResourceClaimTemplate, ResourceClaim or Pod) here; its name.
        A pod's template claims are then made as kube-controller-manager would."""
        kind, name = body["kind"], body["metadata"]["name"]
        if kind == "ResourceClaimTemplate":
            self.resource.create_namespaced_resource_claim_template(self.name, body)
        elif kind == "ResourceClaim":
            self.resource.create_namespaced_resource_claim(self.name, body)
        elif kind == "Pod":
            self.core.create_namespaced_pod(self.name, body)
            self.claims_from_templates(name)
        else:
            raise AssertionError(f"not applied here: {kind}")
        return name

    def claim_of(self, pod_name: str, claim: str) -> str:
        """The ResourceClaim's name behind the pod's claim ``claim``."""
        pod = self.core.read_namespaced_pod(pod_name, self.name)
        for pc in pod.spec.resource_claims or []:
            if pc.name == claim and pc.resource_claim_name:
                return str(pc.resource_claim_name)
        for st in pod.status.resource_claim_statuses or []:
            if st.name == claim and st.resource_claim_name:
                return str(st.resource_claim_name)
        raise AssertionError(f"pod {pod_name} has no claim {claim}")

    def allocated(self, pod_name: str, claim: str) -> list[tuple[str, str, str, str]]:
        """The devices allocated to the pod's claim ``claim``: (request, driver, pool, device),
        once the scheduler wrote them."""

        def results() -> list[tuple[str, str, str, str]] | None:
            c = self.resource.read_namespaced_resource_claim(
                self.claim_of(pod_name, claim), self.name
            )
            alloc = c.status.allocation if c.status else None
            if alloc is None:
                return None
            return [(r.request, r.driver, r.pool, r.device) for r in alloc.devices.results]

        return wait_for(f"{pod_name}'s claim {claim} to be allocated", results, BIND_S)


@pytest.fixture
def ns(scheduling_cluster: Any, admin_client: Any, admin_api: Any, device_classes: None,
       request: pytest.FixtureRequest) -> Iterator[Namespace]:  # fmt: skip
    name = f"topo-{os.getpid()}-{request.node.name[5:30].replace('_', '-')}".rstrip("-")
    space = Namespace(admin_client, admin_api, name)
    try:
        yield space
    finally:
        space.cleanup()


@pytest.fixture
def gpu_node(
    scheduling_cluster: Any, admin_client: Any, admin_api: Any, make_node: Callable[..., str]
) -> Iterator[Callable[..., str]]:
    """Make a schedulable Node whose GPUs the agent publishes from a topology trace (and, with
    ``nics``, the NIC driver's slice ``NICS``); their slices deleted after (no garbage
    collector runs here)."""
    from kubernetes.client.exceptions import ApiException

    api, slices = resource_api(admin_client), []

    def make(trace: Path, nics: bool = False) -> str:
        node = make_node()
        schedulable(admin_api, node)
        publish_gpus(scheduling_cluster, node, trace)
        slices.append(slice_name(node))
        if nics:
            body = nic_slice(node)
            api.create_resource_slice(body)
            slices.append(body["metadata"]["name"])
        return node

    yield make
    for name in slices:
        try:
            api.delete_resource_slice(name)
        except ApiException:
            pass


def renamed(body: dict[str, Any], name: str, **template: str) -> dict[str, Any]:
    """A copy of a docs' pod renamed ``name``, its claims' templates replaced per ``template``
    (pod claim name -> template name)."""
    import copy

    out = copy.deepcopy(body)
    out["metadata"]["name"] = name
    for pc in out["spec"]["resourceClaims"]:
        pc["resourceClaimTemplateName"] = template.get(pc["name"], pc["resourceClaimTemplateName"])
    return out


def pod_with(name: str, claims: dict[str, str], *, template: bool = True) -> dict[str, Any]:
    """A pod whose one container uses ``claims`` (pod claim name -> template, or claim, name)."""
    key = "resourceClaimTemplateName" if template else "resourceClaimName"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": c, key: t} for c, t in claims.items()],
            "containers": [{"name": "app", "image": "my-cuda-app",
                            "resources": {"claims": [{"name": c} for c in claims]}}],
        },
    }  # fmt: skip


def bind(api: Any, namespace: str, pod: str) -> str:
    """The node kube-scheduler binds ``pod`` to (at most ``BIND_S``); prints how long it took."""
    start = time.monotonic()
    node = bound_node(api, namespace, pod, BIND_S)
    print(f"{pod}: bound to {node} in {time.monotonic() - start:.2f} s")
    return node


#: the scheduler's count of nodes whose claims it could not allocate, in its message
#: (``0/3 nodes are available: 1 cannot allocate all claims, 2 ...``; the reason is the
#: DynamicResources plugin's Filter, pkg/scheduler/framework/plugins/dynamicresources, v1.37.2)
_CANNOT_ALLOCATE = re.compile(r"\b(\d+) cannot allocate all claims\b")


def pending(api: Any, namespace: str, pod: str) -> str:
    """``pod``'s PodScheduled=False/Unschedulable message once it gives the scheduler's reason for
    DRA (at most ``PENDING_S``; the pod never bound meanwhile), printed with how long it took. It
    must count a node whose claims the scheduler could not allocate (other nodes of the cluster
    may add reasons of their own), and the scheduler's ``FailedScheduling`` event says the same."""
    start = time.monotonic()

    def allocation_reason() -> str | None:
        message = unschedulable_message(api, namespace, pod, PENDING_S)
        found = _CANNOT_ALLOCATE.search(message)
        return message if found and int(found.group(1)) >= 1 else None

    message = wait_for(f"{pod}'s scheduler reason to be its claims", allocation_reason, PENDING_S)
    print(f"{pod}: Unschedulable after {time.monotonic() - start:.2f} s: {message}")

    def event() -> str | None:
        events = api.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
        return next((e.message for e in events.items if e.reason == "FailedScheduling"
                     and _CANNOT_ALLOCATE.search(e.message or "")), None)  # fmt: skip

    print(f"{pod}: event FailedScheduling: {wait_for(f'{pod} FailedScheduling', event, PENDING_S)}")
    return message


@pytest.mark.cluster
@on_137
def test_two_gpus_one_island_get_a_bridged_pair(ns, gpu_node, admin_client, admin_api):
    """(a) The docs' ``two-gpus-one-island`` and its pod ``nccl-pair``: with GPU 1 taken, the
    next three pairs are the three whole islands left, never a split pair."""
    node = gpu_node(BRIDGE)
    devices = stored_devices(admin_client, node)
    index = {d: a[f"{DRIVER}/index"] for (drv, d), a in devices.items() if drv == DRIVER}
    island = {d: a[ISLAND] for (drv, d), a in devices.items() if drv == DRIVER}
    assert len(set(island.values())) == 4  # the agent published four islands of 2
    blocks = doc_examples()
    ns.apply(blocks["two-gpus-one-island"])
    # GPU 1 first, pinned by a claim of its own: a pair in slice order would now split islands
    ns.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": "gpu-1"},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                  "deviceClassName": DRIVER,
                  "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == 1'}}]}}]}}})  # fmt: skip
    ns.apply(pod_with("holds-gpu-1", {"gpu": "gpu-1"}, template=False))
    assert bind(admin_api, ns.name, "holds-gpu-1") == node
    assert [index[d] for *_, d in ns.allocated("holds-gpu-1", "gpu")] == [1]

    pairs = []
    for n in range(3):
        pod = (
            blocks["pod-two-gpus"] if n == 0 else renamed(blocks["pod-two-gpus"], f"nccl-pair-{n}")
        )
        name = ns.apply(pod)
        assert bind(admin_api, ns.name, name) == node
        got = ns.allocated(name, "gpus")
        assert {(drv, pool) for _, drv, pool, _ in got} == {(DRIVER, node)}
        pair = {index[d] for *_, d in got}
        print(f"{name}: GPUs {sorted(pair)}, island {[island[d] for *_, d in got]}")
        assert len({island[d] for *_, d in got}) == 1 and pair in BRIDGED, pair
        pairs.append(pair)
    assert sorted(map(sorted, pairs)) == [[2, 3], [4, 5], [6, 7]]


@pytest.mark.cluster
@on_137
def test_gpu_and_nic_share_a_pcie_root_or_a_numa_node(ns, gpu_node, admin_client, admin_api):
    """(b) The docs' ``gpu-and-nic-one-pcie-root`` (and ``gpu-and-nic-one-numa-node``) across two
    drivers: each claim's GPU and NIC share the attribute; a claim no free pair can meet stays
    Pending with the scheduler's reason."""
    node = gpu_node(BRIDGE, nics=True)
    devices = stored_devices(admin_client, node)
    blocks = doc_examples()
    ns.apply(blocks["gpu-and-nic-one-pcie-root"])
    ns.apply(blocks["gpu-and-nic-one-numa-node"])

    def pair_of(pod: str, attr: str) -> tuple[dict[str, Any], dict[str, Any], str]:
        got = {req: (drv, d) for req, drv, _, d in ns.allocated(pod, "io")}
        assert got["gpu"][0] == DRIVER and got["nic"][0] == NIC_DRIVER, got
        gpu, nic = devices[got["gpu"]], devices[got["nic"]]
        print(f"{pod}: GPU {gpu[f'{DRIVER}/index']} and {got['nic'][1]}, {attr} "
              f"{gpu.get(attr)} / {nic.get(attr)}")  # fmt: skip
        assert attr in gpu and gpu[attr] == nic.get(attr)
        return gpu, nic, got["nic"][1]

    pcie = {}
    for n in range(2):
        name = ns.apply(pod_with(f"rdma-{n}", {"io": "gpu-and-nic-one-pcie-root"}))
        assert bind(admin_api, ns.name, name) == node
        gpu, _, nic = pair_of(name, ROOT)
        pcie[nic] = gpu[f"{DRIVER}/index"]
    assert pcie == {"nic-0": 1, "nic-1": 6}  # the only two NICs on a GPU's root
    ns.apply(pod_with("rdma-2", {"io": "gpu-and-nic-one-pcie-root"}))
    pending(admin_api, ns.name, "rdma-2")

    name = ns.apply(pod_with("numa-0", {"io": "gpu-and-nic-one-numa-node"}))
    assert bind(admin_api, ns.name, name) == node
    gpu, _, nic = pair_of(name, NUMA)
    assert nic == "nic-2" and gpu[NUMA] == 1  # nic-3 has no NUMA node: never chosen
    ns.apply(pod_with("numa-1", {"io": "gpu-and-nic-one-numa-node"}))
    pending(admin_api, ns.name, "numa-1")


@pytest.mark.cluster
@on_137
def test_four_gpus_on_one_island_wait_for_a_node_that_has_one(
    ns, gpu_node, admin_client, admin_api
):
    """(c) 4 GPUs on one island: the bridge server's islands are pairs, so the pod stays Pending
    with the scheduler's reason; (d) an NVSwitch node appears and the same pod goes there."""
    bridge = gpu_node(BRIDGE)
    four = doc_examples()["two-gpus-one-island"]
    four["metadata"]["name"] = "four-gpus-one-island"
    four["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
    ns.apply(four)
    ns.apply(renamed(doc_examples()["pod-two-gpus"], "nccl-four", gpus="four-gpus-one-island"))
    pending(admin_api, ns.name, "nccl-four")
    assert bridge

    start = time.monotonic()
    hgx = gpu_node(HGX)
    assert bound_node(admin_api, ns.name, "nccl-four", MOVE_S) == hgx
    print(f"nccl-four bound to the HGX node {time.monotonic() - start:.2f} s after it appeared")
    devices = stored_devices(admin_client, hgx)
    got = ns.allocated("nccl-four", "gpus")
    assert len(got) == 4 and {(drv, pool) for _, drv, pool, _ in got} == {(DRIVER, hgx)}
    assert len({devices[(DRIVER, d)][ISLAND] for *_, d in got}) == 1
