"""The chart's ValidatingAdmissionPolicies in force on a real kube-apiserver (issue 37).

Needs a dev cluster of Kubernetes >= 1.30 (``OMATICAYA_KUBERNETES_VERSION=v1.37.2``); on an older
server (the default v1.20.2 has no ValidatingAdmissionPolicy and no node-name claim) the module is
skipped. The logic of the policies' CEL is also evaluated without a server, in
tests/charts/test_chart_admission.py and tests/project/test_kube_versions_admission.py.

The chart's ServiceAccount, ClusterRole(Binding), Role(Binding)s and both policies with their
bindings are rendered by the real helm at the server's version (``--kube-version``, default values:
``validatingAdmissionPolicy.enabled: auto``) and applied with the cluster's own kubectl. Then:

- the agent's Pod is created with ``spec.nodeName`` set to a Node (no kubelet runs: the Pod just
  exists) and a TokenRequest bound to that Pod gives the agent's token; the server adds the
  ``authentication.kubernetes.io/node-name`` claim (SelfSubjectReview shows it);
- with that token alone, the agent's own ``NodeClient`` (JSON merge patch) and ``LeaseClient``
  may write its Node's ``<prefix>/`` labels and annotations and its Node's Lease, and are refused
  (HTTP 403, reason Forbidden, the policy's message) a write of another Node's ``<prefix>/`` keys
  or Lease, and any key outside the prefix (or the spec) of its own Node;
- a token of the same ServiceAccount not bound to a Pod (no claim) is refused even its own
  Node's keys, as ``requireNodeClaim: true`` (the default) says;
- on a server that serves DRA (>= 1.34: the chart is rendered with ``dra.enabled``, which adds
  the ResourceSlice rights and the third policy), the agent's ``ResourceSliceClient`` may apply
  (server-side apply: CREATE, then UPDATE) and delete its Node's ResourceSlice of the driver
  ``gpu.omaticaya.io``, and is refused another Node's slice, another driver's slice (even of its
  own Node) and, without the claim, its own; the uninstall hook's ServiceAccount (a user the
  policy does not match) still deletes every slice of the driver with the hook Job's command
  (``omaticaya delete-resourceslices``).

Policies reach the admission plugin through an informer: the tests wait until a dry-run request
that must be refused is refused (nothing is written while they are not yet in force).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from omaticaya_py.core.publish.dra import DRIVER, slice_body, slice_name
from omaticaya_py.kube import ApiSession, KubeError, LeaseClient, NodeClient
from omaticaya_py.kube.heartbeat_lease import lease_name
from omaticaya_py.kube.resourceslice import ResourceSliceClient
from tests.chart import CHART, chart_values, run_helm
from tests.conftest import ensure_namespace
from tests.helpers import agent_pod_doc, token_kubeconfig
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

NAMESPACE = "omaticaya-admission-test"
RELEASE = "omaticaya-admission"  # fullname: the release name (it contains the chart name)
SERVICE_ACCOUNT = RELEASE
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
NODE_POLICY = f"{RELEASE}-node-writes"
LEASE_POLICY = f"{RELEASE}-lease-writes"
SLICE_POLICY = f"{RELEASE}-resourceslice-writes"
#: the first release that serves resource.k8s.io/v1 (the chart's dra.enabled renders from it)
DRA_MINOR = 34
FOREIGN_DRIVER = "gpu.example.com"
CLAIM = "authentication.kubernetes.io/node-name"
P = "omaticaya.io/"
TEMPLATES = (
    "templates/serviceaccount.yaml",
    "templates/clusterrole.yaml",
    "templates/clusterrolebinding.yaml",
    "templates/role.yaml",
    "templates/rolebinding.yaml",
    "templates/validatingadmissionpolicy.yaml",
)
#: the foreign keys each Node starts with (a merge patch must leave them alone)
FOREIGN_LABELS = {"example.com/keep": "yes"}
FOREIGN_ANNOTATIONS = {"example.com/note": "kept"}
#: RBAC and policies reach the server's authorizer and admission through informers
IN_FORCE_S = 60.0


def server_version(admin_client: Any) -> tuple[str, int]:
    """The server's ``gitVersion`` and minor version, from /version."""
    from kubernetes import client

    info = client.VersionApi(admin_client).get_code()
    return info.git_version, int(str(info.minor).rstrip("+"))


