"""Issue 41: the Node's DRA ResourceSlice: the devices (``core.publish.dra``) from the recorded traces,
the write budget's rules, and the agent's ``ResourceSliceWriter`` against the real kube-apiserver
(``resource.k8s.io/v1``, v1.37: what it keeps of consumable capacity and taints)."""

from __future__ import annotations

import pytest

from omaticaya_py.agent.resourceslice_writer import ResourceSliceWriter
from omaticaya_py.agent.state import SnapshotCache
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.model.sharing import Sharing, parse_shared_gpus
from omaticaya_py.core.publish.dra import (
    DRIVER,
    TAINT_MPS,
    TAINT_UNHEALTHY,
    device_name,
    inventory,
    parse_device_name,
    slice_body,
    slice_name,
)
from omaticaya_py.core.publish.slice_budget import held_devices, worse_devices
from omaticaya_py.core.publish.slice_device import DeviceTaint, SliceDevice, render_devices
from omaticaya_py.core.rules.health import assess
from omaticaya_py.kube import NodeClient
from omaticaya_py.kube.resourceslice import ResourceSliceClient
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE

MULTI = "tests/data/multi-gpu-trace.json"
MIG = "tests/data/mig-mixed-trace.json"
FAULTS = "tests/data/faults-trace.json"
SHARE_01 = Sharing(parse_shared_gpus("0,1"), 1024)
#: mig-mixed-trace.json's GPUs
MIG_GPUS = ("GPU-178dd196-7fda-b7ae-a94e-630097a14ca4", "GPU-e26e8cb2-ee20-51d1-b6bb-da4b063db955")


def named(index: int, mig: int | None = None) -> str:
    """The device name of GPU ``index`` of the multi-GPU and faults traces (and of
    ``tests.helpers.gpu``): its UUID ``GPU-<index, 8 digits>-7fda-...`` made a name."""
    return device_name(f"GPU-{index:08d}-7fda-b7ae-a94e-630097a14ca4", mig)


def read(trace: str, at_s: float = 0.0):
    reader = TraceReader(trace, at_s=at_s, loop=False)
    snapshot = reader.read()
    return snapshot, assess(snapshot)


def devices_of(trace: str, sharing: Sharing = SHARE_01, at_s: float = 0.0, previous=None):
    snapshot, health = read(trace, at_s)
    return snapshot, inventory(snapshot, health, sharing, 1024, 10, previous)


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        (named(0), (named(0), None)),
        (named(12, 3), (named(12), 3)),
        ("gpu-0", ("gpu-0", None)),  # the GPU's part: gpu- and DNS label characters
        ("gpu-12-mig-3", ("gpu-12", 3)),
        ("gpu-01-mig-01", None),
        ("gpu--1", None),
        ("gpu-0-mig-", None),
        ("GPU-0", None),
        ("gpu-0 ", None),
        ("nvidia-0", None),
        ("", None),
        (7, None),
        (None, None),
    ],
)
def test_device_names_round_trip_and_refuse_anything_else(name, parsed):
    assert parse_device_name(name) == parsed


# -- devices from the traces -----------------------------------------------------------------


def test_multi_gpu_trace_one_device_per_gpu_with_live_free_memory():
    snapshot, devices = devices_of(MULTI)
    assert [d.name for d in devices] == [named(i) for i in range(8)]
    free = {d.name: d.free_memory_mib for d in devices}
    # rounded down to 1 GiB steps: a selector never gets more than the GPU has
    assert all(v % 1024 == 0 for v in free.values())
    at_least_60 = sorted(n for n, v in free.items() if v >= 61440)
    assert at_least_60 == [named(0), named(2), named(4), named(6)]
    shared = [d.name for d in devices if d.shared]
    assert shared == [named(0), named(1)]
    g0 = devices[0]
    assert g0.memory_total_mib == 79 * 1024 and g0.unit_mib == 1024  # whole units only
    assert devices[2].memory_total_mib == snapshot.gpus[2].memory_total_mib


def test_mig_gpu_is_published_as_its_mig_devices_only():
    _, devices = devices_of(MIG, Sharing(parse_shared_gpus("all"), 1024))
    names = [d.name for d in devices]
    assert names[:7] == [device_name(MIG_GPUS[0], k) for k in range(7)]
    assert names[7:] == [device_name(MIG_GPUS[1])]
    mig = devices[0]
    assert mig.uuid.startswith("MIG-") and mig.gpu_uuid.startswith("GPU-")
    assert mig.profile == "1g.10gb" and not mig.shared  # a MIG GPU is never shared
    assert devices[7].shared


