"""`helm install` for real: the chart's DaemonSet runs as a pod on a real kubelet and labels its
own Node (issue 19).

The cluster is ``scripts/dev-cluster up --full``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kube-proxy and a kubelet on containerd 2 with a bridge CNI, all v1.37.2, and the
agent image built without a Docker daemon by ``scripts/build-image`` (Debian bookworm + the
project's wheel + the recorded traces), imported as ``omaticaya.local/omaticaya:<version>``. The
real ``helm`` and ``kubectl`` (tests/tools.py) install the chart in trace mode (``trace:
h100-trace.json``; no GPU), and the test follows the user's path: the pod goes Ready (the kubelet
runs the chart's probes under its securityContext), ``kubectl get nodes --show-labels`` shows the
labels, the agent's own ServiceAccount token can do exactly its RBAC, ``helm upgrade`` rolls the
pod, and a plain ``helm uninstall`` lets the pod's SIGTERM remove the dynamic labels: the chart's
pre-delete hook (``omaticaya stop-daemonset``) stops the DaemonSet and waits for its pods before
helm deletes the agent's RBAC. ``helm test`` (``omaticaya check-labels``) fails, saying why,
while the agent's DaemonSet runs on no Node, and passes once the agent labelled its Node.

Every wait is on a condition; nothing asserts a latency. Needs Linux and root (containerd,
kubelet, bridge, iptables); cold, ``up --full`` builds containerd 2 (~1-3 min) and the image
(~1.5 min); the Kubernetes components are the multi-call binary the API server came from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devcluster.cluster import K8S_VERSION
from omaticaya_py.core.publish.render import is_static
from tests.audit import audit_events
from tests.charts.helm_install_support import (  # the names moved out, for this file's tests
    CHART,  # noqa: F401
    NAMESPACE,  # noqa: F401
    PREFIX,  # noqa: F401
    RELEASE,  # noqa: F401
    REPO,  # noqa: F401
    TRACE,  # noqa: F401
    WAIT_S,  # noqa: F401
    Kube,  # noqa: F401
    cluster,  # noqa: F401
    tools,  # noqa: F401
    values_file,  # noqa: F401
    wait_for,  # noqa: F401
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

#: what the h100 trace's GPU is, whatever its load
HARDWARE = {
    "gpu.count": "1",
    "gpu.product": "NVIDIA-H100-80GB-HBM3",
    "gpu.family": "hopper",
    "gpu.memory.total-mib": "81559",
    "gpu.compute.major": "9",
    "gpu.compute.minor": "0",
}


def ready_pod(kube: Kube, node: str, *, not_uid: str | None = None) -> dict[str, Any] | None:
    """The release's pod on ``node`` once it is Ready (and is not the pod ``not_uid``)."""
    for pod in kube.pods():
        if pod["spec"].get("nodeName") != node or pod["metadata"]["uid"] == not_uid:
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        if conds.get("Ready") == "True":
            return pod
    return None


def _kubeconfig_token(path: Path) -> str:
    """The bearer token in a kubeconfig ``sa_kubeconfig`` wrote."""
    return str(yaml.safe_load(path.read_text())["users"][0]["user"]["token"])


def sa_kubeconfig(kube: Kube, tmp: Path) -> Path:
    """A kubeconfig holding only a token of the agent's ServiceAccount bound to the agent's pod,
    as the one its pod mounts (a projected token from the TokenRequest API: no token Secrets
    since 1.24; bound to the pod, it carries the pod's Node, which the admission policies
    read)."""

    def agent_pod() -> str | None:
        pods = kube.json(
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=omaticaya",
        )
        running = [
            p["metadata"]["name"]
            for p in pods["items"]
            if p["status"].get("phase") == "Running"
            and p["metadata"].get("deletionTimestamp") is None
            and any(
                o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences") or []
            )
        ]
        return running[0] if running else None

    pod = wait_for("the agent's pod running", agent_pod)
    token = kube.kubectl(
        "-n",
        NAMESPACE,
        "create",
        "token",
        RELEASE,
        "--duration",
        "1h",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        pod,
    ).stdout.strip()
    path = tmp / "sa.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "dev",
                        "cluster": {
                            "server": kube.cluster.server,
                            "certificate-authority": str(kube.cluster.ca_file),
                        },
                    }
                ],
                "users": [{"name": "agent", "user": {"token": token}}],
                "contexts": [{"name": "agent", "context": {"cluster": "dev", "user": "agent"}}],
                "current-context": "agent",
            }
        )
    )
    path.chmod(0o600)
    return path