def render_chart(
    helm: dict[str, Any], kube_version: str, dra: bool = False, templates: tuple[str, ...] = TEMPLATES
) -> list[dict]:
    """The chart's agent RBAC and admission policies as ``helm template`` renders them for a
    server of ``kube_version`` (default values; ``dra``: with ``dra.enabled=true``)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", kube_version]  # fmt: skip
    if dra:
        args += ["--set", "dra.enabled=true"]
    for t in templates:
        args += ["--show-only", t]
    return [d for d in yaml.safe_load_all(run_helm(helm, *args).stdout) if d]


def kubectl(dev_cluster: Any, *args: str) -> str:
    """The dev cluster's own kubectl (the server's release) as admin."""
    from devtools.devcluster.cluster import bin_dir

    proc = subprocess.run(
        [str(bin_dir() / "kubectl"), *args],
        env=dev_cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@dataclass
class Setup:
    """What the module's tests share: the Nodes, the admin API and the agent's tokens."""

    node: str  # the Node the agent's Pod is on
    other: str  # another Node
    admin: Any  # CoreV1Api as cluster admin
    leases: Any  # CoordinationV1Api as cluster admin
    bound: Path  # kubeconfig with the Pod-bound token only
    unbound: Path  # kubeconfig with a token of the same ServiceAccount, bound to nothing
    token_api: Callable[[Path], Any]  # kubeconfig -> kubernetes ApiClient with that token only
    dra: bool  # the server serves resource.k8s.io/v1: the chart is rendered with dra.enabled
    version: str  # the server's release, as helm --kube-version takes it


def _token(admin: Any, bound_to: dict | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 900}
    if bound_to is not None:
        spec["boundObjectRef"] = bound_to
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    token = admin.create_namespaced_service_account_token(SERVICE_ACCOUNT, NAMESPACE, body)
    return str(token.status.token)


def _refused_by(policy: str, call: Callable[[], Any]) -> str | None:
    """The message when ``call`` is refused by ``policy`` (any other outcome: None)."""
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        if exc.status == 403 and f"ValidatingAdmissionPolicy '{policy}'" in (exc.body or ""):
            return str(exc.body)
    return None


@pytest.fixture(scope="module")
def setup(dev_cluster, admin_client, helm, tmp_path_factory) -> Iterator[Setup]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    version, minor = server_version(admin_client)
    if minor < 30:
        pytest.skip(
            f"kube-apiserver {version}: ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1)"
            " and the node-name claim need >= 1.30 (OMATICAYA_KUBERNETES_VERSION=v1.37.2)"
        )
    dra = minor >= DRA_MINOR
    docs = render_chart(helm, version.split("+")[0], dra=dra)
    kinds = sorted(d["kind"] for d in docs)
    policies = 3 if dra else 2
    assert kinds.count("ValidatingAdmissionPolicy") == policies, kinds
    assert kinds.count("ValidatingAdmissionPolicyBinding") == policies, kinds
    assert chart_values()["validatingAdmissionPolicy"]["requireNodeClaim"] is True

    admin = client.CoreV1Api(admin_client)
    leases = client.CoordinationV1Api(admin_client)
    tag = os.getpid()
    node, other = f"adm-gpu-{tag}-own", f"adm-gpu-{tag}-other"
    pod_name = f"omaticaya-admission-agent-{tag}"
    tmp = tmp_path_factory.mktemp("admission")
    manifest = tmp / "chart.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    ensure_namespace(admin, NAMESPACE)
    kubectl(dev_cluster, "apply", "-f", str(manifest))
    clients: list[Any] = []
    try:
        for name in (node, other):
            admin.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": dict(FOREIGN_LABELS),
                        "annotations": dict(FOREIGN_ANNOTATIONS),
                    },
                }
            )
        pod = admin.create_namespaced_pod(
            NAMESPACE, agent_pod_doc(pod_name, node, SERVICE_ACCOUNT)
        )
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod.metadata.uid}
        bound = token_kubeconfig(dev_cluster, _token(admin, ref), tmp / "bound-kubeconfig")
        unbound = token_kubeconfig(dev_cluster, _token(admin, None), tmp / "unbound-kubeconfig")

        def token_api(kubeconfig: Path) -> Any:
            from kubernetes import config

            cfg = client.Configuration()
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
            assert not cfg.cert_file and not cfg.key_file  # nothing but the token
            api = client.ApiClient(cfg)
            clients.append(api)
            return api

        # In force: a dry run (nothing stored) of another Node's keys, one under the prefix and
        # one not (each breaks a rule of its own), and of another Node's Lease, refused by the
        # policies. Before that it is refused by RBAC (binding not seen yet) or allowed.
        agent = token_api(bound)
        patch = {"metadata": {"labels": {P + "gpu.count": "1", "example.com/probe": "x"}}}
        wait_for(
            "the node-writes policy to refuse the agent another Node",
            lambda: _refused_by(
                NODE_POLICY,
                lambda: client.CoreV1Api(agent).patch_node(
                    other, patch, dry_run="All", _content_type="application/merge-patch+json"
                ),
            ),
            timeout_s=IN_FORCE_S,
            every_s=0.2,
        )
        claimless = token_api(unbound)

        def lease_refused(api: Any, node_name: str) -> str | None:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": lease_name(node_name)}}  # fmt: skip
            return _refused_by(
                LEASE_POLICY,
                lambda: client.CoordinationV1Api(api).create_namespaced_lease(
                    NAMESPACE, lease, dry_run="All"
                ),
            )

        wait_for(
            "the lease-writes policy to refuse another Node's Lease, or a token without a claim",
            lambda: lease_refused(agent, other) or lease_refused(claimless, node),
            timeout_s=IN_FORCE_S,
            every_s=0.2,
        )
        if dra:
            wait_for(
                "the resourceslice-writes policy to refuse another Node's ResourceSlice",
                lambda: _refused_by(
                    SLICE_POLICY,
                    lambda: client.ResourceV1Api(agent).create_resource_slice(
                        slice_body(other, None, []), dry_run="All"
                    ),
                ),
                timeout_s=IN_FORCE_S,
                every_s=0.2,
            )
        yield Setup(
            node, other, admin, leases, bound, unbound, token_api, dra, version.split("+")[0]
        )
    finally:
        for api in clients:
            api.close()
        if dra:
            slices = client.ResourceV1Api(admin_client)
            for name in (slice_name(node), slice_name(other),
                         f"{node}-{FOREIGN_DRIVER}", f"{other}-{FOREIGN_DRIVER}"):  # fmt: skip
                try:
                    slices.delete_resource_slice(name)
                except ApiException:
                    pass
        for name in (lease_name(node), lease_name(other)):
            try:
                leases.delete_namespaced_lease(name, NAMESPACE)
            except ApiException:
                pass
        try:
            admin.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)
        except ApiException:
            pass
        for name in (node, other):
            try:
                admin.delete_node(name)
            except ApiException:
                pass
        kubectl(dev_cluster, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifest))


@contextmanager
def agent_node_client(kubeconfig: Path, node: str) -> Iterator[NodeClient]:
    """The agent's own client of ``node``, with nothing but the token in ``kubeconfig``."""
    agent = NodeClient(node, kubeconfig=str(kubeconfig), attempts=1, sleep=lambda s: None)
    try:
        yield agent
    finally:
        agent.close()


