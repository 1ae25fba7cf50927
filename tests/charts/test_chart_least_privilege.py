"""Least privilege by default (issue 23, item 9), from ``helm template`` and the policies' CEL.

- the admission policies are on by default at every supported version (1.31 and later: every one
  enforces them), and off against a live cluster that does not serve
  ``admissionregistration.k8s.io/v1``'s ValidatingAdmissionPolicy (helm's capabilities from
  discovery);
- the Lease policy binds the agent's Lease writes to its token's node-name claim, by the same
  name ``omaticaya_py.kube.heartbeat_lease.lease_name`` gives; the Node policy keeps spec, taints and
  ownerReferences as they are;
- Events: a Role in ``default`` (where ``NodeClient.create_node_event`` posts them), create only;
- the extender sidecar holds its own read-only token, never the scheduler's;
- the PodResources folder is mounted read-only and never created.

What a real server of the release under test makes of the RBAC: tests/charts/test_chart_rbac.py and
tests/charts/test_chart_rbac_scheduler.py; of the policies: tests/charts/test_admission_cluster.py. The CEL
runtime is ``cel-expr-python`` (tests/chart.py's ``Vap``), not Kubernetes' own.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from omaticaya_py.kube.heartbeat_lease import lease_name
from tests.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    Vap,
    node_doc,
    render,
    run_helm,
    values_args,
)

AGENT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
CLAIM_KEY = "authentication.kubernetes.io/node-name"
VAP_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def docs_with(helm, values: dict | None, *extra: str) -> list[dict]:
    proc = run_helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        *values_args(helm, values), *extra,
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    # the helm test's own RBAC and Pod: tests/charts/test_chart_helm_test.py
    return [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") != "test"]


def kinds(docs: list[dict]) -> set[str]:
    return {d["kind"] for d in docs}


# ------------------------------------------------- on by default at every supported version ----

LIVE = ("--api-versions", "v1/Node")  # a kind-level entry: helm talked to a cluster's discovery
SERVED = ("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")

AUTO_CASES = [
    # (id, kube version, extra helm flags, policies rendered)
    ("1.31-offline", "1.31.0", (), True),
    ("1.33-offline", "1.33.1", (), True),
    ("1.36-vendor-suffix", "v1.36.0-eks-a737599", (), True),
    ("1.37-offline", "1.37.2", (), True),
    ("1.31-live-served", "1.31.0", LIVE + SERVED, True),
    ("1.37-live-served", "1.37.2", LIVE + SERVED, True),
    ("1.31-live-api-off", "1.31.0", LIVE, False),  # the API turned off: no policy to fail on
    ("1.37-live-api-off", "1.37.2", LIVE, False),
]


@pytest.mark.parametrize(
    ("kube", "extra", "on"), [c[1:] for c in AUTO_CASES], ids=[c[0] for c in AUTO_CASES]
)
def test_policies_on_by_default_where_the_cluster_enforces_them(helm, kube, extra, on):
    docs = docs_with(helm, None, "--kube-version", kube, *extra)
    got = kinds(docs) & VAP_KINDS
    assert got == (VAP_KINDS if on else set()), got
    names = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    assert names == ([f"{RELEASE}-lease-writes", f"{RELEASE}-node-writes"] if on else [])


def test_policies_can_be_turned_off_and_forced_on(helm):
    off = docs_with(helm, {"validatingAdmissionPolicy": {"enabled": False}}, "--kube-version", "1.33.0")
    assert not kinds(off) & VAP_KINDS
    forced = docs_with(helm, {"validatingAdmissionPolicy": {"enabled": True}}, "--kube-version", "1.31.0", *LIVE)
    assert VAP_KINDS <= kinds(forced)  # true renders even where discovery does not list it


def test_a_cluster_too_old_for_the_policies_is_refused_by_the_chart(helm):
    """Below 1.30 no server enforces the policies; the chart (kubeVersion >=1.31.0-0) does not
    install there at all, whatever validatingAdmissionPolicy says."""
    for enabled in ("true", "false"):
        proc = run_helm(
            helm, "template", RELEASE, str(CHART), "--kube-version", "1.29.0",
            "--set", f"validatingAdmissionPolicy.enabled={enabled}", check=False,
        )  # fmt: skip
        assert proc.returncode != 0 and "chart requires kubeVersion: >=1.31.0-0" in proc.stderr


@pytest.mark.parametrize("bad", ["yes", "Auto", 1])
def test_enabled_is_auto_or_a_boolean(helm, bad):
    proc = run_helm(
        helm, "template", RELEASE, str(CHART),
        *values_args(helm, {"validatingAdmissionPolicy": {"enabled": bad}}), check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "validatingAdmissionPolicy" in proc.stderr, proc.stderr


def test_notes_say_what_is_not_enforced_when_the_policies_are_off(helm):
    # install --dry-run=client takes helm's own version (a supported one)
    args = ("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    off = {"validatingAdmissionPolicy": {"enabled": False}}
    old = run_helm(helm, *args, *values_args(helm, off)).stdout
    assert "No ValidatingAdmissionPolicy is in force" in old and "any Lease" in old
    assert "validatingAdmissionPolicy.enabled is false" in old
    new = run_helm(helm, *args).stdout
    assert "-node-writes and -lease-writes" in new


# ---------------------------------------------------------------- the Lease policy's CEL ----


def lease_policy(helm, **vap: Any) -> Vap:
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    docs = docs_with(helm, {"validatingAdmissionPolicy": vap} if vap else None, "--kube-version", "1.31.0")
    (doc,) = [
        d for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-lease-writes")
    ]  # fmt: skip
    return Vap(doc)


def lease(name: str, holder: str = "omaticaya-abc12") -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 40},
    }


def claim(node: str) -> dict:
    return {CLAIM_KEY: [node]}


LONG_NODE = "gpu-" + "a" * 240 + ".example.com"  # a valid Node name, 256 characters
OWN = lease_name("gpu-1")
LEASE_CASES = [
    # (id, oldObject, object, extra, denied: None = allowed, else a word of the message)
    ("create-own", None, lease(OWN), claim("gpu-1"), None),
    ("renew-own", lease(OWN), lease(OWN, "omaticaya-new"), claim("gpu-1"), None),
    ("delete-own", lease(OWN), None, claim("gpu-1"), None),
    ("create-other-node", None, lease(lease_name("gpu-2")), claim("gpu-1"), "only the Lease"),
    ("renew-other-node", lease(lease_name("gpu-2")), lease(lease_name("gpu-2"), "x"), claim("gpu-1"), "only the Lease"),
    ("delete-other-node", lease(lease_name("gpu-2")), None, claim("gpu-1"), "only the Lease"),
    ("scheduler-leader-lease", lease("omaticaya-scheduler"), lease("omaticaya-scheduler", "me"), claim("gpu-1"), "only the Lease"),
    ("prefix-of-another-node", None, lease(lease_name("gpu-10")), claim("gpu-1"), "only the Lease"),
    ("own-name-plus-suffix", None, lease(OWN + "x"), claim("gpu-1"), "only the Lease"),
    ("long-node-name-cut", None, lease(lease_name(LONG_NODE)), claim(LONG_NODE), None),
    ("long-node-short-cut", None, lease(lease_name(LONG_NODE)[:150]), claim(LONG_NODE), "only the Lease"),
    ("no-extra", None, lease(OWN), None, "carries no"),
    ("claim-empty", None, lease(OWN), {CLAIM_KEY: []}, "carries no"),
]  # fmt: skip


@pytest.fixture(scope="module")
def lease_vap(helm) -> Vap:
    return lease_policy(helm)


@pytest.mark.parametrize(
    ("old", "new", "extra", "denied"), [c[1:] for c in LEASE_CASES], ids=[c[0] for c in LEASE_CASES]
)
def test_lease_policy(lease_vap, old, new, extra, denied):
    got = lease_vap.denials(old, new, AGENT, extra)
    if denied is None:
        assert got == []
    else:
        assert got is not None and len(got) == 1 and denied in got[0], got


def test_lease_policy_names_are_the_agents(lease_vap):
    """For any valid Node name the policy allows exactly the name the agent's code uses."""
    for node in ("gpu-1", "node.example.com", "a", "ip-10-0-0-1.ec2.internal", LONG_NODE, "x" * 253):
        assert len(lease_name(node)) <= 253
        assert lease_vap.denials(None, lease(lease_name(node)), AGENT, claim(node)) == [], node


