"""The agent end to end against the real kube-apiserver from scripts/dev-cluster.

The recorded H100 trace is replayed through ``Agent.tick()`` with a controlled clock; the Node
is read back as admin after each tick. Requests are counted at the client (``NodeClient.requests``)
and cross-checked in the API server's own audit log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.schema import STATIC_NAMES
from omaticaya_py.kube import KubeForbidden, KubeNotFound, KubeUnavailable, NodeClient
from omaticaya_py.sources.replay import TraceReader
from tests.audit import audit_count
from tests.conftest import node_metadata
from tests.helpers import H100_TRACE, Clock, token_kubeconfig
from tests.helpers import run_cli as _cli
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

P = "omaticaya.io/"
FOREIGN_LABELS = {"nvidia.com/gpu.present": "true", "topology.kubernetes.io/zone": "zone-a"}
FOREIGN_ANNOTATIONS = {"example.com/owner": "team-gpu"}



def make_agent(dev_cluster, node: str, clock: Clock | None = None, *, at_s=None, **env):
    clock = clock or Clock()
    settings = load_settings(node_name=node, **env)
    reader = TraceReader(H100_TRACE, at_s=at_s, loop=False, window_s=2.0, clock=clock)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    return Agent(settings, reader, NodeApi(client), clock=clock), clock


def ours(labels: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(P): v for k, v in labels.items() if k.startswith(P)}


def audit_gets(dev_cluster, node: str) -> int:
    """GET requests on this Node in the API server's audit log (ResponseComplete stage)."""
    return audit_count(dev_cluster, verb="get", name=node)


def audit_patches(dev_cluster, node: str) -> int:
    """PATCH requests on this Node in the API server's audit log (ResponseComplete stage)."""
    return audit_count(dev_cluster, verb="patch", name=node)