def metadata(setup: Setup, name: str) -> tuple[dict[str, str], dict[str, str], Any]:
    """(labels, annotations, spec) of a Node, read as admin."""
    n = setup.admin.read_node(name)
    return dict(n.metadata.labels or {}), dict(n.metadata.annotations or {}), n.spec.to_dict()


def refused(setup: Setup, kubeconfig: Path, node: str, patch: dict) -> str:
    """Send ``patch`` to ``node`` as the agent; assert the node-writes policy refused it and the
    Node is unchanged; return the server's message."""
    before = metadata(setup, node)
    with agent_node_client(kubeconfig, node) as agent, pytest.raises(KubeError) as caught:
        agent.patch_node(patch)
    err = caught.value
    assert err.status == 403, err
    assert f"ValidatingAdmissionPolicy '{NODE_POLICY}'" in str(err), err
    assert metadata(setup, node) == before
    return str(err)


# ------------------------------------------------------------------------------ the token ----


def test_the_pod_bound_token_carries_its_node(setup):
    """SelfSubjectReview: who the server takes each token for."""
    from kubernetes import client

    def user(kubeconfig: Path) -> Any:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        api = client.AuthenticationV1Api(setup.token_api(kubeconfig))
        return api.create_self_subject_review(review).status.user_info

    bound, unbound = user(setup.bound), user(setup.unbound)
    assert bound.username == unbound.username == AGENT_USER
    assert (bound.extra or {}).get(CLAIM) == [setup.node]
    assert CLAIM not in (unbound.extra or {})