#: (verb, resource [--subresource=...]) the agent's token must not do, whatever its chart grants
#: (kubectl reads "nodes/status" as the Node named status, hence --subresource)
MUST_NOT = [
    ("list", "nodes"),
    ("watch", "nodes"),
    ("update", "nodes"),
    ("delete", "nodes"),
    ("create", "nodes"),
    ("patch", "nodes --subresource=status"),
    ("get", "events"),
    ("delete", "events"),
    ("get", "pods"),
    ("list", "pods"),
    ("create", "pods"),
    ("delete", "pods"),
    ("get", "secrets"),
    ("list", "secrets"),
    ("get", "configmaps"),
    ("patch", "daemonsets.apps"),
    ("create", "serviceaccounts --subresource=token"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("impersonate", "users"),
]


def granted(kube: Kube) -> dict[tuple[str, str | None], set[str]]:
    """What the release's RBAC grants the agent's ServiceAccount, from ``helm get manifest``:
    {(resource[.group], namespace, or None for a ClusterRole): verbs}."""
    docs = [
        d
        for d in yaml.safe_load_all(kube.helm("get", "manifest", RELEASE, "-n", NAMESPACE).stdout)
        if d
    ]
    bound: set[tuple[str, str]] = set()
    for d in docs:
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(
            s.get("kind") == "ServiceAccount" and s.get("name") == RELEASE
            for s in d.get("subjects") or []
        ):
            bound.add((d["roleRef"]["kind"], d["roleRef"]["name"]))
    out: dict[tuple[str, str | None], set[str]] = {}
    for d in docs:
        if (d["kind"], d["metadata"]["name"]) not in bound:
            continue
        ns = None if d["kind"] == "ClusterRole" else d["metadata"].get("namespace", NAMESPACE)
        for rule in d.get("rules") or []:
            for group in rule.get("apiGroups") or [""]:
                for res in rule.get("resources") or []:
                    key = res if group == "" else f"{res}.{group}"
                    out.setdefault((key, ns), set()).update(rule["verbs"])
    return out


def test_helm_install_labels_its_node_then_upgrade_and_uninstall(cluster, tools, tmp_path):
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")

    # --- the chart admits the server: the dev cluster is the release under test, within the
    # chart's kubeVersion (>= 1.31)
    server = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == K8S_VERSION, server
    # helm checks Chart.yaml's kubeVersion before it installs: 1.30 is refused, the install
    # below onto the dev cluster is not
    refused = kube.helm("template", RELEASE, str(CHART), "--kube-version", "1.30.0", check=False)
    assert refused.returncode != 0 and "kubeVersion" in refused.stderr, refused.stderr

    # --- helm install (trace mode)
    values = values_file(tmp_path, cluster, node)
    out = kube.helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "-f",
        str(values),
        "--wait",
        "--timeout",
        f"{int(WAIT_S)}s",
    )
    assert "STATUS: deployed" in out.stdout, out.stdout
    pod = wait_for(
        "the DaemonSet's pod on the kubelet's Node to be Ready", lambda: ready_pod(kube, node)
    )
    spec = pod["spec"]
    (container,) = spec["containers"]
    # what the kubelet ran: the chart's probes, securityContext and in-cluster wiring
    assert container["image"] == cluster.agent_image
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532 and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["OMATICAYA_TRACE"]["value"] == f"/opt/omaticaya/traces/{TRACE}"
    assert "NVIDIA_VISIBLE_DEVICES" not in env, "trace mode needs no NVIDIA runtime"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert spec["serviceAccountName"] == RELEASE
    assert any(
        m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
        for m in container.get("volumeMounts", [])
    ), "the ServiceAccount admission mounted the token"
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] is True and status["restartCount"] == 0, status
    assert pod["status"]["podIP"].startswith(cluster.full_env()["POD_SUBNET"].rsplit(".", 1)[0]), (
        "the pod has its own network namespace on the CNI bridge (not hostNetwork)"
    )
    assert not spec.get("hostNetwork")
    log = kube.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"]).stdout
    assert "reader=TraceReader" in log, log[-2000:]
    # the API server saw the agent's patch come from the pod's own IP, as its ServiceAccount:
    # the pod read its mounted token and reached 10.0.0.1:443 (the `kubernetes` Service) through
    # kube-proxy
    sa_user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"

    def patch_from_pod() -> list[dict[str, Any]]:
        return audit_events(cluster, verb="patch", resource="nodes", name=node, user=sa_user)

    patches = wait_for("the agent's patch in the audit log", patch_from_pod)
    assert {ip for e in patches for ip in e["sourceIPs"]} == {pod["status"]["podIP"]}, patches[0]
    assert any(e["responseStatus"]["code"] == 200 for e in patches), patches

    # --- kubectl get nodes --show-labels: Ready means the agent read the trace and the API
    # server answered its patch, so the labels are there at the first look after Ready
    labels = kube.node_labels(node)
    for key, value in HARDWARE.items():
        assert labels.get(key) == value, (key, labels)
    assert labels.get("gpu.health") == "Healthy", labels
    for key in ("gpu.memory.free-mib", "gpu.utilization-pct", "gpu.idle-count", "gpu-0.health"):
        assert key in labels, (key, labels)
    telemetry = json.loads(
        kube.json("get", "node", node)["metadata"]["annotations"][f"{PREFIX}telemetry"]
    )
    assert telemetry["gpus"][0]["uuid"], telemetry

    # --- the agent's own token (the one mounted in its pod) can do exactly its RBAC
    sa_env = sa_kubeconfig(kube, tmp_path)
    grants = granted(kube)
    assert ("nodes", None) in grants, grants
    checks: list[tuple[str, str, str | None, bool]] = []  # verb, resource, namespace, expected
    for (resource, ns), verbs in sorted(grants.items(), key=str):
        for verb in sorted(verbs):
            checks.append((verb, resource, ns, True))
            if ns is not None:  # a Role: its namespace only
                checks.append((verb, resource, "kube-system", False))
    checks += [(verb, resource, None, False) for verb, resource in MUST_NOT]
    table, wrong = [], []
    for verb, resource, ns, expected in checks:
        where = ["-n", ns] if ns else []
        proc = kube.run(
            kubectl,
            "--kubeconfig",
            str(sa_env),
            "auth",
            "can-i",
            verb,
            *resource.split(),
            *where,
            check=False,
        )
        answer = proc.stdout.strip()
        assert answer in ("yes", "no"), (verb, resource, proc.stdout, proc.stderr)
        table.append(f"{verb:12} {resource:48} {ns or '(cluster)':14} {answer}")
        if (answer == "yes") != expected:
            wrong.append(
                f"{verb} {resource} in {ns}: {answer}, expected {'yes' if expected else 'no'}"
            )
    print("kubectl auth can-i as system:serviceaccount:omaticaya:omaticaya\n" + "\n".join(table))
    assert not wrong, "\n".join(wrong)

    # and the rules the API server lists for that token in the release namespace are the
    # chart's ClusterRole and Role, nothing more
    def listed_rules(kubeconfig: Path) -> tuple[str, dict[str, set[str]]]:
        rules = kube.run(
            kubectl, "--kubeconfig", str(kubeconfig), "auth", "can-i", "--list", "-n", NAMESPACE
        ).stdout
        listed: dict[str, set[str]] = {}
        for line in rules.splitlines()[1:]:
            if line.strip() and not line[0].isspace():  # resource rows; URL rows are indented
                verbs = line[line.rindex("[") + 1 : line.rindex("]")].split()
                listed.setdefault(line.split()[0], set()).update(verbs)
        return rules, listed

    rules, listed = listed_rules(sa_env)
    # less what every service account may do on this server (system:basic-user and the
    # release's other defaults: the self-reviews, ClusterTrustBundles on 1.3x), as the
    # namespace's `default` ServiceAccount, which the chart binds to nothing, is listed
    baseline = kube.kubectl("-n", NAMESPACE, "create", "token", "default", "--duration", "10m")
    base_env = tmp_path / "default-sa.kubeconfig"
    base_env.write_text(
        sa_env.read_text().replace(_kubeconfig_token(sa_env), baseline.stdout.strip())
    )
    base_env.chmod(0o600)
    for resource, verbs in listed_rules(base_env)[1].items():
        if listed.get(resource, set()) <= verbs:
            listed.pop(resource, None)
    expected_list: dict[str, set[str]] = {}
    for (resource, ns), verbs in grants.items():
        if ns in (None, NAMESPACE):
            expected_list.setdefault(resource, set()).update(verbs)
    assert listed == expected_list, rules

    # --- helm upgrade with a new schedule rolls the pod
    old_uid = pod["metadata"]["uid"]
    values2 = values_file(tmp_path, cluster, node, schedule="@every 3s")
    kube.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "-f",
        str(values2),
        "--wait",
        "--timeout",
        f"{int(WAIT_S)}s",
    )
    new = wait_for(
        "a new Ready pod after the upgrade", lambda: ready_pod(kube, node, not_uid=old_uid)
    )
    new_env = {e["name"]: e.get("value") for e in new["spec"]["containers"][0]["env"]}
    assert new_env["OMATICAYA_SCHEDULE"] == "@every 3s"
    wait_for(
        "the old pod to be gone", lambda: old_uid not in {p["metadata"]["uid"] for p in kube.pods()}
    )
    assert json.loads(kube.helm("list", "-n", NAMESPACE, "-o", "json").stdout)[0]["revision"] == "2"

    # --- uninstall: the pod's SIGTERM removes the dynamic labels, the hardware facts stay.
    # The chart's pre-delete hook stops the DaemonSet and waits for its pods before helm deletes
    # the RBAC (test_plain_helm_uninstall_keeps_rbac_until_cleanup looks closer).
    before = kube.node_labels(node)
    dynamic = {k for k in before if not is_static(PREFIX + k, PREFIX.rstrip("/"))}
    assert dynamic and set(HARDWARE) <= set(before) - dynamic, before
    kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", f"{int(WAIT_S)}s")
    assert not kube.pods(), "the hook waited for the agent pods"
    after = kube.node_labels(node)
    assert not dynamic & set(after), (
        f"dynamic labels left after SIGTERM: {sorted(dynamic & set(after))}"
    )
    for key, value in HARDWARE.items():
        assert after.get(key) == value, (key, after)


