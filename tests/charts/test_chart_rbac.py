"""The chart's RBAC, proved against the real kube-apiserver from scripts/dev-cluster.

The chart's ServiceAccount, ClusterRole and ClusterRoleBinding are rendered with helm, applied as
admin, and then a client that holds ONLY a bound token of that ServiceAccount (TokenRequest API)
and the cluster CA tries what the agent does (allowed) and what it must not do (403).

The dev cluster runs the release under test (v1.37.2, or v1.31.0 in the oldest-release lane) and
only the RBAC is applied here: this proves RBAC alone, not the ValidatingAdmissionPolicies, which
tests/charts/test_admission_cluster.py applies to the real server and tests/charts/test_chart_admission.py
evaluates with a CEL runtime.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chart_rbac_support import (  # the names moved out, for this file's tests
    NODE,  # noqa: F401
    PROPAGATION_S,  # noqa: F401
    _apply,  # noqa: F401
    _core_event,  # noqa: F401
    _event_name,  # noqa: F401
    _exists_ok,  # noqa: F401
    _status,  # noqa: F401
)
from tests.tools import ToolUnavailable, helm_path

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "omaticaya"
NAMESPACE = "omaticaya-test"
RELEASE = "omaticaya-rbac"  # fullname: the release name (it contains the chart name)
OTHER_NODE = "rbac-other-node"
RBAC_TEMPLATES = (
    "templates/serviceaccount.yaml",
    "templates/clusterrole.yaml",
    "templates/clusterrolebinding.yaml",
    "templates/role.yaml",
    "templates/rolebinding.yaml",
)

# The session fixture ``dev_cluster`` comes from tests/conftest.py (tests.devcluster). Importing
# it here as well would make a module-level copy and start a second cluster.


def render_rbac(release: str = RELEASE, *sets: str) -> list[dict]:
    """The chart's RBAC documents for ``release``, with ``--set`` values ``sets``."""
    try:
        helm = helm_path()
    except ToolUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc}")
    args = [str(helm), "template", release, str(CHART), "--namespace", NAMESPACE]
    for value in sets:
        args += ["--set", value]
    for t in RBAC_TEMPLATES:
        args += ["--show-only", t]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ServiceAccount",
    ]
    return docs


@dataclass
class Agent:
    """API clients authenticated only by the agent ServiceAccount's bearer token."""

    core: Any  # kubernetes.client.CoreV1Api
    events: Any  # kubernetes.client.EventsV1Api
    leases: Any  # kubernetes.client.CoordinationV1Api
    admin: Any  # CoreV1Api as cluster admin, to check results
    service_account: str






@pytest.fixture(scope="module")
def agent(dev_cluster, admin_client) -> Iterator[Agent]:
    """The agent's token under the chart's default values."""
    yield from _agent_of(dev_cluster, admin_client, render_rbac())


@pytest.fixture(scope="module")
def sharing_agent(dev_cluster, admin_client) -> Iterator[Agent]:
    """The agent's token of a release with GPU sharing on (``sharing.gpus=all``, served by the
    device plugin: the chart refuses sharing with neither it nor DRA on)."""
    yield from _agent_of(dev_cluster, admin_client, render_rbac(f"{RELEASE}-sharing", "sharing.gpus=all",
                                                            "devicePlugin.enabled=true"))