# -------------------------------------------------------------------------- node-writes ----


def test_agent_writes_its_own_nodes_prefix_keys(setup):
    """Add, change and remove ``<prefix>/`` labels and annotations of its own Node, by merge
    patch, as the agent does; foreign keys stay."""
    with agent_node_client(setup.bound, setup.node) as agent:
        telemetry = '{"read_at":"2026-01-01T00:00:00Z"}'
        agent.patch_node(
            {
                "metadata": {
                    "labels": {P + "gpu.count": "1", P + "gpu.memory.free-mib": "80896"},
                    "annotations": {P + "telemetry": telemetry},
                }
            }
        )
        labels, annotations, _ = metadata(setup, setup.node)
        assert labels == FOREIGN_LABELS | {P + "gpu.count": "1", P + "gpu.memory.free-mib": "80896"}
        assert annotations == FOREIGN_ANNOTATIONS | {P + "telemetry": telemetry}

        agent.patch_node({"metadata": {"labels": {P + "gpu.memory.free-mib": "49152"}}})
        assert metadata(setup, setup.node)[0][P + "gpu.memory.free-mib"] == "49152"

        agent.patch_node(
            {"metadata": {"labels": {P + "gpu.memory.free-mib": None, P + "gpu.count": None},
                          "annotations": {P + "telemetry": None}}}
        )  # fmt: skip
        labels, annotations, _ = metadata(setup, setup.node)
        assert labels == FOREIGN_LABELS and annotations == FOREIGN_ANNOTATIONS


@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_another_nodes_prefix_keys_are_refused(setup, where):
    message = refused(
        setup, setup.bound, setup.other, {"metadata": {where: {P + "gpu.count": "1"}}}
    )
    assert f"the omaticaya agent on node {setup.node} may not change node {setup.other}" in message


OWN_NODE_REFUSED = {
    "foreign label added": (
        {"labels": {"example.com/new": "x"}},
        "Node labels under omaticaya.io/",
    ),
    "foreign label changed": ({"labels": {"example.com/keep": "no"}}, "Node labels under"),
    "foreign label removed": ({"labels": {"example.com/keep": None}}, "Node labels under"),
    "look-alike prefix": ({"labels": {"omaticaya.io-x.com/gpu.count": "1"}}, "Node labels under"),
    "foreign annotation added": ({"annotations": {"example.com/a": "b"}}, "Node annotations under"),
    "foreign annotation removed": (
        {"annotations": {"example.com/note": None}},
        "Node annotations under",
    ),
    "own key with a foreign one": (
        {"labels": {P + "gpu.count": "1", "example.com/new": "x"}},
        "Node labels under",
    ),
}


@pytest.mark.parametrize("case", list(OWN_NODE_REFUSED))
def test_keys_outside_the_prefix_are_refused_on_its_own_node(setup, case):
    meta, says = OWN_NODE_REFUSED[case]
    message = refused(setup, setup.bound, setup.node, {"metadata": meta})
    assert f"the omaticaya agent may only add, change or remove {says}" in message


def test_its_own_nodes_spec_is_refused(setup):
    message = refused(setup, setup.bound, setup.node, {"spec": {"unschedulable": True}})
    assert "the omaticaya agent may not change the Node spec" in message