def test_lease_policy_ignores_other_users(lease_vap):
    sched = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-scheduler"
    assert lease_vap.denials(None, lease("omaticaya-scheduler"), sched, None) is None


def test_lease_policy_without_claim_required_keeps_the_prefix(helm):
    vap = lease_policy(helm, requireNodeClaim=False)
    assert vap.denials(None, lease(lease_name("gpu-7")), AGENT, None) == []
    got = vap.denials(lease("omaticaya-scheduler"), lease("omaticaya-scheduler", "me"), AGENT, None)
    assert got and "may not write Lease omaticaya-scheduler" in got[0]
    # with a claim, the claim still decides
    assert vap.denials(None, lease(lease_name("gpu-7")), AGENT, claim("gpu-1")) != []


def test_lease_policy_shape(helm):
    docs = docs_with(helm, None, "--kube-version", "1.31.0")
    (policy,) = [d for d in docs if d["metadata"]["name"] == f"{RELEASE}-lease-writes" and d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["metadata"]["name"] == f"{RELEASE}-lease-writes" and d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": f"{RELEASE}-lease-writes", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
         "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["leases"]}
    ]  # fmt: skip
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{AGENT}'"


# ------------------------------------------------- the Node policy: what one token can break ----

NODE_CLAIM = {CLAIM_KEY: ["gpu-1"]}
OWNER = [{"apiVersion": "v1", "kind": "Node", "name": "gone", "uid": "0000"}]
TAINT = [{"key": "x", "effect": "NoExecute"}]
NODE_CASES = [
    # (id, old, new, denied)
    ("taint-noexecute", node_doc(), node_doc(spec={"taints": TAINT}), "spec"),
    ("unschedulable", node_doc(), node_doc(spec={"unschedulable": True}), "spec"),
    ("owner-reference-added", node_doc(), {**node_doc(), "metadata": {"name": "gpu-1", "ownerReferences": OWNER}}, "ownerReferences"),
    ("telemetry-of-another-node", node_doc(name="gpu-2"), node_doc(annotations={"omaticaya.io/telemetry": "{}"}, name="gpu-2"), "may not change node gpu-2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "denied"), [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES]
)
def test_node_policy_on_by_default_denies_disruption(helm, old, new, denied):
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    docs = docs_with(helm, None, "--kube-version", "1.31.0")
    (doc,) = [d for d in docs if d["metadata"]["name"] == f"{RELEASE}-node-writes" and d["kind"] == "ValidatingAdmissionPolicy"]
    got = Vap(doc).denials(old, new, AGENT, NODE_CLAIM)
    assert got is not None and len(got) == 1 and denied in got[0], got


# ------------------------------------------------------------------------------- Events ----


def test_events_only_create_in_default(helm):
    for kube in ("1.31.0", "1.37.2"):
        docs = docs_with(helm, None, "--kube-version", kube)
        (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
        assert all("events" not in r["resources"] for r in cluster_role["rules"]), cluster_role
        (events,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-events")]
        (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-events")]
        assert events["metadata"]["namespace"] == binding["metadata"]["namespace"] == "default"
        assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
        assert binding["roleRef"]["name"] == events["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]


@pytest.mark.parametrize("gpus", ["all", "0-3", 2])
def test_sharing_adds_pod_get_and_events_create_only(helm, gpus):
    values = {"devicePlugin": {"enabled": True}, "sharing": {"gpus": gpus}}
    docs = docs_with(helm, values, "--kube-version", "1.31.0")
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]


def test_no_pod_rule_without_sharing(helm):
    docs = docs_with(helm, None, "--kube-version", "1.31.0")
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]


def test_events_go_where_the_role_is():
    """The Role's namespace is where NodeClient posts (its default, which agent/events.py uses)."""
    import inspect

    from omaticaya_py.kube.node_client import NodeClient

    param = inspect.signature(NodeClient.create_node_event).parameters["namespace"]
    assert param.default == "default"


# ----------------------------------------------------------------- the extender's token ----


def scheduler_docs(helm, kube: str = "1.31.0") -> list[dict]:
    return docs_with(helm, {"scheduler": {"enabled": True}}, "--kube-version", kube)


@pytest.mark.parametrize("kube", ["1.31.0", "1.37.2"])
def test_extender_sidecar_does_not_see_the_schedulers_token(helm, kube):
    docs = scheduler_docs(helm, kube)
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    sched_sa, ext_sa = f"{RELEASE}-scheduler", f"{RELEASE}-extender"
    assert pod["serviceAccountName"] == sched_sa and pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    containers = {c["name"]: c for c in pod["containers"]}
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"

    def mounted(container: str) -> dict:
        (m,) = [m for m in containers[container]["volumeMounts"] if m["mountPath"] == token_dir]
        assert m["readOnly"] is True
        return volumes[m["name"]]

    projected = mounted("kube-scheduler")["projected"]["sources"]
    assert {next(iter(s)) for s in projected} == {"serviceAccountToken", "configMap", "downwardAPI"}
    secret = mounted("extender")["secret"]["secretName"]
    (token,) = [d for d in docs if d["kind"] == "Secret"]
    assert token["metadata"]["name"] == secret and token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {"kubernetes.io/service-account.name": ext_sa}
    # no other container mounts either token
    for name, c in containers.items():
        if name not in ("kube-scheduler", "extender"):
            assert token_dir not in {m["mountPath"] for m in c.get("volumeMounts", [])}


def grants(docs: list[dict], sa: str) -> set[tuple[str | None, str, str, str, str]]:
    """(namespace or None, apiGroup, resource, verb, resourceName or "*") granted to ``sa``
    by the chart's own Roles/ClusterRoles; roles the chart does not define are named."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: set[tuple[str | None, str, str, str, str]] = set()
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            continue
        ns = b["metadata"].get("namespace")
        role = roles.get((b["roleRef"]["kind"], b["roleRef"]["name"]))
        if role is None:
            out.add((ns, "", b["roleRef"]["name"], "*", "*"))
            continue
        for r in role["rules"]:
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    for v in r["verbs"]:
                        for n in r.get("resourceNames", ["*"]):
                            out.add((ns, g, res, v, n))
    return out


def test_extender_token_reads_only(helm):
    docs = scheduler_docs(helm)
    assert grants(docs, f"{RELEASE}-extender") == {
        (None, "", "nodes", "list", "*"),
        (None, "", "nodes", "watch", "*"),
        (None, "", "pods", "list", "*"),
        (None, "", "pods", "watch", "*"),
        (NAMESPACE, "coordination.k8s.io", "leases", "list", "*"),
        (NAMESPACE, "coordination.k8s.io", "leases", "watch", "*"),
    }
    sched = grants(docs, f"{RELEASE}-scheduler")
    # the scheduler's own Lease, by name, outside the release namespace; no agent Lease
    assert {g for g in sched if g[2] == "leases"} == {
        ("kube-system", "coordination.k8s.io", "leases", "get", f"{RELEASE}-scheduler"),
        ("kube-system", "coordination.k8s.io", "leases", "update", f"{RELEASE}-scheduler"),
    }
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    election = yaml.safe_load(cm["data"]["config.yaml"])["leaderElection"]
    assert election["resourceNamespace"] == "kube-system"
    assert election["resourceName"] == f"{RELEASE}-scheduler"


# ------------------------------------------------------------------------ PodResources ----


def test_pod_resources_mount_is_read_only_and_never_created(helm):
    sock = "/var/lib/kubelet/pod-resources/kubelet.sock"
    docs = render(helm, {"podResourcesSocket": sock})
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert vol["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}


def test_unix_socket_connects_through_a_read_only_bind_mount(tmp_path):
    """Why readOnly does not cut the agent off the kubelet: connect(2) on a unix socket needs
    write permission on the socket file, not a writable mount (Linux; a private mount namespace,
    as the kubelet's read-only bind mount for the container)."""
    import os
    import shutil
    import socket
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a mount namespace)")
    host, seen = tmp_path / "host", tmp_path / "container"
    host.mkdir()
    seen.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(host / "kubelet.sock"))
    server.listen(1)
    server.settimeout(60)  # accept() raises rather than hang when the connect failed
    client = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(b'ok'); open(sys.argv[2], 'w')"
    )
    script = (
        f"mount --bind {host} {seen} && mount -o remount,bind,ro {seen} && "
        f"{sys.executable} -c \"{client}\" {seen}/kubelet.sock {seen}/written"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    conn, _ = server.accept()
    assert conn.recv(2) == b"ok"  # the connection went through the read-only mount
    assert "Read-only file system" in proc.stderr, proc.stderr  # and nothing can be written
    conn.close()
    server.close()


# ------------------------------------------- what the docs say an agent token can do (issue 30) ----

#: what docs/chart.md's table must say of each cluster-wide grant beyond get/patch Nodes
GRANT_WORDS = {("pods", "get"): "`get` any Pod", ("events", "create"): "Events in any namespace"}


@pytest.mark.parametrize("gpus", ["none", "all"])
def test_the_docs_table_names_every_cluster_wide_grant_of_the_agent(helm, gpus):
    """The agent's ClusterRole, rendered with sharing off and on: every grant beyond get/patch
    Nodes is in docs/chart.md's "What each token can do" agent row, in both columns."""
    docs = render(helm, {"sharing": {"gpus": gpus}, "devicePlugin": gpus != "none"})
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == RELEASE)
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    extra = grants - {("nodes", "get"), ("nodes", "patch")}
    assert extra == (set(GRANT_WORDS) if gpus == "all" else set())
    text = (CHART.parent.parent / "docs" / "chart.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| agent, ServiceAccount"))
    cells = row.split(" | ")
    for grant in extra:
        assert all(GRANT_WORDS[grant] in cell for cell in cells[1:3]), (grant, cells[1:3])
