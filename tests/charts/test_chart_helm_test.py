"""The chart's ``helm test`` (templates/tests/agent-labels.yaml), rendered by the real helm.

A Pod, a ``test`` hook, runs ``omaticaya check-labels`` for the release's DaemonSet under the
agent's prefix, as its own ServiceAccount; the RBAC objects are hooks too, created before it
(lower weights) and deleted once it has ended. The Pod meets the "restricted" Pod Security level
whatever the agent's securityContext, and runs on any Node, tolerating what the agent
tolerates. NOTES say how to run it.
The RBAC equals what ``check-labels``'s calls need: tests/charts/test_chart_rbac_code.py;
``helm test`` on a real cluster: tests/charts/test_helm_install.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.chart import ALL_ON, NAMESPACE, RELEASE, agent_daemonset, env_of, run_helm, template
from tests.chart import CHART as CHART_DIR

KINDS = ["ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "Pod"]


def docs_of(helm: dict[str, Any], values: dict[str, Any] | None = None) -> list[dict]:
    return [d for d in yaml.safe_load_all(template(helm, values).stdout) if d]


def helm_test_hooks(docs: list[dict]) -> list[dict]:
    return [
        d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
    ]


def pod_of(docs: list[dict]) -> dict:
    (pod,) = [d for d in helm_test_hooks(docs) if d["kind"] == "Pod"]
    return pod


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["defaults", "all-on"])
def test_the_objects_their_order_and_deletion(helm, values):
    hooks = helm_test_hooks(docs_of(helm, values))
    assert sorted(d["kind"] for d in hooks) == sorted(KINDS)
    weight = {
        d["kind"]: int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0")) for d in hooks
    }
    # the ServiceAccount, then the roles, then the bindings, then the Pod
    assert weight["ServiceAccount"] < weight["Role"] == weight["ClusterRole"]
    assert weight["Role"] < weight["RoleBinding"] == weight["ClusterRoleBinding"] < weight["Pod"]
    for d in hooks:
        meta = d["metadata"]
        assert meta["name"] == f"{RELEASE}-test"
        assert meta.get("namespace", NAMESPACE) == NAMESPACE
        policy = meta["annotations"]["helm.sh/hook-delete-policy"].split(",")
        assert policy == ["before-hook-creation", "hook-succeeded"]
        # not the agent's selector, nor the uninstall hook's component
        assert meta["labels"]["app.kubernetes.io/component"] == "helm-test"
        assert meta["labels"]["app.kubernetes.io/name"] != "omaticaya"
    assert (
        pod_of(hooks)["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    )


def test_the_pod_checks_the_release_daemonset_under_the_agents_prefix(helm):
    values = {"prefix": "gpu.example.com/", "image": {"repository": "r.example/o", "tag": "1.2"}}
    docs = docs_of(helm, values)
    (container,) = pod_of(docs)["spec"]["containers"]
    ds = agent_daemonset(docs)
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == agent["image"] == "r.example/o:1.2"
    assert container["args"] == [
        "check-labels",
        f"--namespace={NAMESPACE}",
        f"--name={ds['metadata']['name']}",
        f"--prefix={env_of(docs)['OMATICAYA_PREFIX']}",
    ]
    assert env_of(docs)["OMATICAYA_PREFIX"] == "gpu.example.com"


def test_the_pod_runs_as_its_own_account_on_any_node(helm):
    values = {
        "nodeSelector": {"pool": "gpu-a"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "x", "operator": "NotIn", "values": ["y"]}]}]}}},
        "imagePullSecrets": [{"name": "pull"}],
    }  # fmt: skip
    docs = docs_of(helm, values)
    spec = pod_of(docs)["spec"]
    agent = agent_daemonset(docs)["spec"]["template"]["spec"]
    for key in ("tolerations", "imagePullSecrets"):
        assert spec[key] == agent[key], key
    # any Node: where the agent's selector matches none, the test must run to say so
    assert "nodeSelector" not in spec and "affinity" not in spec
    assert spec["serviceAccountName"] == f"{RELEASE}-test" != agent["serviceAccountName"]
    assert spec["restartPolicy"] == "Never"
    (binding,) = [d for d in helm_test_hooks(docs) if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-test", "namespace": NAMESPACE}
    ]
    (role,) = [d for d in helm_test_hooks(docs) if d["kind"] == "Role"]
    assert role["rules"][0]["resourceNames"] == [agent_daemonset(docs)["metadata"]["name"]]


@pytest.mark.parametrize(
    "values",
    [None, {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}},
     {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}],
    ids=["defaults", "agent-as-root", "agent-unconfined"],
)  # fmt: skip
def test_the_pod_meets_restricted_whatever_the_agents_context(helm, values):
    """The "restricted" level's pod and container fields (Pod Security Standards v1.37), as
    rendered; the agent's own securityContext values do not reach the test Pod."""
    spec = pod_of(docs_of(helm, values))["spec"]
    psc = spec["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key)
    assert all(set(v) <= {"name", "emptyDir"} for v in spec["volumes"])
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not sc.get("privileged") and "runAsUser" not in sc
        assert sc["readOnlyRootFilesystem"] is True


def test_no_rbac_no_test(helm):
    """Without the chart's RBAC (``rbac.create: false``) there is no account to check with."""
    assert (
        helm_test_hooks(docs_of(helm, {"rbac": {"create": False}, "serviceAccount": {"name": "x"}}))
        == []
    )


def test_notes_say_how_to_run_it(helm):
    out = run_helm(
        helm, "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, "--dry-run=client"
    ).stdout
    notes = out.split("NOTES:", 1)[1]
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes, notes