def test_a_token_not_bound_to_a_pod_is_refused(setup):
    """requireNodeClaim: true (the chart's default): no claim, no write, even of its own keys."""
    message = refused(
        setup, setup.unbound, setup.node, {"metadata": {"labels": {P + "gpu.count": "1"}}}
    )
    assert f"the omaticaya agent token carries no {CLAIM} claim" in message


def test_other_users_are_not_matched(setup):
    """The policies match the agent's ServiceAccount only: the admin may write any key."""
    patch = {"metadata": {"labels": {P + "gpu.count": "2", "example.com/admin": "yes"}}}
    setup.admin.patch_node(setup.other, patch, _content_type="application/merge-patch+json")
    setup.admin.patch_node(
        setup.other,
        {"metadata": {"labels": {P + "gpu.count": None, "example.com/admin": None}}},
        _content_type="application/merge-patch+json",
    )
    assert metadata(setup, setup.other)[0] == FOREIGN_LABELS


# ------------------------------------------------------------------------- lease-writes ----


@contextmanager
def lease_client(kubeconfig: Path, node: str) -> Iterator[LeaseClient]:
    """The agent's own client of ``node``'s Lease, with nothing but the token in ``kubeconfig``."""
    session = ApiSession(kubeconfig=str(kubeconfig), attempts=1, sleep=lambda s: None)
    try:
        yield LeaseClient(
            session, namespace=NAMESPACE, name=lease_name(node), holder="test", duration_s=40,
            node=node,
        )  # fmt: skip
    finally:
        session.close()


def test_agent_writes_its_own_nodes_lease(setup):
    """Create, renew (update) and delete the Lease ``omaticaya-node-<its node>``."""
    with lease_client(setup.bound, setup.node) as own:
        created = own.renew()
        assert created["metadata"]["name"] == lease_name(setup.node)
        assert created["metadata"]["ownerReferences"][0]["name"] == setup.node
        own.renew()  # a PUT of the stored object
        assert own.renewals == 2
        assert own.delete() is True


def _lease_refused(call: Callable[[], Any]) -> str:
    with pytest.raises(KubeError) as caught:
        call()
    err = caught.value
    assert err.status == 403, err
    assert f"ValidatingAdmissionPolicy '{LEASE_POLICY}'" in str(err), err
    return str(err)


def test_another_nodes_lease_is_refused(setup):
    """Neither created nor, once the admin made it, updated or deleted."""
    want = f"may write only the Lease {lease_name(setup.node)}, not {lease_name(setup.other)}"
    with lease_client(setup.bound, setup.other) as theirs:
        assert want in _lease_refused(theirs.renew)  # the create
        setup.leases.create_namespaced_lease(
            NAMESPACE,
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": lease_name(setup.other)}, "spec": {"holderIdentity": "admin"}},
        )  # fmt: skip
        try:
            assert want in _lease_refused(theirs.renew)  # the update
            assert want in _lease_refused(theirs.delete)
            held = setup.leases.read_namespaced_lease(lease_name(setup.other), NAMESPACE)
            assert held.spec.holder_identity == "admin"
        finally:
            setup.leases.delete_namespaced_lease(lease_name(setup.other), NAMESPACE)


def test_a_token_not_bound_to_a_pod_may_not_write_a_lease(setup):
    with lease_client(setup.unbound, setup.node) as own:
        message = _lease_refused(own.renew)
    assert f"carries no {CLAIM} claim" in message


# ------------------------------------------------------------------ resourceslice-writes ----


@pytest.fixture
def slices(setup) -> Any:
    """ResourceV1Api as cluster admin; the test is skipped where the server serves no DRA."""
    from kubernetes import client

    if not setup.dra:
        pytest.skip(f"the server serves no resource.k8s.io/v1 (DRA: Kubernetes >= 1.{DRA_MINOR})")
    admin_client = setup.admin.api_client
    return client.ResourceV1Api(admin_client)


@contextmanager
def slice_client(kubeconfig: Path, node: str) -> Iterator[ResourceSliceClient]:
    """The agent's own client of ``node``'s ResourceSlice (built from an ``ApiSession`` as the
    agent builds it), with nothing but the token in ``kubeconfig``."""
    session = ApiSession(kubeconfig=str(kubeconfig), attempts=1, sleep=lambda s: None)
    try:
        yield ResourceSliceClient(session, node)
    finally:
        session.close()