def helm_test_objects(kube: Kube) -> list[str]:
    """The ``helm test`` objects in the cluster (kind/name): its Pod, ServiceAccount and RBAC."""
    namespaced = kube.kubectl(
        "-n", NAMESPACE, "get",
        "pods,serviceaccounts,roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io",
        "-l", "app.kubernetes.io/component=helm-test", "-o", "name",
    ).stdout.split()  # fmt: skip
    cluster_wide = kube.kubectl(
        "get", "clusterroles.rbac.authorization.k8s.io,clusterrolebindings.rbac.authorization.k8s.io",
        "-l", "app.kubernetes.io/component=helm-test", "-o", "name",
    ).stdout.split()  # fmt: skip
    return sorted(namespaced + cluster_wide)


def test_helm_test_checks_that_the_agent_labelled_its_node(cluster, tools, tmp_path):
    """``helm test`` (templates/tests/agent-labels.yaml, ``omaticaya check-labels``): installed
    with a nodeSelector that matches no Node (the chart's default ``nvidia.com/gpu.present``
    where nothing sets it), it fails, helm printing the Pod's line that says why, and only the
    failed Pod stays (for ``kubectl logs``); once ``helm upgrade`` has put the agent on the
    kubelet's Node and it labelled it, it passes, lists the Node, and leaves nothing behind (the
    failed Pod replaced); ``helm uninstall`` leaves nothing either."""
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    nowhere = {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": "no-such-node"}
    values = values_file(tmp_path, cluster, node, nodeSelector=nowhere)
    wait = ["--wait", "--timeout", f"{int(WAIT_S)}s"]
    kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
              "-f", str(values), *wait)  # fmt: skip
    notes = kube.helm("get", "notes", RELEASE, "-n", NAMESPACE).stdout
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes, notes
    test = ["test", RELEASE, "-n", NAMESPACE, "--timeout", f"{int(WAIT_S)}s"]

    # --- no agent anywhere: the test fails and says why
    assert not kube.pods() and "gpu.health" not in kube.node_labels(node)
    failed = kube.helm(*test, check=False)
    said = f"DaemonSet {NAMESPACE}/{RELEASE} targets no Node"
    assert failed.returncode != 0, failed.stdout
    assert said in failed.stdout + failed.stderr, (failed.stdout, failed.stderr)
    # the RBAC went, the failed Pod stays for its log
    wait_for(
        "the helm test's RBAC to be gone",
        lambda: helm_test_objects(kube) == [f"pod/{RELEASE}-test"],
    )
    pod = kube.json("-n", NAMESPACE, "get", "pod", f"{RELEASE}-test")
    assert pod["status"]["phase"] == "Failed", pod["status"]
    assert said in kube.kubectl("-n", NAMESPACE, "logs", f"{RELEASE}-test").stdout

    # --- the agent on the kubelet's Node: once it labelled it, the test passes
    kube.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE,
              "-f", str(values_file(tmp_path, cluster, node)), *wait)  # fmt: skip
    wait_for("the agent's pod to be Ready", lambda: ready_pod(kube, node))
    passed = kube.helm(*test, "--logs")
    assert re.search(r"Phase:\s+Succeeded", passed.stdout), passed.stdout
    assert f"Node {node}: {PREFIX}gpu.health=Healthy, {PREFIX}gpu.count=1" in passed.stdout
    assert "the agent labelled all 1 Node(s) it runs on" in passed.stdout, passed.stdout
    wait_for("the helm test's objects to be gone", lambda: not helm_test_objects(kube))
    kube.helm("uninstall", RELEASE, "-n", NAMESPACE, *wait)
    assert not helm_test_objects(kube)


