"""The peak signal end to end, on the real kube-apiserver: an agent replays a trace whose free
memory dips for 5 s every minute, another a steady one; the extender (``serve``, over HTTP, with
its list+watch of the real Nodes) chooses the dipping GPU with ``signal=now`` and leaves it out
with ``signal=window-min``."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.kube import NodeClient
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import node_metadata
from tests.extender import RunningExtender
from tests.helpers import H100_TRACE, Clock
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

P = "omaticaya.io/"
MIB = 1024 * 1024
NEED_MIB = 30 * 1024


def write_trace(path: Path, free_mib, seconds: int = 120) -> Path:
    """A one-GPU trace from the H100 recording's first sample, one sample a second, free memory
    ``free_mib(t)`` (the rest of the sample as recorded: idle)."""
    doc = json.loads(H100_TRACE.read_text())
    first = doc["samples"][0]
    total = first["gpus"][0]["memory_bytes"]["total"]
    samples = []
    for t in range(seconds):
        sample = copy.deepcopy(first)
        sample["t"] = float(t)
        free = free_mib(t) * MIB
        gpu = sample["gpus"][0]
        gpu["memory_bytes"] = {"total": total, "used": total - free, "free": free}
        gpu.pop("memory_v2_bytes", None)
        samples.append(sample)
    doc.update(samples=samples, interval_s=1.0, phases=[])
    path.write_text(json.dumps(doc))
    return path


def dips(t: int) -> int:
    """70000 MiB free, but 4000 for 5 s every minute (a periodic job's peak)."""
    return 4000 if 30 <= t % 60 < 35 else 70000



def run_agent(dev_cluster, api, node: str, trace: Path, until_s: int) -> dict[str, Any]:
    """Tick an agent (window 60 s) once a trace second up to ``until_s``; the Node's telemetry."""
    clock = Clock()
    # the telemetry of the last tick's change: no write budget (it would hold the rise after a
    # dip, and the telemetry with it)
    settings = load_settings(node_name=node, window_s=60, cleanup_on_exit=False, min_patch_interval_s=0)
    reader = TraceReader(trace, loop=False, window_s=1.0, clock=clock)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    agent = Agent(settings, reader, NodeApi(client, lease=None), clock=clock)
    try:
        for t in range(until_s + 1):
            clock.t = float(t)
            agent.tick()
    finally:
        client.close()
    return json.loads(node_metadata(api, node)[1][P + "telemetry"])


POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u",
                    "annotations": {P + "gpu-memory-mib": str(NEED_MIB)}}}  # fmt: skip


def choose(ext: RunningExtender, names: list[str]) -> tuple[list[str], str | None]:
    """(nodes that pass the filter, the best-scored of them)."""
    passed = ext.post("filter", POD, names)["NodeNames"] or []
    if not passed:
        return [], None
    scores = ext.post("prioritize", POD, passed)
    return passed, max(scores, key=lambda s: s["Score"])["Host"]


def test_window_min_leaves_out_a_gpu_that_dips_and_now_chooses_it(
    dev_cluster, admin_api, make_node, tmp_path
):
    dipping, steady = make_node(), make_node()
    doc = run_agent(dev_cluster, admin_api, dipping, write_trace(tmp_path / "dips.json", dips), 95)
    gpu = doc["gpus"][0]
    # at t=95 the GPU has 70000 MiB free; the window (60 s, 35..95) saw the dip at 30..34 end
    # at 35, so its minimum is the dip's 4000 MiB
    assert doc["window_s"] == 60
    assert gpu["memory_free_mib"] == 70000 and gpu["memory_free_min_mib"] == 4000
    flat = run_agent(
        dev_cluster, admin_api, steady, write_trace(tmp_path / "steady.json", lambda t: 40000), 95
    )
    # nothing changed after its first tick (window not yet covered): the Node was written once,
    # the window goes with the next write; the extender judges it by now, its minimum anyway
    assert "memory_free_min_mib" not in flat["gpus"][0]

    names = sorted([dipping, steady])
    for signal, passed, best in (
        ("now", names, dipping),  # spread: the most free memory now wins
        ("window-min", [steady], steady),  # the dip leaves no room for 30 GiB
    ):
        settings = {"placement_policy": "spread", "signal": signal, "settle_s": 0}
        ext = RunningExtender(str(dev_cluster.kubeconfig), settings)
        try:
            wait_for(f"the extender ({signal}) to list the Nodes",
                     lambda ext=ext: ext.get("/readyz")[0] == 200, 20)  # fmt: skip
            got, chosen = choose(ext, names)
        finally:
            ext.close()
        assert (sorted(got), chosen) == (sorted(passed), best), signal


def test_the_real_kube_scheduler_places_by_the_window_minimum(
    dev_cluster, admin_api, make_node, tmp_path
):
    """The same two nodes, Ready, and the real kube-scheduler calling the extender: a
    30 GiB pod goes to the dipping GPU's node with ``signal=now`` (spread: the most free memory
    now) and to the steady one with ``signal=window-min``."""
    from tests.scheduler.scheduling_cluster_support import (
        ExtenderScheduler,
        bound_node,
        gpu_pod,
        schedulable,
    )

    dipping, steady = make_node(), make_node()
    for node in (dipping, steady):
        schedulable(admin_api, node)
    run_agent(dev_cluster, admin_api, dipping, write_trace(tmp_path / "dips.json", dips), 95)
    run_agent(dev_cluster, admin_api, steady, write_trace(tmp_path / "flat.json", lambda t: 40000), 95)
    dev_cluster.start_scheduler()
    ns = f"window-{os.getpid()}"
    admin_api.create_namespace({"metadata": {"name": ns}})
    admin_api.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    try:
        for signal, expected in (("now", dipping), ("window-min", steady)):
            name = f"window-{signal}"
            sched = ExtenderScheduler(dev_cluster, tmp_path, name, "spread", signal=signal)
            try:
                admin_api.create_namespaced_pod(ns, gpu_pod(name, name, NEED_MIB))
                assert bound_node(admin_api, ns, name, 30) == expected, signal
            finally:
                sched.close()
    finally:
        admin_api.delete_namespace(ns)