def own_slice(setup: Setup, node: str, generation: int = 1, driver: str = DRIVER) -> dict:
    """``node``'s ResourceSlice as the agent renders it (``core.publish.dra.slice_body``: owned by the
    Node), of ``driver``."""
    uid = setup.admin.read_node(node).metadata.uid
    body = slice_body(node, uid, [{"name": "gpu-0"}], generation)
    body["spec"]["driver"] = driver
    return body


def stored_slice(slices: Any, name: str) -> dict | None:
    """The slice as the server has it (JSON), None when there is none."""
    import json

    from kubernetes.client.exceptions import ApiException

    try:
        return json.loads(slices.read_resource_slice(name, _preload_content=False).data)
    except ApiException as exc:
        assert exc.status == 404, exc
        return None


def _slice_refused(call: Callable[[], Any]) -> str:
    with pytest.raises(KubeError) as caught:
        call()
    err = caught.value
    assert err.status == 403, err
    assert f"ValidatingAdmissionPolicy '{SLICE_POLICY}'" in str(err), err
    assert "403 Forbidden" in str(err), err
    return str(err)


def test_agent_applies_and_deletes_its_own_nodes_slice(setup, slices):
    """Server-side apply (a PATCH: CREATE, then UPDATE), read back, DELETE, as the agent does."""
    with slice_client(setup.bound, setup.node) as own:
        assert own.name == slice_name(setup.node) == f"{setup.node}-{DRIVER}"
        created = own.apply(own_slice(setup, setup.node))
        assert created["spec"]["driver"] == DRIVER
        assert created["spec"]["nodeName"] == created["spec"]["pool"]["name"] == setup.node
        updated = own.apply(own_slice(setup, setup.node, generation=2))  # an UPDATE
        assert updated["spec"]["pool"]["generation"] == 2
        assert (own.get() or {})["spec"]["pool"]["generation"] == 2
        assert own.delete() is True
        assert own.delete() is False
    assert stored_slice(slices, slice_name(setup.node)) is None


def test_another_nodes_slice_is_refused(setup, slices):
    """Neither created nor, once the admin made it, updated or deleted."""
    want = (
        f"the omaticaya agent on node {setup.node} may write only the ResourceSlice "
        f"{slice_name(setup.node)} with spec.nodeName and spec.pool.name {setup.node}, "
        f"not {slice_name(setup.other)} (spec.nodeName {setup.other}, spec.pool.name {setup.other})"
    )
    with slice_client(setup.bound, setup.other) as theirs:
        assert want in _slice_refused(lambda: theirs.apply(own_slice(setup, setup.other)))
        assert stored_slice(slices, slice_name(setup.other)) is None
        slices.create_resource_slice(own_slice(setup, setup.other))
        try:
            before = stored_slice(slices, slice_name(setup.other))
            body = own_slice(setup, setup.other, generation=7)
            assert want in _slice_refused(lambda: theirs.apply(body))  # an UPDATE
            assert want in _slice_refused(theirs.delete)
            assert stored_slice(slices, slice_name(setup.other)) == before
        finally:
            slices.delete_resource_slice(slice_name(setup.other))


def test_another_drivers_slice_is_refused(setup, slices):
    """Another driver's slice, even of its own Node: not created under the agent's name, and
    the other driver's own slice neither changed nor deleted."""
    want = f"the omaticaya agent may write only ResourceSlices of driver {DRIVER}, not ResourceSlice"
    with slice_client(setup.bound, setup.node) as own:
        body = own_slice(setup, setup.node, driver=FOREIGN_DRIVER)
        message = _slice_refused(lambda: own.apply(body))
        assert f"{want} {slice_name(setup.node)} of driver {FOREIGN_DRIVER}" in message
        assert stored_slice(slices, slice_name(setup.node)) is None

    theirs_name = f"{setup.node}-{FOREIGN_DRIVER}"
    foreign = own_slice(setup, setup.node, driver=FOREIGN_DRIVER)
    foreign["metadata"]["name"] = theirs_name
    slices.create_resource_slice(foreign)
    try:
        before = stored_slice(slices, theirs_name)
        with slice_client(setup.bound, setup.node) as agent:
            agent.name = theirs_name  # the same client, aimed at the other driver's slice
            changed = own_slice(setup, setup.node, generation=9, driver=FOREIGN_DRIVER)
            changed["metadata"]["name"] = theirs_name
            assert f"{want} {theirs_name} of driver {FOREIGN_DRIVER}" in _slice_refused(
                lambda: agent.apply(changed)
            )
            assert f"{want} {theirs_name}" in _slice_refused(agent.delete)
        assert stored_slice(slices, theirs_name) == before
    finally:
        slices.delete_resource_slice(theirs_name)