def test_hysteresis_free_memory_rises_only_past_the_margin():
    _, first = devices_of(MULTI)
    g1 = next(d for d in first if d.name == named(1))
    # published lower before: a rise within the margin (10 % of a step) keeps it
    _, again = devices_of(MULTI, previous={named(1): g1.free_memory_mib - 1024})
    assert next(d for d in again if d.name == named(1)).free_memory_mib in (
        g1.free_memory_mib - 1024, g1.free_memory_mib)
    # published higher before: a drop goes at once
    _, dropped = devices_of(MULTI, previous={named(1): g1.free_memory_mib + 4096})
    assert next(d for d in dropped if d.name == named(1)).free_memory_mib == g1.free_memory_mib


def test_render_attributes_capacity_and_sharing():
    snapshot, devices = devices_of(MULTI)
    rendered = render_devices(devices, snapshot)
    g0, g2 = rendered[0], rendered[2]
    attrs = g2["attributes"]
    assert attrs["type"] == {"string": "gpu"} and attrs["shared"] == {"bool": False}
    assert attrs["index"] == {"int": 2} and attrs["uuid"]["string"].startswith("GPU-")
    assert attrs["productName"]["string"].startswith("NVIDIA H100")
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"]["version"].count(".") == 2
    assert attrs["cudaDriverVersion"]["version"].count(".") == 2
    assert attrs["freeMemoryMiB"] == {"int": devices[2].free_memory_mib}
    assert g2["capacity"] == {"memory": {"value": f"{devices[2].memory_total_mib}Mi"}}
    assert "allowMultipleAllocations" not in g2 and "taints" not in g2
    assert g0["allowMultipleAllocations"] is True
    assert g0["capacity"]["memory"] == {
        "value": f"{79 * 1024}Mi",
        "requestPolicy": {"default": "1024Mi", "validRange": {"min": "1024Mi", "step": "1024Mi"}},
    }


def test_render_mig_attributes():
    snapshot, devices = devices_of(MIG, Sharing())
    mig = render_devices(devices, snapshot)[0]["attributes"]
    assert mig["type"] == {"string": "mig"} and mig["profile"] == {"string": "1g.10gb"}
    assert mig["migIndex"] == {"int": 0} and mig["parentUUID"]["string"].startswith("GPU-")


@pytest.mark.parametrize(
    ("at_s", "tainted"),
    [
        (0.0, {}),
        (5.0, {}),  # Xid 13: an application fault, not the GPU's
        (10.0, {named(1): "remap-pending"}),
        (15.0, {}),  # the remap done: cleared
        (24.0, {named(3): "lost"}),
        (28.0, {}),  # back
    ],
)
def test_unhealthy_gpu_is_tainted_with_its_reason_and_cleared_when_healthy(at_s, tainted):
    snapshot, health = read(FAULTS, at_s)
    devices = inventory(snapshot, health, SHARE_01, 1024, 10)
    rendered = render_devices(devices, snapshot, taint_effect="NoExecute")
    got = {d["name"]: d["taints"] for d in rendered if d.get("taints")}
    assert {n: t[0]["value"] for n, t in got.items()} == tainted
    assert all(t[0]["key"] == TAINT_UNHEALTHY and t[0]["effect"] == "NoExecute"
               for t in got.values())
    assert [d["name"] for d in rendered] == [named(i) for i in range(4)]  # a lost GPU stays


def test_driver_gone_keeps_the_devices_tainted(tmp_path):
    settings = load_settings(node_name="n", dra=True, shared_gpus="0,1",
                             dra_taint_effect="NoExecute")
    writer = ResourceSliceWriter(settings, None, SnapshotCache(lambda: 0.0))
    snapshot, health = read(FAULTS, 0.0)
    assert writer.write(snapshot, health, None, 0.0)
    gone, gone_health = read(FAULTS, 32.0)
    assert gone.error is not None
    assert writer.write(gone, gone_health, None, 1.0)  # worse: at once
    assert [t["taints"][0]["value"] for t in writer.published] == ["nvml-unreadable"] * 4
    # never NoExecute: NVML unreadable says nothing of the GPUs, evicting every pod would hurt
    assert {t["taints"][0]["effect"] for t in writer.published} == {"NoSchedule"}
    assert all("freeMemoryMiB" not in d["attributes"] for d in writer.published)


