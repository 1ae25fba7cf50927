"""End to end (issue 25 item 3): a burst of memory-slice pods on a real kube-apiserver +
kube-scheduler (the dev cluster's release) through the extender.

Nodes are written as an agent sharing all its GPUs writes them (``core.publish.render`` and the
telemetry of synthetic snapshots with ``OMATICAYA_SHARED_GPUS=all``: GPUs marked ``shared``,
``share_unit_mib`` 1,024; valid for 600 s), with ``omaticaya.io/gpu-memory`` in the Node's
capacity and allocatable as the device plugin would advertise it (79 units per H100, or fewer
where the test wants the kubelet's books to be what limits). No kubelet runs: a bound pod's
slice never shows in the telemetry, so it counts on its GPU in the extender's ledger until the
pod goes (settle time 600 s). Per GPU, what bound pods hold comes from where they bound and the
GPU the reservation chose for each slice.

A burst of 12 pods of 20 units (20 GiB) created at once: every pod whose slice fits binds
(7 by the GPUs' live free memory, 2 more on a node with memory for 7 but units for 2 in the
kubelet's books: kube-scheduler's own resource fit keeps counting the units); no GPU is promised
more than its live free memory; the 3 left stay Pending with the extender's reason.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.scheduler.burst_cluster_support import bound, ledger_scheduler, waiting_reason
from tests.scheduler.placement_cluster_support import api  # noqa: F401
from tests.scheduler.slices_cluster_support import (  # the names moved out, for this file's tests
    R,  # noqa: F401
    slice_pod,  # noqa: F401
    write_shared_node,  # noqa: F401
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

UNITS = 20
SLICE_MIB = UNITS * 1024
# node -> (live free MiB per shared GPU, units in the Node's allocatable)
NODES = {
    "a": ([70000, 30000], 158),  # 3 + 1 slices by memory
    "b": ([45000, 10000], 158),  # 2 + 0
    "c": ([0, 25000], 158),      # 0 + 1
    "d": ([81000, 81000], 40),   # 3 + 3 by memory, 2 by the kubelet's units
}  # fmt: skip
FIT = 3 + 1 + 2 + 0 + 0 + 1 + 2
BURST = 12






@pytest.fixture
def setup(api, scheduling_cluster, tmp_path) -> Iterator[dict[str, Any]]:  # noqa: F811
    tag = os.getpid()
    names = {f"s25-{tag}-{k}": v for k, v in NODES.items()}
    yield from ledger_scheduler(api, scheduling_cluster, tmp_path, f"slices25-{tag}",
                                "omaticaya-slices", names,
                                lambda name, v: write_shared_node(api, name, *v))  # fmt: skip


def promised(core: Any, ns: str, ledger: Any) -> tuple[Counter[tuple[str, int]], Counter[str]]:
    """(MiB of slices per (node, shared GPU) of the bound pods, pods per node)."""
    gpus: Counter[tuple[str, int]] = Counter()
    nodes: Counter[str] = Counter()
    for pod, (node, uid) in bound(core, ns).items():
        nodes[node] += 1
        held = ledger.get(uid)
        assert held is not None and held.node == node and held.slices == (UNITS,), (pod, held)
        for units, index in zip(held.slices, held.gpus, strict=True):
            gpus[(node, index)] += units * 1024
    return gpus, nodes


def test_a_burst_of_slices_binds_where_live_memory_and_units_hold_them(api, setup):  # noqa: F811
    from omaticaya_py.core.schema import parse_node

    ns, ledger, names = setup["ns"], setup["ledger"], setup["nodes"]
    live = {}  # (node, GPU) -> the free MiB the extender decides on (labels' rounding)
    for name in names:
        n = api.read_node(name)
        state = parse_node(name, n.metadata.labels, n.metadata.annotations)
        live.update({(name, g.index): g.free_mib for g in state.shared})
    assert sum(f // SLICE_MIB for f in live.values()) == FIT + 4  # d: 6 by memory, 2 by units
    for i in range(BURST):  # all at once, before any is scheduled
        api.create_namespaced_pod(ns, slice_pod(f"s{i}", setup["name"], UNITS))
    pods = [f"s{i}" for i in range(BURST)]

    def check() -> Counter[str]:
        gpus, nodes = promised(api, ns, ledger)
        assert all(mib <= live[k] for k, mib in gpus.items()), (gpus, live)
        return nodes

    def settled() -> bool:
        check()
        got = bound(api, ns)
        waiting = [waiting_reason(api, ns, p) for p in pods if p not in got]
        return len(got) == FIT and all(waiting)

    wait_for(f"{FIT} slice pods bound, the rest Pending with a reason", settled, 120,
             every_s=0.5)  # fmt: skip
    nodes = check()
    per = {name.rsplit("-", 1)[1]: nodes[name] for name in names}
    assert per == {"a": 4, "b": 2, "c": 1, "d": 2}, per  # d: the kubelet's books, 40 units
    got = bound(api, ns)
    for pod in (p for p in pods if p not in got):
        why = waiting_reason(api, ns, pod)
        assert f"{UNITS} units of {R} on one shared GPU" in why, why
        assert f"Insufficient {R}" in why, why  # kube-scheduler's own fit, on d
