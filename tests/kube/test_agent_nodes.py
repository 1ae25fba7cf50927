"""``omaticaya check-labels`` (kube/agent_nodes.py): the chart's ``helm test``.

The judgement as tables (a DaemonSet, its pods and their Nodes -> the problems, one line each);
the requests through a real ``ApiSession`` against a small fake API server on 127.0.0.1 (GET the
DaemonSet, LIST its pods by its selector, GET each of their Nodes once); the CLI's exit statuses
and lines. The real thing, ``helm test`` on a real kube-apiserver and kubelet, is
tests/charts/test_helm_install.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from omaticaya_py.cli import main
from omaticaya_py.kube import KubeError
from omaticaya_py.kube.agent_nodes import check_agent_nodes, judge
from tests.kube.fake_api_support import serve_fake_api, session, status

NS, NAME, UID, PREFIX = "omaticaya", "omaticaya", "ds-uid-1", "omaticaya.io"
SELECTOR = {
    "matchLabels": {"app.kubernetes.io/name": "omaticaya", "app.kubernetes.io/instance": "o"}
}


def daemonset(desired: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": UID},
        "spec": {"selector": SELECTOR},
        "status": {"desiredNumberScheduled": desired},
    }


def pod(name: str, node: str | None, *, ready: bool = True, owner: str = UID,
        terminating: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "ownerReferences": [{"kind": "DaemonSet", "name": NAME, "uid": owner}],
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def node(name: str, health: str | None = "Healthy", count: str = "8") -> dict[str, Any]:
    labels = {f"{PREFIX}/gpu.count": count, "kubernetes.io/hostname": name}
    if health is not None:
        labels[f"{PREFIX}/gpu.health"] = health
    return {"metadata": {"name": name, "labels": labels}}


PODS = [pod("agent-a", "gpu-a"), pod("agent-b", "gpu-b")]
NODES = {"gpu-a": node("gpu-a"), "gpu-b": node("gpu-b", health="Degraded")}

CASES = [
    # (id, daemonset, pods, nodes, the problems, each a text it must hold)
    ("all-labelled", daemonset(), PODS, NODES, []),
    ("no-daemonset", None, [], {}, ["DaemonSet omaticaya/omaticaya not found"]),
    ("targets-no-node", daemonset(0), [], {}, ["targets no Node", "nodeSelector"]),
    ("label-missing", daemonset(), PODS, {**NODES, "gpu-b": node("gpu-b", health=None)},
     ["Node gpu-b has no omaticaya.io/gpu.health label", "kubectl -n omaticaya logs agent-b"]),
    ("nvml-unreadable", daemonset(), PODS, {**NODES, "gpu-a": node("gpu-a", health="Unknown")},
     ["Node gpu-a: omaticaya.io/gpu.health=Unknown: its agent cannot read NVML"]),
    ("pod-not-ready", daemonset(), [PODS[0], pod("agent-b", "gpu-b", ready=False)], NODES,
     ["Node gpu-b: the agent pod agent-b is not Ready"]),
    ("pod-unscheduled", daemonset(), [PODS[0], pod("agent-b", None)], NODES,
     ["wants 2 pods, 1 run on a Node (agent-b not scheduled)"]),
    ("pod-missing", daemonset(3), PODS, NODES, ["wants 3 pods, 2 run on a Node"]),
    ("node-gone", daemonset(), PODS, {**NODES, "gpu-b": None}, ["Node gpu-b not found"]),
    # another owner's pod matching the selector, and a terminating pod, are not the agent's
    ("not-its-pods", daemonset(),
     [*PODS, pod("other", "gpu-c", owner="x"), pod("old", "gpu-d", ready=False, terminating=True)],
     NODES, []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ds", "pods", "nodes", "said"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_judge_says_each_problem_in_one_line(ds, pods, nodes, said):
    check = judge(NS, NAME, PREFIX, ds, pods, nodes)
    problems = check.problems()
    assert all("\n" not in p for p in problems)
    if not said:
        assert problems == []
        assert check.lines()[-1] == (
            "DaemonSet omaticaya/omaticaya: the agent labelled all 2 Node(s) it runs on"
        )
        assert [n.node for n in check.nodes] == ["gpu-a", "gpu-b"]
        return
    assert len(problems) == 1, problems
    for text in said:
        assert text in problems[0], problems


def test_each_node_is_listed_with_its_health_and_count():
    lines = judge(NS, NAME, PREFIX, daemonset(), PODS, NODES).lines()
    assert lines[:2] == [
        "Node gpu-a: omaticaya.io/gpu.health=Healthy, omaticaya.io/gpu.count=8 (pod agent-a)",
        "Node gpu-b: omaticaya.io/gpu.health=Degraded, omaticaya.io/gpu.count=8 (pod agent-b)",
    ]


# --------------------------------------------------------------- a fake API server ----


class FakeApi:
    """A DaemonSet, the namespace's pods and the Nodes; records each request (method, path,
    query)."""

    def __init__(self) -> None:
        self.daemonset: dict[str, Any] | None = daemonset()
        self.pods = [*PODS, pod("agent-a2", "gpu-a", owner="x")]
        self.nodes: dict[str, dict[str, Any]] = dict(NODES)
        self.forbid_nodes = False
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []

    def handle(self, method: str, url: str) -> tuple[int, Any]:
        parts = urlsplit(url)
        self.requests.append((method, parts.path, parse_qs(parts.query)))
        if parts.path == f"/apis/apps/v1/namespaces/{NS}/daemonsets/{NAME}":
            return (200, self.daemonset) if self.daemonset else (404, status(404, "NotFound"))
        if parts.path == f"/api/v1/namespaces/{NS}/pods":
            return 200, {"kind": "PodList", "items": self.pods}
        if parts.path.startswith("/api/v1/nodes/"):
            if self.forbid_nodes:
                return 403, status(403, "Forbidden")
            found = self.nodes.get(parts.path.rsplit("/", 1)[1])
            return (200, found) if found else (404, status(404, "NotFound"))
        return 404, status(404, "NotFound")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApi, Path]]:
    fake = FakeApi()
    with serve_fake_api(lambda method, path, _body: fake.handle(method, path), tmp_path) as kubeconfig:
        yield fake, kubeconfig


def test_reads_the_daemonset_its_pods_by_selector_and_each_node_once(api):
    fake, kubeconfig = api
    fake.pods.append(pod("agent-a3", "gpu-a", terminating=True))  # gpu-a read once all the same
    check = check_agent_nodes(session(kubeconfig), NS, NAME, PREFIX + "/")
    assert check.problems() == [] and check.prefix == PREFIX
    assert [(m, p) for m, p, _ in fake.requests] == [
        ("GET", f"/apis/apps/v1/namespaces/{NS}/daemonsets/{NAME}"),
        ("GET", f"/api/v1/namespaces/{NS}/pods"),
        ("GET", "/api/v1/nodes/gpu-a"),
        ("GET", "/api/v1/nodes/gpu-b"),
    ]
    (selector,) = fake.requests[1][2]["labelSelector"]
    assert selector == "app.kubernetes.io/instance=o,app.kubernetes.io/name=omaticaya"


def test_a_node_refused_raises_naming_what_the_check_needs(api):
    fake, kubeconfig = api
    fake.forbid_nodes = True
    with pytest.raises(KubeError) as err:
        check_agent_nodes(session(kubeconfig), NS, NAME, PREFIX)
    assert err.value.status == 403


# --------------------------------------------------------------------------- the CLI ----


def cli(kubeconfig: Path, *extra: str) -> int:
    return main(["check-labels", "--namespace", NS, "--name", NAME,
                 "--kubeconfig", str(kubeconfig), *extra])  # fmt: skip


def test_cli_all_labelled_is_status_0(api, capsys):
    _, kubeconfig = api
    assert cli(kubeconfig) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].endswith("the agent labelled all 2 Node(s) it runs on") and not err


def test_cli_a_node_unlabelled_is_status_1_naming_it(api, capsys):
    fake, kubeconfig = api
    fake.nodes["gpu-b"] = node("gpu-b", health=None)
    assert cli(kubeconfig) == 1
    out, err = capsys.readouterr()
    assert "Node gpu-b: omaticaya.io/gpu.health=(none)" in out
    assert err.startswith("omaticaya: Node gpu-b has no omaticaya.io/gpu.health label")
    assert err.count("\n") == 1


def test_cli_reads_the_prefix_given(api, capsys, monkeypatch):
    fake, kubeconfig = api
    monkeypatch.setenv("OMATICAYA_PREFIX", "gpu.example.com")
    assert cli(kubeconfig) == 1  # the Nodes' keys are under omaticaya.io
    assert "no gpu.example.com/gpu.health label" in capsys.readouterr().err
    assert cli(kubeconfig, "--prefix", PREFIX) == 0


def test_cli_an_api_failure_is_status_1_with_one_line(api, capsys):
    fake, kubeconfig = api
    fake.forbid_nodes = True
    assert cli(kubeconfig) == 1
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "403" in err


def test_cli_needs_namespace_and_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check-labels", "--name", NAME])
    assert exit_.value.code == 2
