"""The second scheduler's two identities, proved against the real kube-apiserver (issue 23, #9).

The chart (``scheduler.enabled``, rendered for the release under test) gives the kube-scheduler
container the pod's ServiceAccount and the extender sidecar a ServiceAccount of its own. Its RBAC
is applied as admin; a TokenRequest token of each ServiceAccount (the dev cluster runs no token
controller to fill the extender's Secret: tests/charts/test_chart_least_privilege.py checks the Secret
and the mounts) then does what each must and must not:

- the extender's token runs the extender's own Node, Pod and Lease caches (omaticaya_py.kube, the
  list+watch the extender serves from) to a sync, and may not delete pods, bind them, patch
  Nodes, read Secrets or write Leases, all of which the scheduler's token may;
- the scheduler's token reaches its leader-election Lease in kube-system by name, and neither
  lists nor updates the agents' Leases in the release namespace.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devcluster.cluster import K8S_VERSION
from tests.charts.chart_rbac_support import PROPAGATION_S, _apply, _core_event, _exists_ok, _status
from tests.helpers import token_kubeconfig
from tests.tools import ToolUnavailable, helm_path

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "omaticaya"
NAMESPACE = "omaticaya-sched-test"
RELEASE = "omaticaya-sr"
SCHEDULER, EXTENDER = f"{RELEASE}-scheduler", f"{RELEASE}-extender"
ALLOWED = 0
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def render() -> list[dict]:
    try:
        helm = helm_path()
    except ToolUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    proc = subprocess.run(
        [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--kube-version", K8S_VERSION, "--show-only", "templates/scheduler.yaml",
         "--set", "scheduler.enabled=true"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] in RBAC_KINDS]


@pytest.fixture(scope="module")
def tokens(dev_cluster, admin_client, tmp_path_factory) -> Iterator[dict[str, Any]]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    docs = render()
    admin = client.CoreV1Api(admin_client)
    rbac = client.RbacAuthorizationV1Api(admin_client)
    _exists_ok(lambda: admin.create_namespace({"metadata": {"name": NAMESPACE}}))
    _apply(admin_client, docs)
    coord = client.CoordinationV1Api(admin_client)
    agent_lease = {"metadata": {"name": "omaticaya-node-gpu-1"}, "spec": {"holderIdentity": "a"}}
    _exists_ok(lambda: coord.create_namespaced_lease(NAMESPACE, agent_lease))
    _exists_ok(lambda: admin.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "s"}}))
    out: dict[str, Any] = {"admin": admin_client, "apis": {}, "kubeconfig": {}}
    tmp = tmp_path_factory.mktemp("sched-tokens")
    for sa in (SCHEDULER, EXTENDER):
        token = admin.create_namespaced_service_account_token(
            sa, NAMESPACE, {"spec": {"expirationSeconds": 600}}
        ).status.token
        cfg = client.Configuration(host=dev_cluster.server, ssl_ca_cert=str(dev_cluster.ca_file))
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        out["apis"][sa] = client.ApiClient(cfg)
        out["kubeconfig"][sa] = str(token_kubeconfig(dev_cluster, token, tmp / f"{sa}.kubeconfig"))
    # RBAC reaches the authorizer through an informer: wait until the extender may list Nodes
    core = client.CoreV1Api(out["apis"][EXTENDER])
    deadline = time.monotonic() + PROPAGATION_S
    while _status(lambda: core.list_node(limit=1)) == 403 and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        yield out
    finally:
        for api in out["apis"].values():
            api.close()
        for doc in docs:
            meta, kind = doc["metadata"], doc["kind"]
            try:
                if kind == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(meta["name"])
                elif kind == "ClusterRole":
                    rbac.delete_cluster_role(meta["name"])
                elif kind == "RoleBinding":
                    rbac.delete_namespaced_role_binding(meta["name"], meta["namespace"])
                elif kind == "Role":
                    rbac.delete_namespaced_role(meta["name"], meta["namespace"])
            except ApiException:
                pass


def test_extender_token_runs_the_extenders_caches(tokens):
    """The extender's real list+watch caches sync with its own token alone."""
    from omaticaya_py.kube import LeaseCache, NodeCache, PodCache

    kubeconfig = tokens["kubeconfig"][EXTENDER]
    caches = [
        NodeCache(lambda meta: meta, kubeconfig=kubeconfig),
        PodCache(lambda pod, prev: pod, field_selector="spec.nodeName!=", kubeconfig=kubeconfig),
        LeaseCache(lambda lease: lease, NAMESPACE, kubeconfig=kubeconfig),
    ]
    try:
        for cache in caches:
            cache.start()
        for cache in caches:
            assert cache.wait_synced(timeout_s=30), (type(cache).__name__, cache.health())
        assert caches[2].get("omaticaya-node-gpu-1") is not None
    finally:
        for cache in caches:
            cache.stop()