def test_plain_helm_uninstall_keeps_rbac_until_cleanup(cluster, tools, tmp_path):
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    values = values_file(tmp_path, cluster, node)
    kube.helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "-f",
        str(values),
        "--wait",
        "--timeout",
        f"{int(WAIT_S)}s",
    )
    pod = wait_for("the pod to be Ready", lambda: ready_pod(kube, node))
    before = kube.node_labels(node)
    dynamic = {k for k in before if not is_static(PREFIX + k, PREFIX.rstrip("/"))}
    assert dynamic and set(HARDWARE) <= set(before) - dynamic, before
    assert not kube.hook_objects(), "the hook's objects exist only during an uninstall"
    audit_start = len(cluster.audit_lines())
    # a plain uninstall: no --wait, no --cascade, nothing deleted by hand first
    out = kube.helm("uninstall", RELEASE, "-n", NAMESPACE)
    assert "uninstalled" in out.stdout, out.stdout
    # helm returned after the hook: the agent pods were gone before it deleted the RBAC
    assert not kube.pods(), kube.pods()
    after = kube.node_labels(node)
    assert not dynamic & set(after), f"dynamic labels left: {sorted(dynamic & set(after))}"
    for key, value in HARDWARE.items():
        assert after.get(key) == value, (key, after)
    # the hook's ServiceAccount, Role, RoleBinding and Job went with it (hook-succeeded)
    wait_for("the hook's objects to be gone", lambda: not kube.hook_objects())
    # the API server's view: the agent's SIGTERM patch came from its pod and was allowed; the
    # hook deleted the DaemonSet (foreground) as its own ServiceAccount, before helm deleted
    # the ClusterRoleBinding
    events = audit_events(cluster, since=audit_start)
    agent_user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    cleanup = [
        e
        for e in events
        if e["user"]["username"] == agent_user
        and e["verb"] == "patch"
        and (e.get("objectRef") or {}).get("resource") == "nodes"
        and e.get("sourceIPs") == [pod["status"]["podIP"]]
    ]
    assert cleanup and all(e["responseStatus"]["code"] == 200 for e in cleanup), [
        (e["responseStatus"]["code"], e.get("requestReceivedTimestamp")) for e in cleanup
    ]

    def first(user: str, verb: str, resource: str) -> int:
        return next(
            i
            for i, e in enumerate(events)
            if e["user"]["username"] == user
            and e["verb"] == verb
            and (e.get("objectRef") or {}).get("resource") == resource
        )

    hook_user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-uninstall"
    stopped = first(hook_user, "delete", "daemonsets")
    rbac_gone = next(
        i
        for i, e in enumerate(events)
        if e["verb"] == "delete"
        and (e.get("objectRef") or {}).get("resource") == "clusterrolebindings"
        and (e.get("objectRef") or {}).get("name") == RELEASE
    )
    last_cleanup = max(events.index(e) for e in cleanup)
    assert stopped < last_cleanup < rbac_gone, (stopped, last_cleanup, rbac_gone)


