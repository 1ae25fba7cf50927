"""The chart's uninstall hook (templates/uninstall-hook.yaml), rendered by the real helm.

A ``pre-delete`` Job runs ``omaticaya stop-daemonset`` for the release's DaemonSet (and with MPS
enforcement a second one, after it, for the MPS supervisor's DaemonSet ``<fullname>-mps``), as
its own ServiceAccount bound to a Role in the release namespace that may only get/delete those
DaemonSets and list pods; the three RBAC objects are hooks too, created before the Job (lower
weight) and deleted with it once it succeeded. tests/charts/test_chart_manifests.py checks the release's other
objects (its ``render`` leaves hooks out); tests/charts/test_helm_install.py runs the hook for real.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from omaticaya_py.cli.parser import build_parser
from tests.chart import (
    ALL_ON,
    K8S_VERSION,
    NAMESPACE,
    RELEASE,
    template,
)

HOOK_KINDS = ["ServiceAccount", "Role", "RoleBinding", "Job"]


def hooks(helm: dict[str, Any], values: dict[str, Any] | None = None) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(template(helm, values).stdout) if d]
    # the pre-delete hooks; the `helm test` hooks: tests/charts/test_chart_helm_test.py
    return [
        d
        for d in docs
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"
    ]


def by_kind(docs: list[dict]) -> dict[str, dict]:
    out = {d["kind"]: d for d in docs}
    assert len(out) == len(docs), [d["kind"] for d in docs]
    return out


def test_hook_objects_and_their_order(helm):
    docs = hooks(helm)
    assert [d["kind"] for d in docs] == HOOK_KINDS
    weights = []
    for d in docs:
        meta = d["metadata"]
        assert meta["name"] == f"{RELEASE}-uninstall" and meta["namespace"] == NAMESPACE
        ann = meta["annotations"]
        assert ann["helm.sh/hook"] == "pre-delete"
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        weights.append(int(ann["helm.sh/hook-weight"]))
        # not the agent's selector: the hook's pod is no agent pod
        assert meta["labels"]["app.kubernetes.io/component"] == "uninstall-hook"
        assert meta["labels"]["app.kubernetes.io/name"] != "omaticaya"
    assert weights == sorted(weights) and len(set(weights)) == len(weights)


def test_hook_rbac_is_namespaced_and_minimal(helm):
    docs = by_kind(hooks(helm, ALL_ON))
    role, binding, sa = docs["Role"], docs["RoleBinding"], docs["ServiceAccount"]
    granted = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb, tuple(rule.get("resourceNames") or ())))
    assert granted == {
        ("apps", "daemonsets", "get", (RELEASE,)),
        ("apps", "daemonsets", "delete", (RELEASE,)),
        ("", "pods", "list", ()),
    }
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    job = docs["Job"]["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == sa["metadata"]["name"] != RELEASE
    # no ClusterRole, no ClusterRoleBinding among the hooks
    assert not [d for d in hooks(helm, ALL_ON) if d["kind"].startswith("Cluster")]


def test_hook_job_runs_stop_daemonset_on_the_release(helm):
    values = {
        "image": {"repository": "registry.example/omaticaya", "tag": "dev", "pullPolicy": "Never"},
        "terminationGracePeriodSeconds": 45,
        "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": "n1"},
        "tolerations": [{"key": "t", "operator": "Exists", "effect": "NoSchedule"}],
        "imagePullSecrets": [{"name": "regcred"}],
    }
    job = by_kind(hooks(helm, values))["Job"]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 45 + 90 + 60
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    assert pod["tolerations"] == values["tolerations"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    (c,) = pod["containers"]
    assert c["image"] == "registry.example/omaticaya:dev" and c["imagePullPolicy"] == "Never"
    assert c["args"] == [
        "stop-daemonset",
        f"--namespace={NAMESPACE}",
        f"--name={RELEASE}",
        "--timeout-s=135",
    ]
    # the args parse in the image's CLI
    args = build_parser().parse_args(c["args"])
    assert (args.namespace, args.name, args.timeout_s) == (NAMESPACE, RELEASE, 135.0)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False


def test_hook_follows_the_fullname(helm):
    docs = hooks(helm, {"fullnameOverride": "gpu-labeller"})
    assert {d["metadata"]["name"] for d in docs} == {"gpu-labeller-uninstall"}
    job = by_kind(docs)["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert "--name=gpu-labeller" in job["args"]
    role = by_kind(docs)["Role"]
    assert role["rules"][0]["resourceNames"] == ["gpu-labeller"]
    long = hooks(helm, {"fullnameOverride": "x" * 63})
    assert all(len(d["metadata"]["name"]) <= 63 for d in long)


@pytest.mark.parametrize(
    "values",
    [
        {"cleanupOnUninstall": False},
        # the user's RBAC: helm deletes none, so the agents' cleanup is not refused
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}},
    ],
    ids=["off", "no-rbac"],
)
def test_no_hook(helm, values):
    assert hooks(helm, values) == []


def test_schema_refuses_a_non_boolean(helm):
    proc = template(helm, {"cleanupOnUninstall": "yes"}, check=False)
    assert proc.returncode != 0 and "cleanupOnUninstall" in proc.stderr


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["default", "all-on"])
def test_hook_objects_validate_against_k8s_schemas(helm, values):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in hooks(helm, values):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_with_mps_a_second_job_stops_the_mps_daemonset_after_the_agents(helm):
    """The MPS supervisor's DaemonSet (<fullname>-mps): a second Job, weight 1, so that helm
    starts it once the agents have stopped (each agent's cleanup first), and `helm uninstall`
    returns once every supervisor has stopped its daemons and removed its folders. The Role
    names both DaemonSets and nothing else."""
    values = {"devicePlugin": True, "sharing": {"gpus": "0-1", "mps": {
        "terminationGracePeriodSeconds": 50}}, "terminationGracePeriodSeconds": 45}  # fmt: skip
    docs = hooks(helm, values)
    assert [d["kind"] for d in docs] == [*HOOK_KINDS, "Job"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["rules"][0]["resourceNames"] == [RELEASE, f"{RELEASE}-mps"]
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    assert set(jobs) == {f"{RELEASE}-uninstall", f"{RELEASE}-uninstall-mps"}
    agent, mps = jobs[f"{RELEASE}-uninstall"], jobs[f"{RELEASE}-uninstall-mps"]
    assert agent["metadata"]["annotations"]["helm.sh/hook-weight"] == "0"
    assert mps["metadata"]["annotations"]["helm.sh/hook-weight"] == "1"
    assert mps["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert mps["spec"]["activeDeadlineSeconds"] == 50 + 90 + 60
    (c,) = mps["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["stop-daemonset", f"--namespace={NAMESPACE}", f"--name={RELEASE}-mps",
                         "--timeout-s=140"]  # fmt: skip
    args = build_parser().parse_args(c["args"])
    assert (args.name, args.timeout_s) == (f"{RELEASE}-mps", 140.0)
    # the same pod as the first Job's, but for what it stops
    a_pod, m_pod = agent["spec"]["template"]["spec"], mps["spec"]["template"]["spec"]
    assert a_pod["containers"][0]["args"][2] == f"--name={RELEASE}"
    assert {**m_pod, "containers": None} == {**a_pod, "containers": None}
    # without MPS enforcement: one Job, the Role names the agent's DaemonSet alone
    off = hooks(helm, {**values, "sharing": {"gpus": "0-1", "enforcement": "none"}})
    assert [d["kind"] for d in off] == HOOK_KINDS
    long = hooks(helm, {**values, "fullnameOverride": "x" * 63})
    assert all(len(d["metadata"]["name"]) <= 63 for d in long)
    (role,) = [d for d in long if d["kind"] == "Role"]
    assert role["rules"][0]["resourceNames"] == ["x" * 63, "x" * 59 + "-mps"]