def _cases() -> list[tuple[str, str, Any, int]]:
    from kubernetes import client

    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n"}}
    lease = {"metadata": {"name": "omaticaya-node-gpu-1"}, "spec": {"holderIdentity": "forged"}}
    own = {"metadata": {"name": SCHEDULER}, "spec": {"holderIdentity": "s"}}
    core, coord = client.CoreV1Api, client.CoordinationV1Api
    # (id, service account, call(api_client), 403 or ALLOWED: anything but 403, e.g. 404 for
    # an object that is not there)
    return [
        ("ext-delete-pod", EXTENDER, lambda a: core(a).delete_namespaced_pod("p", NAMESPACE), 403),
        ("ext-bind-pod", EXTENDER, lambda a: core(a).create_namespaced_binding(NAMESPACE, binding), 403),
        ("ext-patch-node", EXTENDER, lambda a: core(a).patch_node("n", {"metadata": {"labels": {"a": "b"}}}), 403),
        ("ext-read-secret", EXTENDER, lambda a: core(a).read_namespaced_secret("s", NAMESPACE), 403),
        ("ext-update-lease", EXTENDER, lambda a: coord(a).replace_namespaced_lease("omaticaya-node-gpu-1", NAMESPACE, lease), 403),
        ("ext-create-lease", EXTENDER, lambda a: coord(a).create_namespaced_lease(NAMESPACE, lease), 403),
        ("ext-create-event", EXTENDER, lambda a: core(a).create_namespaced_event(NAMESPACE, _core_event(NAMESPACE)), 403),
        ("sched-delete-pod", SCHEDULER, lambda a: core(a).delete_namespaced_pod("p", NAMESPACE), ALLOWED),
        ("sched-own-lease-get", SCHEDULER, lambda a: coord(a).read_namespaced_lease(SCHEDULER, "kube-system"), ALLOWED),
        ("sched-own-lease-update", SCHEDULER, lambda a: coord(a).replace_namespaced_lease(SCHEDULER, "kube-system", own), ALLOWED),
        ("sched-other-lease-kube-system", SCHEDULER, lambda a: coord(a).read_namespaced_lease("other", "kube-system"), 403),
        ("sched-agent-lease-update", SCHEDULER, lambda a: coord(a).replace_namespaced_lease("omaticaya-node-gpu-1", NAMESPACE, lease), 403),
        ("sched-agent-leases-list", SCHEDULER, lambda a: coord(a).list_namespaced_lease(NAMESPACE), 403),
    ]  # fmt: skip


CASE_IDS = [c[0] for c in _cases()] if __import__("importlib").util.find_spec("kubernetes") else []


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_scheduler_and_extender_tokens(tokens, case_id):
    (_, sa, call, expected) = next(c for c in _cases() if c[0] == case_id)
    status = _status(lambda: call(tokens["apis"][sa]))
    if expected == ALLOWED:
        assert status != 403
    else:
        assert status == expected