def test_without_the_hook_the_agent_cleanup_races_the_rbac_deletion(cluster, tools, tmp_path):
    """The control: ``cleanupOnUninstall: false`` is the chart before the hook, and what its
    NOTES then say is true: helm deletes the RBAC in the same pass as the DaemonSet, so the
    agent's SIGTERM cleanup races it. Whichever wins, the node and the audit log agree: either
    the cleanup was refused (a 403 for a call from the agent's pod: its read of the Node or its
    patch) and the dynamic labels stay, or its patch was allowed before the ClusterRoleBinding
    went and they are gone. Anything else (labels left with no refused call, labels gone with no
    allowed patch) fails."""
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    values = values_file(tmp_path, cluster, node, cleanupOnUninstall=False)
    out = kube.helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "-f",
        str(values),
        "--wait",
        "--timeout",
        f"{int(WAIT_S)}s",
    )
    assert "cleanupOnUninstall is off" in out.stdout, out.stdout
    pod = wait_for("the pod to be Ready", lambda: ready_pod(kube, node))
    before = kube.node_labels(node)
    dynamic = {k for k in before if not is_static(PREFIX + k, PREFIX.rstrip("/"))}
    assert dynamic, before
    audit_start = len(cluster.audit_lines())
    kube.helm("uninstall", RELEASE, "-n", NAMESPACE)
    wait_for("the agent pods to be gone", lambda: not kube.pods())
    agent_user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"

    def outcome() -> str | None:
        """``refused`` or ``allowed`` once the node and the audit log agree on one; None while the
        audit log (written in batches) has not caught up."""
        events = audit_events(cluster, since=audit_start)
        patches = [
            i
            for i, e in enumerate(events)
            if e["user"]["username"] == agent_user
            and e["verb"] == "patch"
            and (e.get("objectRef") or {}).get("resource") == "nodes"
            and e.get("sourceIPs") == [pod["status"]["podIP"]]
        ]
        rbac_gone = [
            i
            for i, e in enumerate(events)
            if e["verb"] == "delete"
            and (e.get("objectRef") or {}).get("resource") == "clusterrolebindings"
            and (e.get("objectRef") or {}).get("name") == RELEASE
        ]
        left = dynamic & set(kube.node_labels(node))
        codes = [events[i]["responseStatus"]["code"] for i in patches]
        seen["state"] = {
            "labels_left": sorted(left),
            "patch_codes": codes,
            "patch_at": patches,
            "rbac_gone_at": rbac_gone,
            "from_pod": [
                (
                    i,
                    (e.get("user") or {}).get("username"),
                    e["verb"],
                    (e.get("objectRef") or {}).get("resource"),
                    e["responseStatus"]["code"],
                )
                for i, e in enumerate(events)
                if e.get("sourceIPs") == [pod["status"]["podIP"]]
            ][-12:],
        }
        # the cleanup reads the Node before it patches: a refusal can be its GET
        refused = [
            e
            for e in events
            if (e.get("user") or {}).get("username") == agent_user
            and e.get("sourceIPs") == [pod["status"]["podIP"]]
            and e["responseStatus"]["code"] == 403
        ]
        if left and refused:
            return "refused"
        if not left and patches and codes[-1] == 200 and rbac_gone and patches[-1] < rbac_gone[0]:
            return "allowed"
        return None

    seen: dict[str, object] = {}
    try:
        won = wait_for(
            "the node and the audit log to agree on the agent's SIGTERM cleanup", outcome
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; what they showed: {seen.get('state')}") from None
    print(f"[helm-install] without the hook the agent's cleanup was {won}")
    if won == "allowed":
        return
    # what the NOTES and docs say to do then
    kube.kubectl("label", "node", node, *(f"{PREFIX}{k}-" for k in dynamic))