def test_a_token_not_bound_to_a_pod_may_not_write_a_slice(setup, slices):
    """requireNodeClaim: true (the default): no claim, not even its own Node's slice."""
    want = f"the omaticaya agent token carries no {CLAIM} claim"
    with slice_client(setup.unbound, setup.node) as own:
        assert want in _slice_refused(lambda: own.apply(own_slice(setup, setup.node)))
        assert stored_slice(slices, slice_name(setup.node)) is None
        slices.create_resource_slice(own_slice(setup, setup.node))
        try:
            assert want in _slice_refused(own.delete)
            assert stored_slice(slices, slice_name(setup.node)) is not None
        finally:
            slices.delete_resource_slice(slice_name(setup.node))


def test_the_uninstall_hook_still_deletes_every_slice(setup, slices, dev_cluster, helm, tmp_path):
    """The uninstall hook's Job runs ``omaticaya delete-resourceslices --driver <driver>`` (its
    container's args, run here as the same command) as its own ServiceAccount (list and
    deletecollection resourceslices): the policy does not match it, so every slice of the driver
    goes (a DeleteCollection is admitted slice by slice, as DELETEs)."""
    import sys

    from kubernetes import client

    hook = [
        d
        for d in render_chart(helm, setup.version, dra=True,
                              templates=("templates/uninstall-hook.yaml",))  # fmt: skip
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    assert sorted(d["kind"] for d in hook) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    (account,) = [d["metadata"]["name"] for d in hook if d["kind"] == "ServiceAccount"]
    manifest = tmp_path / "hook.yaml"
    manifest.write_text(yaml.safe_dump_all(hook))
    kubectl(dev_cluster, "apply", "-f", str(manifest))
    try:
        for node in (setup.node, setup.other):
            slices.create_resource_slice(own_slice(setup, node))
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600}}  # fmt: skip
        token = setup.admin.create_namespaced_service_account_token(account, NAMESPACE, body)
        kubeconfig = token_kubeconfig(dev_cluster, token.status.token, tmp_path / "hook-kubeconfig")
        auth = client.AuthorizationV1Api(setup.admin.api_client)
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": f"system:serviceaccount:{NAMESPACE}:{account}",
                           "groups": ["system:serviceaccounts"],
                           "resourceAttributes": {"verb": "deletecollection",
                                                  "group": "resource.k8s.io",
                                                  "resource": "resourceslices"}}}  # fmt: skip
        wait_for(
            "the hook's ClusterRoleBinding to take effect",
            lambda: auth.create_subject_access_review(review).status.allowed,
            timeout_s=IN_FORCE_S,
            every_s=0.2,
        )
        (job,) = [
            d
            for d in render_chart(helm, setup.version, dra=True,
                                  templates=("templates/uninstall-hook.yaml",))  # fmt: skip
            if d["kind"] == "Job" and d["metadata"]["name"].endswith("-uninstall-slices")
        ]
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert job["spec"]["template"]["spec"]["serviceAccountName"] == account
        env = {k: v for k, v in os.environ.items()
               if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "omaticaya_py", *container["args"],
             "--kubeconfig", str(kubeconfig)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert slice_name(setup.node) in proc.stdout and slice_name(setup.other) in proc.stdout
        for node in (setup.node, setup.other):
            assert stored_slice(slices, slice_name(node)) is None
    finally:
        for node in (setup.node, setup.other):
            try:
                slices.delete_resource_slice(slice_name(node))
            except Exception:  # noqa: BLE001
                pass
        kubectl(dev_cluster, "delete", "--ignore-not-found", "-f", str(manifest))