def test_labels_follow_the_trace_phases(dev_cluster, admin_api, make_node):
    node = make_node(labels=FOREIGN_LABELS, annotations=FOREIGN_ANNOTATIONS)
    # every phase on the Node as it comes, rises too: no write budget (test_lease_cluster's)
    agent, clock = make_agent(dev_cluster, node, min_patch_interval_s=0)
    seen: dict[float, dict[str, str]] = {}
    for t in (0.0, 2.0, 5.0, 7.0, 9.5, 11.0, 13.0, 14.0, 17.0, 20.0, 23.0, 25.5):
        clock.t = t
        agent.tick()
        seen[t] = ours(node_metadata(admin_api, node)[0])

    free = {t: int(v["gpu.memory.free-mib"]) for t, v in seen.items()}
    util = {t: int(v["gpu.utilization-pct"]) for t, v in seen.items()}
    # idle: the whole 80 GB less the driver's reservation, rounded down to 1 GiB
    assert free[2.0] == 80896
    # 30 GiB allocated: free memory drops by ~30 GiB, and comes back when released
    assert 30 * 1024 - 1024 <= free[2.0] - free[9.5] <= 30 * 1024 + 2048
    assert free[25.5] >= free[2.0] - 2048
    # utilisation rises to 100 under the matmul and falls back afterwards
    assert util[2.0] == 0 and util[9.5] == 0
    assert util[14.0] == 100 and util[17.0] == 100
    assert util[25.5] <= 10
    assert {v["gpu.health"] for v in seen.values()} == {"Healthy"}
    last = seen[25.5]
    assert last["gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert last["gpu.family"] == "hopper"
    assert (last["cuda.runtime-version.major"], last["cuda.runtime-version.minor"]) == ("13", "0")
    assert last["cuda.driver-version.full"] == "580.159.04"
    labels, annotations = node_metadata(admin_api, node)
    for key, value in FOREIGN_LABELS.items():
        assert labels[key] == value
    assert annotations["example.com/owner"] == "team-gpu"
    telemetry = json.loads(annotations[P + "telemetry"])
    assert telemetry["gpus"][0]["uuid"] == "GPU-178dd196-7fda-b7ae-a94e-630097a14ca4"
    assert telemetry["read_at"].endswith("Z")


def test_only_keys_under_the_prefix_change_and_stale_ones_go(dev_cluster, admin_api, make_node):
    stale = {P + "gpu-7.health": "Healthy", P + "old.label": "1"}
    node = make_node(
        labels={**FOREIGN_LABELS, **stale, "omaticaya.io.evil/x": "keep"},
        annotations={**FOREIGN_ANNOTATIONS, P + "old-annotation": "x"},
    )
    before_labels, before_annotations = node_metadata(admin_api, node)
    agent, _ = make_agent(dev_cluster, node, at_s=3.0)
    result = agent.tick()
    labels, annotations = node_metadata(admin_api, node)

    foreign = {k: v for k, v in before_labels.items() if not k.startswith(P)}
    assert {k: v for k, v in labels.items() if not k.startswith(P)} == foreign
    foreign_ann = {k: v for k, v in before_annotations.items() if not k.startswith(P)}
    assert {k: v for k, v in annotations.items() if not k.startswith(P)} == foreign_ann
    assert {k: v for k, v in labels.items() if k.startswith(P)} == result.desired.labels
    assert [k for k in annotations if k.startswith(P)] == [P + "telemetry"]


def test_no_request_when_nothing_changed(dev_cluster, admin_api, make_node):
    node = make_node()
    agent, clock = make_agent(dev_cluster, node, at_s=3.0, heartbeat_s=300)
    agent.tick()  # GET + PATCH
    assert sum(agent.node.requests.values()) == 2
    patches_before = audit_patches(dev_cluster, node)
    for i in range(20):
        clock.t = 10.0 * (i + 1)  # 200 s of ticks, heartbeat not yet due
        result = agent.tick()
        assert result.patch is None and not result.sent
    assert sum(agent.node.requests.values()) == 2
    # the audit backend writes asynchronously: a later request's entry shows it has caught up
    agent.node.get_node()
    wait_for("the audit log to record the last GET", lambda: audit_gets(dev_cluster, node) >= 2, 10)
    assert audit_patches(dev_cluster, node) == patches_before == 1

    clock.t = 301.0  # heartbeat due: only the telemetry annotation is rewritten
    result = agent.tick()
    assert result.sent and set(result.patch["metadata"]) == {"annotations"}
    assert agent.node.requests[("patch", "200")] == 2


def test_cleanup_removes_all_and_only_ours(dev_cluster, admin_api, make_node):
    node = make_node(labels=FOREIGN_LABELS, annotations=FOREIGN_ANNOTATIONS)
    agent, _ = make_agent(dev_cluster, node, at_s=14.0)
    agent.tick()
    before_labels, before_annotations = node_metadata(admin_api, node)
    assert ours(before_labels)

    agent.cleanup(keep_static=True)  # what SIGTERM does
    labels, annotations = node_metadata(admin_api, node)
    assert set(ours(labels)) == STATIC_NAMES & set(ours(before_labels))
    assert P + "telemetry" not in annotations

    agent.cleanup(keep_static=False)  # `omaticaya cleanup`
    labels, annotations = node_metadata(admin_api, node)
    assert ours(labels) == {}
    assert labels == {k: v for k, v in before_labels.items() if not k.startswith(P)}
    assert annotations == {k: v for k, v in before_annotations.items() if not k.startswith(P)}


def test_recreated_node_is_relabelled(dev_cluster, admin_api, make_node):
    node = make_node()
    agent, clock = make_agent(dev_cluster, node, at_s=3.0, heartbeat_s=30)
    first = agent.tick()
    admin_api.delete_node(node)
    admin_api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    clock.t = 31.0  # heartbeat: the patch response shows a new uid and no labels
    agent.tick()
    labels, _ = node_metadata(admin_api, node)
    assert {k: v for k, v in labels.items() if k.startswith(P)} == first.desired.labels


def test_edge_errors_are_our_own_types(dev_cluster, tmp_path):
    missing = NodeClient("no-such-node", kubeconfig=str(dev_cluster.kubeconfig))
    with pytest.raises(KubeNotFound, match="404"):
        missing.get_node()
    assert missing.requests[("get", "404")] == 1

    # a kubeconfig pointing at a closed port: retried, then KubeUnavailable
    closed = tmp_path / "kubeconfig"
    text = dev_cluster.kubeconfig.read_text()
    closed.write_text(text.replace(dev_cluster.server, "https://127.0.0.1:1"))
    naps: list[float] = []
    down = NodeClient("n", kubeconfig=str(closed), attempts=3, sleep=naps.append)
    with pytest.raises(KubeUnavailable):
        down.get_node()
    assert down.requests[("get", "error")] == 3 and len(naps) == 2


def test_forbidden_without_rbac(dev_cluster, admin_api, make_node, tmp_path):
    """A service account with no RBAC gets a clear KubeForbidden, tried once only."""
    node = make_node()
    ns = "default"
    sa = f"norbac-{os.getpid()}"
    admin_api.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
    token = admin_api.create_namespaced_service_account_token(
        sa, ns, {"spec": {"audiences": [], "expirationSeconds": 600}}
    ).status.token
    cfg = token_kubeconfig(dev_cluster, token, tmp_path / "kubeconfig")
    client = NodeClient(node, kubeconfig=str(cfg), sleep=lambda s: None)
    with pytest.raises(KubeForbidden, match="RBAC"):
        client.patch_node({"metadata": {"labels": {P + "x": "1"}}})
    assert client.requests == {("patch", "403"): 1}


def test_cli_once_and_cleanup(dev_cluster, admin_api, make_node):
    node = make_node(labels=FOREIGN_LABELS)
    env = dict(dev_cluster.env(), NODE_NAME=node)
    trace = str(H100_TRACE)
    done = _cli("once", "--trace", trace, "--trace-at", "14", "--schedule", "@every 2s", env=env)
    assert done.returncode == 0, done.stderr
    assert "health Healthy" in done.stdout
    labels, _ = node_metadata(admin_api, node)
    assert labels[P + "gpu.utilization-pct"] == "100"

    dry = _cli("once", "--trace", trace, "--trace-at", "2", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    patch = json.loads(dry.stdout)
    assert patch["metadata"]["labels"][P + "gpu.utilization-pct"] == "0"
    assert node_metadata(admin_api, node)[0] == labels  # nothing sent

    gone = _cli("cleanup", env=env)
    assert gone.returncode == 0, gone.stderr
    labels, annotations = node_metadata(admin_api, node)
    assert ours(labels) == {} and not any(k.startswith(P) for k in annotations)
    assert labels["nvidia.com/gpu.present"] == "true"


def test_sigterm_on_run_removes_dynamic_labels_and_exits_0(dev_cluster, admin_api, make_node):
    node = make_node(labels=FOREIGN_LABELS)
    env = dict(
        dev_cluster.env(),
        NODE_NAME=node,
        OMATICAYA_TRACE=str(H100_TRACE),
        OMATICAYA_SCHEDULE="@every 1s",
        OMATICAYA_METRICS_PORT="0",
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            "the agent to label the Node",
            lambda: P + "gpu.health" in node_metadata(admin_api, node)[0],
            30,
            every_s=0.2,
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "SIGTERM received" in stderr and "Traceback" not in stderr
    labels, annotations = node_metadata(admin_api, node)
    assert set(ours(labels)) <= STATIC_NAMES and "gpu.count" in ours(labels)
    assert P + "telemetry" not in annotations
    assert labels["nvidia.com/gpu.present"] == "true"


def test_demo_script_exists():
    assert Path(__file__).resolve().parents[2].joinpath("scripts", "demo").exists()