def reader_samples(trace: str):
    import json

    with open(trace) as f:
        return json.load(f)["samples"]


def test_mps_down_taints_a_shared_gpu_not_an_unshared_one():
    snapshot, devices = devices_of(MULTI)
    uuid0, uuid2 = devices[0].gpu_uuid, devices[2].gpu_uuid
    rendered = render_devices(devices, snapshot, mps_down={uuid0: "mps-daemon-down", uuid2: "x"})
    assert rendered[0]["taints"] == [
        {"key": TAINT_MPS, "value": "mps-daemon-down", "effect": "NoSchedule"}
    ]
    assert "taints" not in rendered[2]


def test_taint_time_is_kept():
    snapshot, devices = devices_of(MULTI)
    rendered = render_devices(devices, snapshot, mps_down={devices[0].gpu_uuid: "down"},
                              taint_times={(named(0), TAINT_MPS): "2026-11-28T05:00:00Z"})
    assert rendered[0]["taints"][0]["timeAdded"] == "2026-11-28T05:00:00Z"


# -- the write budget ----------------------------------------------------------------------------


def dev(name, free, taints=None, uuid="GPU-1"):
    """A typed device: ``uuid``, ``free`` MiB, tainted unhealthy with each of ``taints``."""
    return SliceDevice(
        name, "gpu", False, 0, uuid=uuid, free_memory_mib=free,
        taints=tuple(DeviceTaint(TAINT_UNHEALTHY, v, "NoSchedule") for v in taints or ()),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("before", "after", "worse"),
    [
        ([dev("gpu-0", 2048)], [dev("gpu-0", 2048)], False),
        ([dev("gpu-0", 2048)], [dev("gpu-0", 1024)], True),  # less free
        ([dev("gpu-0", 1024)], [dev("gpu-0", 2048)], False),  # more free: may wait
        ([dev("gpu-0", 1024)], [dev("gpu-0", 1024, ["xid-79"])], True),  # tainted
        ([dev("gpu-0", 1024, ["xid-79"])], [dev("gpu-0", 1024)], False),  # cleared: may wait
        ([dev("gpu-0", 1024, ["xid-79"])], [dev("gpu-0", 1024, ["gpu-lost"])], True),
        ([dev("gpu-0", 1), dev("gpu-1", 1)], [dev("gpu-0", 1)], True),  # a device gone
        ([dev("gpu-0", 1)], [dev("gpu-0", 1), dev("gpu-1", 1)], False),  # a new one may wait
        ([dev("gpu-0", 1)], [dev("gpu-0", 1, uuid="GPU-2")], True),  # another GPU
    ],
)
def test_worse_devices(before, after, worse):
    assert worse_devices(before, after) is worse


def test_held_devices_keep_the_published_side_of_changes_for_the_better():
    before = [dev("gpu-0", 1024, ["xid-79"]), dev("gpu-1", 4096)]
    after = [dev("gpu-0", 8192), dev("gpu-1", 2048), dev("gpu-2", 1)]
    held = [d.render() for d in held_devices(before, after)]
    assert [d["name"] for d in held] == ["gpu-0", "gpu-1"]  # the new device waits
    assert held[0]["attributes"]["freeMemoryMiB"] == {"int": 1024}  # the rise waits
    assert held[0]["taints"][0]["value"] == "xid-79"  # the cleared taint waits
    assert held[1]["attributes"]["freeMemoryMiB"] == {"int": 2048}  # the drop goes


