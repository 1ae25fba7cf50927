"""Did the agent label its Nodes? The chart's ``helm test`` (``omaticaya check-labels``).

The agent's DaemonSet is read by name; the pods it owns (listed by its selector, kept by
ownerReference) say which Nodes it runs on; each of those Nodes must carry
``<prefix>/gpu.health``, the label a running agent writes at its first tick and removes when it
stops (``cleanupOnExit``), and not as ``Unknown`` (NVML unreadable: no NVIDIA runtime or
library in the agent's container). A DaemonSet that targets no Node, fewer pods than it wants,
or a pod that is not Ready fail the check too, each with one line that says what to look at.

RBAC: ``get`` on ``daemonsets`` (apps) and ``list`` on ``pods`` in the DaemonSet's namespace;
``get`` on ``nodes``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.schema.names import GPU_COUNT, HEALTH
from .errors import KubeNotFound
from .session import ApiSession
from .workloads import label_selector, owned_pods

__all__ = ["AgentNode", "LabelCheck", "check_agent_nodes", "judge"]

_DS_PATH = "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
_PODS_PATH = "/api/v1/namespaces/{namespace}/pods"
_NODE_PATH = "/api/v1/nodes/{name}"
_RBAC = "check-labels needs get on daemonsets and list on pods in {namespace}, get on nodes"


@dataclass(frozen=True)
class AgentNode:
    """One agent pod and its Node: ``ready`` (the pod's Ready condition), ``found`` (the Node
    exists), ``health`` and ``count`` (its ``<prefix>/gpu.health`` and ``gpu.count`` labels,
    None when absent)."""

    node: str
    pod: str
    ready: bool
    found: bool = True
    health: str | None = None
    count: str | None = None

    def problem(self, prefix: str, namespace: str) -> str | None:
        """What is wrong on this Node, in one line; None when the agent labelled it."""
        logs = f"kubectl -n {namespace} logs {self.pod}"
        if not self.found:
            return f"Node {self.node} not found (its agent pod {self.pod} is left over)"
        if not self.ready:
            return f"Node {self.node}: the agent pod {self.pod} is not Ready ({logs})"
        if self.health is None:
            return (
                f"Node {self.node} has no {prefix}/{HEALTH} label: its agent has not labelled "
                f"it ({logs})"
            )
        if self.health == "Unknown":
            return (
                f"Node {self.node}: {prefix}/{HEALTH}=Unknown: its agent cannot read NVML (no "
                "NVIDIA runtime or driver library in its container: the values file of your "
                f"NVIDIA stack, docs/install.md; {logs})"
            )
        return None

    def line(self, prefix: str) -> str:
        """The Node as the report lists it."""
        return (
            f"Node {self.node}: {prefix}/{HEALTH}={self.health or '(none)'}, "
            f"{prefix}/{GPU_COUNT}={self.count or '(none)'} (pod {self.pod}"
            f"{'' if self.ready else ', not Ready'})"
        )


@dataclass
class LabelCheck:
    """What ``check_agent_nodes`` saw of DaemonSet ``namespace/name``: ``found``, ``desired``
    (its ``status.desiredNumberScheduled``), ``unscheduled`` (its pods on no Node yet) and one
    ``AgentNode`` per pod on a Node."""

    namespace: str
    name: str
    prefix: str
    found: bool
    desired: int = 0
    unscheduled: list[str] = field(default_factory=list)
    nodes: list[AgentNode] = field(default_factory=list)

    def problems(self) -> list[str]:
        """One line per thing wrong; empty when every Node the DaemonSet runs on is labelled."""
        where = f"DaemonSet {self.namespace}/{self.name}"
        if not self.found:
            return [f"{where} not found: is the release installed in namespace {self.namespace}?"]
        if self.desired == 0:
            return [
                f"{where} targets no Node: no Node matches its nodeSelector and affinity, or "
                "each one has a taint it does not tolerate (the chart's values nodeSelector, "
                "affinity, tolerations; by default nodeSelector nvidia.com/gpu.present=true)"
            ]
        out: list[str] = []
        running = len(self.nodes)
        if running < self.desired:
            pending = f" ({', '.join(self.unscheduled)} not scheduled)" if self.unscheduled else ""
            out.append(f"{where} wants {self.desired} pods, {running} run on a Node{pending}")
        out += [p for n in self.nodes if (p := n.problem(self.prefix, self.namespace))]
        return out

    def lines(self) -> list[str]:
        """The report: one line per Node, then the verdict."""
        out = [n.line(self.prefix) for n in self.nodes]
        if not self.problems():
            out.append(
                f"DaemonSet {self.namespace}/{self.name}: the agent labelled all "
                f"{len(self.nodes)} Node(s) it runs on"
            )
        return out


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def judge(
    namespace: str,
    name: str,
    prefix: str,
    daemonset: Mapping[str, Any] | None,
    pods: list[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any] | None],
) -> LabelCheck:
    """The check, pure: ``daemonset`` (None: not found), the namespace's ``pods`` that match its
    selector, and ``nodes`` (name -> the Node, None when not found) of the pods it owns.
    Terminating pods are left out (an update replaces them)."""
    if daemonset is None:
        return LabelCheck(namespace, name, prefix, found=False)
    uid = daemonset["metadata"]["uid"]
    desired = int((daemonset.get("status") or {}).get("desiredNumberScheduled") or 0)
    check = LabelCheck(namespace, name, prefix, found=True, desired=desired)
    live = [p for p in owned_pods(pods, uid) if not p["metadata"].get("deletionTimestamp")]
    for pod in sorted(live, key=lambda p: str((p.get("spec") or {}).get("nodeName") or "")):
        pod_name = pod["metadata"]["name"]
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            check.unscheduled.append(pod_name)
            continue
        node = nodes.get(node_name)
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        check.nodes.append(
            AgentNode(
                node=node_name,
                pod=pod_name,
                ready=_ready(pod),
                found=node is not None,
                health=labels.get(f"{prefix}/{HEALTH}"),
                count=labels.get(f"{prefix}/{GPU_COUNT}"),
            )
        )
    return check


def check_agent_nodes(session: ApiSession, namespace: str, name: str, prefix: str) -> LabelCheck:
    """Read DaemonSet ``namespace/name``, its pods and their Nodes, and ``judge`` them (label
    keys under ``prefix``, without its trailing slash). Raises ``KubeError`` when the API
    refuses or does not answer."""
    prefix = prefix.rstrip("/")
    rbac = _RBAC.format(namespace=namespace)
    what = f"daemonset {namespace}/{name}"
    params = {"namespace": namespace, "name": name}
    try:
        response = session.call(
            "get", what, lambda: session.http("GET", _DS_PATH, path_params=params), rbac=rbac
        )
    except KubeNotFound:
        return judge(namespace, name, prefix, None, [], {})
    daemonset = json.loads(response.data)
    selector = label_selector((daemonset.get("spec") or {}).get("selector") or {})
    listed = session.call(
        "list",
        f"pods of {what}",
        lambda: session.http(
            "GET",
            _PODS_PATH,
            path_params={"namespace": namespace},
            query={"labelSelector": selector} if selector else None,
        ),
        rbac=rbac,
    )
    pods = json.loads(listed.data).get("items") or []
    nodes: dict[str, Mapping[str, Any] | None] = {}
    for pod in owned_pods(pods, daemonset["metadata"]["uid"]):
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or node_name in nodes:
            continue

        def get_node(n: str = node_name) -> Any:
            return session.http("GET", _NODE_PATH, path_params={"name": n})

        try:
            got = session.call("get", f"node {node_name}", get_node, rbac=rbac)
        except KubeNotFound:
            nodes[node_name] = None
        else:
            nodes[node_name] = json.loads(got.data)
    return judge(namespace, name, prefix, daemonset, pods, nodes)
