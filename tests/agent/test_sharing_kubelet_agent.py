"""Slices as the agent sees them through the real kubelet's PodResources (issue 25, item 5).

Our device plugin serves the 8-GPU sharing trace with GPUs 0-3 shared on the dev cluster's real
kubelet + containerd (the fixtures of ``tests/deviceplugin/test_device_plugin_sharing_kubelet.py``); a pod
asks for 20 units of ``omaticaya.io/gpu-memory``. An agent reading the same trace, with the
kubelet's PodResources socket, must find the unit IDs the kubelet lists under its GPU (not
filtered out as another resource's), publish the slice's ``limit_mib``, and count its units
against the largest slice that GPU can still take (``gpu.shared.memory.free-mib``).

Needs Linux and root; skipped otherwise, or while another kubelet runs on this machine.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.sources.replay import TraceReader
from tests.deviceplugin.device_plugin_sharing_kubelet_support import (  # noqa: F401  (fixtures)
    MEM,
    kubelet,
    plugin,
    pods,
    resources,
    run,
    slice_of,
)
from tests.deviceplugin.device_plugin_sharing_support import UUID, write_sharing_trace
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

P = "omaticaya.io/"


def test_the_agent_sees_the_kubelets_slices(admin_api, dev_cluster, kubelet, plugin, pods):  # noqa: F811
    # this module's kubelet is a new one on the Node an earlier module's kubelet served: the
    # Node's status may still show that one's units, and a pod admitted before this kubelet has
    # the plugin's devices gets none ("no devices found allocated in local cache"). Wait for
    # the plugin's registration with this kubelet and for the units it reports itself.
    wait_for("the plugin registered", lambda: "registered omaticaya.io/gpu-memory" in plugin.log(), 60)
    admin_api.patch_node_status(kubelet, {"status": {
        "capacity": {MEM: None}, "allocatable": {MEM: None}}})  # fmt: skip
    wait_for("the units on the Node", lambda: resources(admin_api, kubelet)[MEM] == (316, 316), 60)
    index, mib = slice_of(run(admin_api, pods, "agent-slice", MEM, 20))
    assert mib == 20480

    socket_path = dev_cluster.state_dir / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
    trace = write_sharing_trace(Path(tempfile.mkdtemp(prefix="omaticaya-agent-")) / "trace.json")
    settings = load_settings(node_name=kubelet, shared_gpus="0-3", share_enforcement="none")
    edge = Attribution(socket_path, None)
    agent = Agent(
        settings, TraceReader(trace, at_s=0.0), NodeApi(None, dry_run=True), attribution=edge
    )
    try:
        result = agent.tick()
    finally:
        edge.close()
    assert edge.errors == {} and edge.skipped == {}
    doc = json.loads(result.desired.annotations[P + "telemetry"])
    assert doc["share_unit_mib"] == 1024
    assert [g.get("shared", False) for g in doc["gpus"]] == [True] * 4 + [False] * 4
    gpu = doc["gpus"][index]
    assert gpu["uuid"] == UUID[index]
    assert {"namespace": "default", "pod": "agent-slice", "container": "c", "limit_mib": 20480} in [
        {k: p.get(k) for k in ("namespace", "pod", "container", "limit_mib")} for p in gpu["pods"]
    ]
    # the GPU's units not held bound its room; the label is the best shared GPU's
    held = sum(p.get("limit_mib", 0) for p in gpu["pods"]) // 1024
    assert held >= 20
    rooms = [
        min(g["memory_free_mib"], (79 - sum(p.get("limit_mib", 0) for p in g.get("pods", ())) // 1024) * 1024)
        for g in doc["gpus"][:4] if g["health"] == "Healthy"
    ]
    assert result.desired.labels[P + "gpu.shared.memory.free-mib"] == str(max(rooms) // 1024 * 1024)

    registry = CollectorRegistry()
    agent_registry(agent, registry)
    assert registry.get_sample_value("omaticaya_pod_gpu_memory_limit_bytes", {
        "gpu": str(index), "uuid": UUID[index], "pod": "agent-slice", "namespace": "default",
        "container": "c",
    }) == 20480 * 1024 * 1024  # fmt: skip