def test_slice_body_names_the_pool_node_and_owner():
    body = slice_body("node-a", "uid-1", [dev("gpu-0", 1).render()])
    assert body["metadata"]["name"] == slice_name("node-a") == f"node-a-{DRIVER}"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert body["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert body["spec"]["driver"] == DRIVER and body["spec"]["nodeName"] == "node-a"
    assert "ownerReferences" not in slice_body("node-a", None, [])["metadata"]
    assert len(slice_name("n" * 253)) <= 253


# -- against the real API server ------------------------------------------------------------------


def writer_for(dev_cluster, node: str, **env):
    settings = load_settings(node_name=node, dra=True, shared_gpus="0,1", **env)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    cache = SnapshotCache(lambda: 0.0)
    return ResourceSliceWriter(settings, ResourceSliceClient(client.session, node), cache), client, cache


def stored(admin_client, node: str):
    from kubernetes import client as k

    try:
        return k.ResourceV1Api(admin_client).read_resource_slice(slice_name(node)).to_dict()
    except k.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


@pytest.mark.cluster
def test_writer_publishes_change_only_and_the_server_keeps_every_field(
    dev_cluster, admin_client, make_node
):
    node = make_node()
    writer, client, cache = writer_for(dev_cluster, node, min_patch_interval_s=30)
    uid = client.get_node().uid
    snapshot, health = read(MULTI)
    assert writer.write(snapshot, health, uid, 0.0) is True
    obj = stored(admin_client, node)
    spec = obj["spec"]
    assert spec["driver"] == DRIVER and spec["node_name"] == node
    assert obj["metadata"]["owner_references"][0]["uid"] == uid
    devices = {d["name"]: d for d in spec["devices"]}
    assert sorted(devices) == [named(i) for i in range(8)]
    g0 = devices[named(0)]
    # consumable capacity (DRAConsumableCapacity, beta and on in 1.37) is kept as written
    assert g0["allow_multiple_allocations"] is True
    policy = g0["capacity"]["memory"]["request_policy"]
    assert policy["default"] in ("1024Mi", "1Gi") and policy["valid_range"]["step"] in ("1024Mi", "1Gi")
    assert devices[named(2)]["attributes"]["freeMemoryMiB"]["int"] == 70656
    # the same reading again: no write (the server's canonical quantities compare equal)
    writer.forget()
    assert writer.write(snapshot, health, uid, 1.0) is False
    assert cache.slice_writes == 1


@pytest.mark.cluster
def test_writer_taints_at_once_and_clears_after_the_budget(dev_cluster, admin_client, make_node):
    node = make_node()
    writer, client, cache = writer_for(dev_cluster, node, min_patch_interval_s=30)
    uid = client.get_node().uid
    samples = sorted({s["t"] for s in reader_samples(FAULTS)})
    phases = []
    for t in samples:
        snapshot, health = read(FAULTS, t)
        phases.append((t, snapshot, health, any(not g.healthy for g in health.gpus.values())))
    healthy_t = next(p for p in phases if not p[3])
    sick_t = next(p for p in phases if p[3])
    assert writer.write(healthy_t[1], healthy_t[2], uid, 0.0)
    assert writer.write(sick_t[1], sick_t[2], uid, 1.0)  # worse: at once, within the budget

    def taints():
        obj = stored(admin_client, node)
        return {d["name"]: d.get("taints") for d in obj["spec"]["devices"] if d.get("taints")}

    tainted = taints()
    assert tainted and all(t[0]["key"] == TAINT_UNHEALTHY for t in tainted.values())
    # the server keeps a time on it
    assert all(t[0]["time_added"] is not None for t in tainted.values())
    # healthy again: held back within the budget, written after it
    writer.write(healthy_t[1], healthy_t[2], uid, 2.0)
    assert taints() == tainted and cache.slice_held >= 1
    assert writer.write(healthy_t[1], healthy_t[2], uid, 40.0)
    assert not taints()


@pytest.mark.cluster
def test_writer_recreates_a_deleted_slice_at_the_heartbeat_and_deletes_on_exit(
    dev_cluster, admin_client, make_node
):
    from kubernetes import client as k

    node = make_node()
    writer, client, _ = writer_for(dev_cluster, node)
    uid = client.get_node().uid
    snapshot, health = read(H100_TRACE)
    assert writer.write(snapshot, health, uid, 0.0)
    k.ResourceV1Api(admin_client).delete_resource_slice(slice_name(node))
    assert writer.write(snapshot, health, uid, 1.0) is False  # nothing changed in our view
    writer.forget()  # the heartbeat
    assert writer.write(snapshot, health, uid, 2.0) is True
    assert stored(admin_client, node) is not None
    writer.delete()
    assert stored(admin_client, node) is None


def dra_agent(dev_cluster, node: str, kubeconfig: str | None = None):
    from omaticaya_py.agent import Agent, NodeApi
    from tests.helpers import Clock

    clock = Clock()
    settings = load_settings(node_name=node, dra=True, shared_gpus="0,1")
    reader = TraceReader(MULTI, at_s=0.0, loop=False, clock=clock)
    client = NodeClient(node, kubeconfig=kubeconfig or str(dev_cluster.kubeconfig),
                        sleep=lambda s: None)
    return Agent(settings, reader, NodeApi(client, lease=None), clock=clock, attribution=None)


@pytest.mark.cluster
def test_agent_tick_publishes_the_slice_and_its_exit_deletes_it(dev_cluster, admin_client, make_node):
    from omaticaya_py.agent.daemon import Daemon
    from tests.conftest import node_metadata

    node = make_node()
    agent = dra_agent(dev_cluster, node)
    agent.tick()
    obj = stored(admin_client, node)
    assert obj is not None and len(obj["spec"]["devices"]) == 8
    assert obj["metadata"]["owner_references"][0]["name"] == node
    from kubernetes import client as k

    labels, _ = node_metadata(k.CoreV1Api(admin_client), node)
    assert labels["omaticaya.io/gpu.count"] == "8"  # the labels as before
    assert agent.cache.slice_writes == 1
    agent.tick()
    assert agent.cache.slice_writes == 1  # the same reading: no write
    Daemon(agent).cleanup_on_exit()
    assert stored(admin_client, node) is None


@pytest.mark.cluster
def test_without_rbac_on_resourceslices_the_labels_still_go(
    dev_cluster, admin_client, make_node, tmp_path
):
    """A ServiceAccount that may patch Nodes but not write ResourceSlices (an old ClusterRole):
    the tick labels the Node, the slice's 403 is counted and the tick does not fail."""
    from kubernetes import client as k

    from tests.conftest import node_metadata
    from tests.helpers import token_kubeconfig

    node = make_node()
    rbac, core = k.RbacAuthorizationV1Api(admin_client), k.CoreV1Api(admin_client)
    name = f"dra-norbac-{node}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]})
    core.create_namespaced_service_account("default", {"metadata": {"name": name}})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]})
    token = core.create_namespaced_service_account_token(
        name, "default", {"spec": {"audiences": [], "expirationSeconds": 600}}).status.token
    cfg = token_kubeconfig(dev_cluster, token, tmp_path / "kubeconfig")
    agent = dra_agent(dev_cluster, node, str(cfg))
    agent.tick()
    labels, _ = node_metadata(core, node)
    assert labels["omaticaya.io/gpu.count"] == "8"
    assert agent.cache.slice_errors >= 1 and stored(admin_client, node) is None
    assert agent.resourceslice_writer is not None and agent.resourceslice_writer.client is not None
    assert agent.resourceslice_writer.client.session.requests[("get", "403")] >= 1


