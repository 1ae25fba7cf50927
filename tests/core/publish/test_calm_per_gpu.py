"""Issue 48, item 3: the write budget's calm window is judged per label (and per GPU), on the
real kube-apiserver.

At 7078aa3 the clock that holds back a change for the better was node-wide: one GPU whose free
memory dipped every 20 s kept GPU 1's ``gpu-1.health=Unhealthy`` (remapped rows pending) on the
Node, and its ``remap-pending`` taint on the ResourceSlice, 1,790 s after GPU 1 recovered, and
counting. Here the agent's ``ResourceSliceWriter`` (no API: it keeps what it would apply) and an agent
in Lease mode on the real kube-apiserver (a hand-driven clock, the defaults' 30 s budget)
replay that node; the pure rule's tables are in ``tests/core/publish/test_write_budget.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.agent.resourceslice_writer import ResourceSliceWriter
from omaticaya_py.agent.state import SnapshotCache
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.rules.health import assess
from tests.conftest import node_metadata
from tests.core.publish.telemetry_rewrite_support import lease_agent, small_trace
from tests.helpers import Clock, gpu, snapshot
from tests.kube.lease_cluster_support import namespace  # noqa: F401  (fixture)

P = "omaticaya.io/"
TICK_S, INTERVAL_S, RECOVERED_AT_S, END_S = 10.0, 30.0, 100.0, 400.0


def churn_reading(t: float):
    """The issue's node at second ``t`` (``RECOVERED_AT_S``: GPU 1's remap done): GPU 0's free
    memory 40,000 MiB every 20 s, 81,079 between; GPU 1 idle."""
    snap = snapshot(
        gpu(0, memory_free_mib=40000 if t % 20 == 0 else 81079),
        gpu(1, remapped_rows_pending=t < RECOVERED_AT_S),
        clock_s=t,
    )
    return snap, assess(snap)


def by_gpu(devices):
    """The devices of GPUs 0 and 1 of ``churn_reading``, found by their UUID attribute."""
    uuid = {d["attributes"]["uuid"]["string"]: d for d in devices}
    return uuid[gpu(0).uuid], uuid[gpu(1).uuid]


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_churning_neighbour_does_not_hold_a_recovered_gpus_taint(effect):
    """GPU 1's ``remap-pending`` taint leaves the ResourceSlice within two budget intervals
    (plus a tick) of its recovery: each part of each device (free memory, taints) is judged on
    its own calm. GPU 0's rises still wait (its dip stays published) and its churn costs no
    write after its first dip."""
    settings = load_settings(node_name="n", dra=True, min_patch_interval_s=INTERVAL_S,
                             dra_taint_effect=effect)  # fmt: skip
    cache = SnapshotCache(lambda: 0.0)
    writer = ResourceSliceWriter(settings, None, cache, wall=lambda: 0.0)
    cleared_at, t = None, 0.0
    while t <= 1800.0:
        writer.write(*churn_reading(t), None, t)
        _, gpu1 = by_gpu(writer.published)
        assert t >= RECOVERED_AT_S or gpu1["taints"][0]["value"] == "remap-pending"
        if cleared_at is None and not gpu1.get("taints"):
            cleared_at = t
        t += TICK_S
    assert cleared_at is not None, "GPU 1's taint held for good"
    assert cleared_at - RECOVERED_AT_S <= 2 * INTERVAL_S + TICK_S
    gpu0, _ = by_gpu(writer.published)
    assert gpu0["attributes"]["freeMemoryMiB"] == {"int": 39936}  # the dip, held
    # the first write, GPU 0's first dip, GPU 1's taint gone: the churn costs nothing more
    assert cache.slice_writes <= 3


def churn_trace(tmp_path: Path) -> Path:
    """Two H100s, a sample every 10 s: GPU 0's free memory 40,000 MiB every 20 s, 81,079
    between; GPU 1 idle, its remapped rows pending until ``RECOVERED_AT_S``."""
    times = [i * TICK_S for i in range(int(END_S / TICK_S) + 1)]
    path = small_trace(
        tmp_path, [(t, (40000 if t % 20 == 0 else 81079, 81079)) for t in times], "churn"
    )
    doc = json.loads(path.read_text())
    for sample in doc["samples"]:
        sample["gpus"][1]["remapped_rows"] = {
            "correctable": 0, "uncorrectable": int(sample["t"] < RECOVERED_AT_S),
            "pending": int(sample["t"] < RECOVERED_AT_S), "failure": 0,
        }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.cluster
def test_a_churning_neighbour_does_not_hold_a_recovered_gpus_label(
    dev_cluster, admin_api, make_node, namespace, tmp_path  # noqa: F811
):
    """GPU 1's ``Healthy`` reaches the Node within two budget intervals (plus a tick) of its
    recovery; GPU 0's churn still costs no patch after its first dip (its rises
    wait for its own calm, which never comes: its label stays at the dip)."""
    node = make_node()
    clock = Clock(0.0)
    agent = lease_agent(dev_cluster.kubeconfig, node, namespace, churn_trace(tmp_path), clock,
                        min_patch_interval_s=INTERVAL_S)  # fmt: skip
    healthy_at = None
    t = 1.0
    try:
        while t <= END_S:
            clock.t = t
            agent.tick()
            labels = node_metadata(admin_api, node)[0]
            if t < RECOVERED_AT_S:
                assert labels[P + "gpu-1.health"] == "Unhealthy"
            elif healthy_at is None and labels[P + "gpu-1.health"] == "Healthy":
                healthy_at = t
            t += TICK_S
        assert healthy_at is not None, "GPU 1's recovery held for good"
        assert healthy_at - RECOVERED_AT_S <= 2 * INTERVAL_S + TICK_S
        labels = node_metadata(admin_api, node)[0]
        assert labels[P + "gpu-0.memory.free-mib"] == "39936"  # the dip, still held
        assert labels[P + "gpu.healthy-count"] == "2"
        # the first patch, GPU 0's first dip, GPU 1's recovery: the churn costs nothing more
        assert agent.cache.patches_sent <= 3
    finally:
        Daemon(agent).shutdown()


# -- the ResourceSlice's budget, part by part -------------------------------------------------

from omaticaya_py.core.publish.budget import Calm  # noqa: E402
from omaticaya_py.core.publish.dra import TAINT_UNHEALTHY  # noqa: E402
from omaticaya_py.core.publish.publisher import Publisher  # noqa: E402
from omaticaya_py.core.publish.slice_budget import within_budget  # noqa: E402
from omaticaya_py.core.publish.slice_device import DeviceTaint, SliceDevice  # noqa: E402


def dev(name: str, free: int, *taints: str) -> SliceDevice:
    return SliceDevice(
        name, "gpu", False, 0, uuid=f"GPU-{name}", free_memory_mib=free,
        taints=tuple(DeviceTaint(TAINT_UNHEALTHY, v, "NoSchedule") for v in taints),
    )  # fmt: skip


SICK = [dev("a", 1024, "remap-pending"), dev("b", 40960)]  # published: a tainted, b at its dip


@pytest.mark.parametrize(
    ("desired", "last_write_s", "calm", "expected"),
    [
        # a recovered and its memory up, b (the neighbour) churning: a's taint and memory go
        ([dev("a", 8192), dev("b", 81920)], 50.0, {("b", "free"): Calm(95.0, 30.0)},
         [dev("a", 8192), dev("b", 40960)]),
        # a's own memory churning: its taint still goes, its memory waits
        ([dev("a", 8192), dev("b", 40960)], 50.0, {("a", "free"): Calm(95.0, 30.0)},
         [dev("a", 1024), dev("b", 40960)]),
        # a's taint itself added 10 s ago (then cleared): the taint waits, the memory goes
        ([dev("a", 8192), dev("b", 40960)], 50.0, {("a", "taints"): Calm(90.0, 30.0)},
         [dev("a", 8192, "remap-pending"), dev("b", 40960)]),
        # the last write 5 s ago and nothing going: everything waits
        ([dev("a", 8192), dev("b", 81920)], 95.0, {}, SICK),
        # ... unless b drops now: a's calm changes ride on that write
        ([dev("a", 8192), dev("b", 20480)], 95.0, {("b", "free"): Calm(100.0, 30.0)},
         [dev("a", 8192), dev("b", 20480)]),
        # a flapping taint (its window doubled to 120 s, added 60 s ago): waits
        ([dev("a", 1024), dev("b", 40960)], 50.0, {("a", "taints"): Calm(40.0, 120.0)}, SICK),
    ],
    ids=["neighbour-churns", "own-memory-churns", "own-taint-recent", "rate-limit",
         "rides-on-a-drop", "flapping-taint"],
)
def test_each_part_of_each_device_waits_on_its_own_calm(desired, last_write_s, calm, expected):
    publisher = Publisher(INTERVAL_S, calm, last_write_s)
    assert within_budget(SICK, desired, publisher, 100.0) == expected