def _agent_of(dev_cluster: Any, admin_client: Any, docs: list[dict]) -> Iterator[Agent]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    admin = client.CoreV1Api(admin_client)
    rbac = client.RbacAuthorizationV1Api(admin_client)

    _exists_ok(
        lambda: admin.create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
    )
    _apply(admin_client, docs)
    for name in (NODE, OTHER_NODE):
        _exists_ok(
            lambda name=name: admin.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": {"example.com/keep": "yes"}},
                }
            )
        )
    _exists_ok(
        lambda: admin.create_namespaced_secret(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "not-for-the-agent"},
                "stringData": {"password": "hunter2"},
            },
        )
    )

    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    token = admin.create_namespaced_service_account_token(
        sa,
        NAMESPACE,
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    ).status.token
    assert token

    cfg = client.Configuration(host=dev_cluster.server, ssl_ca_cert=str(dev_cluster.ca_file))
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    assert not cfg.cert_file and not cfg.key_file  # nothing but the token
    token_client = client.ApiClient(cfg)
    try:
        yield Agent(
            core=client.CoreV1Api(token_client),
            events=client.EventsV1Api(token_client),
            leases=client.CoordinationV1Api(token_client),
            admin=admin,
            service_account=sa,
        )
    finally:
        token_client.close()
        for name in (NODE, OTHER_NODE):
            try:
                admin.delete_node(name)
            except ApiException:
                pass
        for doc in docs:
            try:
                if doc["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(doc["metadata"]["name"])
                elif doc["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(doc["metadata"]["name"])
                elif doc["kind"] == "RoleBinding":
                    meta = doc["metadata"]
                    rbac.delete_namespaced_role_binding(meta["name"], meta["namespace"])
                elif doc["kind"] == "Role":
                    meta = doc["metadata"]
                    rbac.delete_namespaced_role(meta["name"], meta["namespace"])
            except ApiException:
                pass




def _merge_patch(api, name: str, labels: dict[str, str | None]) -> Any:
    return api.patch_node(
        name, {"metadata": {"labels": labels}}, _content_type="application/merge-patch+json"
    )


def test_agent_patches_its_node_labels(agent):
    """Merge-patch of the Node's labels works with the token alone (after RBAC propagates)."""
    deadline = time.monotonic() + PROPAGATION_S
    while True:
        status = _status(lambda: _merge_patch(agent.core, NODE, {"omaticaya.io/gpu.count": "8"}))
        if status != 403 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200
    labels = agent.admin.read_node(NODE).metadata.labels
    assert labels["omaticaya.io/gpu.count"] == "8"
    assert labels["example.com/keep"] == "yes"  # merge patch leaves foreign labels alone
    # and removes ours with null
    assert _status(lambda: _merge_patch(agent.core, NODE, {"omaticaya.io/gpu.count": None})) == 200
    assert "omaticaya.io/gpu.count" not in agent.admin.read_node(NODE).metadata.labels






def _events_v1_event(namespace: str) -> dict:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": _event_name(), "namespace": namespace},
        "eventTime": now,
        "reportingController": "omaticaya.io/agent",
        "reportingInstance": NODE,
        "action": "Check",
        "reason": "GpuHealthy",
        "note": "RBAC test",
        "type": "Normal",
        # 1.20's strict events.k8s.io/v1 validation wants the namespaces to match, even for a
        # cluster-scoped object (newer releases also accept "" with "default")
        "regarding": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": NODE,
            "namespace": namespace,
        },
    }


def _lease(name: str = "") -> dict:
    name = name or f"omaticaya-node-{NODE}-{datetime.now(timezone.utc):%H%M%S%f}"
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "rbac-test", "leaseDurationSeconds": 40},
    }


# (id, call, expected HTTP status); run after the patch test, so RBAC has propagated
CASES: list[tuple[str, Callable[[Agent], Any], int]] = [
    ("get-own-node", lambda a: a.core.read_node(NODE), 200),
    (
        "create-event-core-v1",
        lambda a: a.core.create_namespaced_event("default", _core_event("default")),
        201,
    ),
    # Events: core/v1 create in "default" only, where NodeClient posts them (issue 23)
    (
        "create-event-events-k8s-io-v1",
        lambda a: a.events.create_namespaced_event("default", _events_v1_event("default")),
        403,
    ),
    (
        "create-event-release-namespace",
        lambda a: a.core.create_namespaced_event(NAMESPACE, _core_event(NAMESPACE)),
        403,
    ),
    (
        "create-event-kube-system",
        lambda a: a.core.create_namespaced_event("kube-system", _core_event("kube-system")),
        403,
    ),
    (
        "patch-event",
        lambda a: a.core.patch_namespaced_event("any", "default", {"count": 2}),
        403,
    ),
    ("read-secret", lambda a: a.core.read_namespaced_secret("not-for-the-agent", NAMESPACE), 403),
    ("list-secrets", lambda a: a.core.list_namespaced_secret(NAMESPACE), 403),
    ("list-pods-all-namespaces", lambda a: a.core.list_pod_for_all_namespaces(), 403),
    ("list-pods-own-namespace", lambda a: a.core.list_namespaced_pod(NAMESPACE), 403),
    ("list-nodes", lambda a: a.core.list_node(), 403),
    ("watch-nodes", lambda a: a.core.list_node(watch=True, timeout_seconds=1), 403),
    ("delete-node", lambda a: a.core.delete_node(NODE), 403),
    ("create-node", lambda a: a.core.create_node({"metadata": {"name": "rbac-new-node"}}), 403),
    ("update-node-put", lambda a: a.core.replace_node(NODE, a.admin.read_node(NODE)), 403),
    (
        "patch-node-status",
        lambda a: a.core.patch_node_status(
            NODE,
            {"status": {"capacity": {"nvidia.com/gpu": "8"}}},
            _content_type="application/merge-patch+json",
        ),
        403,
    ),
    ("list-events", lambda a: a.core.list_namespaced_event("default"), 403),
    # Leases: the release namespace only; any name there with RBAC alone (RBAC cannot name them:
    # the admission policy, not applied here, binds them to the node claim). The chart's scheduler keeps its
    # leader-election Lease in kube-system, out of the agents' reach on every version.
    (
        "create-lease-release-namespace",
        lambda a: a.leases.create_namespaced_lease(NAMESPACE, _lease()),
        201,
    ),
    ("create-lease-kube-system", lambda a: a.leases.create_namespaced_lease("kube-system", _lease()), 403),
    (
        "update-scheduler-lease-kube-system",
        lambda a: a.leases.replace_namespaced_lease(
            "omaticaya-rbac-scheduler", "kube-system", _lease("omaticaya-rbac-scheduler")
        ),
        403,
    ),
    ("list-leases", lambda a: a.leases.list_namespaced_lease(NAMESPACE), 403),
    ("get-event", lambda a: a.core.read_namespaced_event("any", "default"), 403),
    ("delete-events", lambda a: a.core.delete_collection_namespaced_event("default"), 403),
    (
        "create-configmap",
        lambda a: a.core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "x"}}),
        403,
    ),
]