# -- who holds each device: the kubelet's PodResources lists DRA devices -------------------------


def test_claim_holders_turn_our_devices_into_uuids_and_skip_the_rest():
    from omaticaya_py.core.publish.dra import claim_holders
    from omaticaya_py.core.rules.attribution import ContainerDevices

    snapshot, _ = read(MULTI)
    uuid = {g.index: g.uuid for g in snapshot.gpus}
    listed = [
        ContainerDevices("ns", "a", "c", DRIVER, (f"n1/{named(3)}", f"n1/{named(4)}")),
        ContainerDevices("ns", "b", "c", DRIVER, (f"n1/{named(0)}",)),  # a slice of shared GPU 0
        ContainerDevices("ns", "x", "c", DRIVER, (f"n2/{named(5)}", f"n1/{named(9)}", "n1/nvidia0", "n1")),
        ContainerDevices("ns", "y", "c", "nvidia.com/gpu", (uuid[6],)),  # not ours: not returned
    ]
    holders, skipped = claim_holders(listed, "n1", snapshot, SHARE_01)
    assert holders == [ContainerDevices("ns", "a", "c", DRIVER, (uuid[3], uuid[4]))]
    assert skipped == 4  # another node's pool, no GPU 9, not a device name, no name at all

    mig_snapshot, _ = read(MIG)
    mig = ContainerDevices("ns", "m", "c", DRIVER, (f"n1/{device_name(MIG_GPUS[0], 2)}",
                                                    f"n1/{device_name(MIG_GPUS[0], 9)}"))
    holders, skipped = claim_holders([mig], "n1", mig_snapshot, Sharing())
    assert holders[0].device_ids == (mig_snapshot.gpus[0].mig_devices[2].uuid,) and skipped == 1