@pytest.mark.parametrize(("call", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_agent_token_permissions(agent, call, expected):
    test_agent_patches_its_node_labels(agent)  # waits for RBAC to propagate (cheap once it has)
    status = _status(lambda: call(agent))
    if expected == 201:
        assert status in (200, 201), status
    else:
        assert status == expected


def test_rbac_alone_does_not_pin_the_node(agent):
    """RBAC cannot restrict patch to the agent's own Node (no resourceNames at install time):
    another Node is patchable too. That is what validatingAdmissionPolicy (on by default, not applied here) adds."""
    test_agent_patches_its_node_labels(agent)
    assert _status(lambda: _merge_patch(agent.core, OTHER_NODE, {"omaticaya.io/x": "1"})) == 200


# ------------------------------------------------------------------- GPU sharing's extra ----
#: With sharing on, the agent reads each slice's pod (GET, by name) and posts
#: GpuMemoryOverLimit on it, in the pod's own namespace; still no list, watch or write of pods.
SHARING_CASES = [
    ("get-pod-other-namespace", lambda a: a.core.read_namespaced_pod("absent", "team-a"), 404),
    ("list-pods", lambda a: a.core.list_namespaced_pod("team-a"), 403),
    ("list-pods-all", lambda a: a.core.list_pod_for_all_namespaces(), 403),
    ("delete-pod", lambda a: a.core.delete_namespaced_pod("absent", "team-a"), 403),
    ("create-event-pod-namespace", lambda a: a.core.create_namespaced_event("team-a", _pod_event("team-a")), 201),
    ("get-secret", lambda a: a.core.read_namespaced_secret("not-for-the-agent", NAMESPACE), 403),
]  # fmt: skip


def _pod_event(namespace: str) -> dict:
    """A GpuMemoryOverLimit-like Event on a pod in ``namespace``."""
    pod = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": namespace, "uid": "u"}
    return {**_core_event(namespace), "involvedObject": pod, "reason": "GpuMemoryOverLimit"}


@pytest.mark.parametrize(
    ("call", "expected"), [c[1:] for c in SHARING_CASES], ids=[c[0] for c in SHARING_CASES]
)
def test_sharing_agent_token_permissions(sharing_agent, call, expected):
    from kubernetes.client.exceptions import ApiException

    try:
        sharing_agent.admin.create_namespace({"metadata": {"name": "team-a"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    test_agent_patches_its_node_labels(sharing_agent)  # waits for RBAC to propagate
    deadline = time.monotonic() + PROPAGATION_S
    while True:  # the sharing rules are their own ClusterRole rules: let them propagate too
        status = _status(lambda: call(sharing_agent))
        if status != 403 or expected == 403 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if expected == 201:
        assert status in (200, 201), status
    else:
        assert status == expected


def test_default_agent_cannot_read_pods(agent):
    test_agent_patches_its_node_labels(agent)
    assert _status(lambda: agent.core.read_namespaced_pod("absent", "default")) == 403
