"""Shared helpers for the Helm chart's tests (``tests/test_chart_*.py`` and the tests that render
the chart): the release's names, a hermetic ``helm`` (the session fixture, registered in
``tests/conftest.py``), ``helm template`` rendered to objects, the chart <-> Settings mapping, and
an evaluator of the admission policies' CEL.

helm v4 comes from PyPI via tests/tools.py; the chart is rendered for Kubernetes 1.31, the oldest
release it supports, and its manifests are validated against the 1.31 OpenAPI schemas shipped in
``kubernetes-validate`` (strict: unknown fields are errors, so a field newer than 1.31 fails);
tests/project/test_kube_versions.py renders and validates it at every supported minor.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from omaticaya_py.core.config.settings import Settings, load_settings
from tests.tools import ToolUnavailable, helm_path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "omaticaya"
ENV_EXAMPLE = REPO / ".env.example"
#: the Kubernetes version ``template`` renders for: the oldest supported (Chart.yaml kubeVersion)
K8S_VERSION = "1.31.0"
NAMESPACE = "omaticaya-test"
RELEASE = "omaticaya"

#: Settings with no chart value, and why.
NOT_IN_CHART = {
    "trace": "rendered only when set; tests/charts/test_chart_trace.py",
    "node_name": "always NODE_NAME from the downward API (spec.nodeName)",
    "metrics_address": "the pod has its own IP; 0.0.0.0 is the only useful bind address",
    "shutdown_timeout_s": "derived: two thirds of terminationGracePeriodSeconds (rendered)",
    "mps_state_dir": "the host folder mps-state both DaemonSets mount (rendered; fixed path)",
    "mps_stale_s": "derived: max(15, 3 x sharing.mps.checkS + 5) (rendered)",
}
#: Settings whose chart value is nested (a group of values), by dotted path.
NESTED_VALUE = {
    "shared_gpus": "sharing.gpus",
    "share_unit_mib": "sharing.unitMib",
    "shared_resource": "sharing.resource",
    # one policy for the device plugin and the extender (issue 38), not a sharing value
    "placement_policy": "placement.policy",
    "settle_s": "placement.settleS",
    "share_enforcement": "sharing.enforcement",
    # evict also grants create on pods/eviction (clusterrole.yaml)
    "slice_over_limit_action": "sharing.overLimitAction",
    "mps_root": "sharing.mps.root",
    "mps_thread_share": "sharing.mps.threadShare",
    # the DRA driver (issue 41): OMATICAYA_DRA_PLUGIN_DIR is <kubeletPluginsDir>/gpu.omaticaya.io,
    # OMATICAYA_DRA_DEV_ROOT the host's devRoot as mounted (/host/dev)
    "dra": "dra.enabled",
    "dra_plugin_dir": "dra.kubeletPluginsDir",
    "dra_registry_dir": "dra.kubeletRegistryDir",
    "dra_cdi_dir": "dra.cdiDir",
    "dra_dev_root": "dra.devRoot",
    "dra_taint_effect": "dra.taintEffect",
    # the driver's files (issue 52, item 9): OMATICAYA_DRA_DRIVER_ROOT is the host's driverRoot
    # as mounted (/host/driver-root), OMATICAYA_DRA_DRIVER_HOST_ROOT driverRoot itself
    "dra_driver_files": "dra.driverFiles",
    "dra_driver_root": "driverRoot",
    "dra_driver_host_root": "driverRoot",
}
#: Kinds that are not in the core Kubernetes schemas, and why they are not validated.
NOT_CORE = {
    "ServiceMonitor": "prometheus-operator CRD (monitoring.coreos.com/v1), not a core schema",
    "PodMonitor": "prometheus-operator CRD (monitoring.coreos.com/v1), not a core schema",
}

ALL_ON = {
    "serviceMonitor": {
        "enabled": True,
        "labels": {"release": "prometheus"},
        "scrapeTimeout": "10s",
    },
    "podMonitor": {"enabled": True, "relabelings": [{"action": "labeldrop", "regex": "pod"}]},
    "service": {"enabled": True},
    "validatingAdmissionPolicy": {"enabled": True},
    "runtimeClassName": "nvidia",
    "priorityClassName": "system-node-critical",
    "imagePullSecrets": [{"name": "regcred"}],
    "podAnnotations": {"example.com/a": "b"},
    "podLabels": {"team": "gpu"},
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                        ]
                    }
                ]
            }
        }
    },
}


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """helm's path and a hermetic environment (no user config, cache or kubeconfig)."""
    try:
        path = helm_path()
    except ToolUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc}")
    home = tmp_path_factory.mktemp("helm-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
    env.update(
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
        KUBECONFIG=str(home / "no-kubeconfig"),
    )
    return {"path": str(path), "env": env, "home": home}


def run_helm(helm: dict[str, Any], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [helm["path"], *args], env=helm["env"], capture_output=True, text=True, timeout=120
    )
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def values_args(helm: dict[str, Any], values: dict[str, Any] | None) -> list[str]:
    """``-f FILE`` for ``values`` (a file keeps YAML types exactly, unlike --set)."""
    if not values:
        return []
    n = len(list(helm["home"].glob("values-*.yaml")))
    f = helm["home"] / f"values-{n}.yaml"
    f.write_text(yaml.safe_dump(values))
    return ["-f", str(f)]


def template(
    helm: dict[str, Any],
    values: dict[str, Any] | None = None,
    *extra: str,
    check: bool = True,
) -> subprocess.CompletedProcess:
    return run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        K8S_VERSION,
        *values_args(helm, values),
        *extra,
        check=check,
    )


def render(helm: dict[str, Any], values: dict[str, Any] | None = None, *extra: str) -> list[dict]:
    """The release's objects; the uninstall hook's (helm.sh/hook) are checked in
    tests/charts/test_stop_daemonset_chart.py."""
    docs = [d for d in yaml.safe_load_all(template(helm, values, *extra).stdout) if d]
    return [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def _component(d: dict) -> str | None:
    return (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component")


def agent_daemonset(docs: list[dict]) -> dict:
    """The agent's DaemonSet (``<fullname>``; with MPS enforcement the supervisor's DaemonSet
    ``<fullname>-mps`` is rendered beside it)."""
    found = [d for d in docs if d["kind"] == "DaemonSet" and _component(d) == "node-agent"]
    assert len(found) == 1, [d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"]
    return found[0]


def mps_daemonset(docs: list[dict]) -> dict | None:
    """The MPS supervisor's DaemonSet ``<fullname>-mps``, if rendered."""
    found = [d for d in docs if d["kind"] == "DaemonSet" and _component(d) == "mps"]
    assert len(found) <= 1, [d["metadata"]["name"] for d in found]
    return found[0] if found else None


def agent_container(docs: list[dict]) -> dict:
    """The agent's DaemonSet's one container, the agent (the MPS supervisor runs in a
    DaemonSet of its own)."""
    containers = agent_daemonset(docs)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def mps_container(docs: list[dict]) -> dict | None:
    """The MPS supervisor's container ``mps`` (its DaemonSet's one container), if rendered."""
    ds = mps_daemonset(docs)
    if ds is None:
        return None
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["mps"]
    return containers[0]


def env_of(docs: list[dict]) -> dict[str, Any]:
    """name -> value (or valueFrom) of the agent container's env."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in agent_container(docs)["env"]}


def camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(p.capitalize() for p in rest)


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def code_defaults() -> dict[str, Any]:
    """Settings' declared defaults (schedule as its text)."""
    return {
        name: f.get_default(call_default_factory=True) for name, f in Settings.model_fields.items()
    }


def as_plain(s: Settings) -> dict[str, Any]:
    """A Settings object as field -> value, schedule as its text (comparable to code_defaults)."""
    out = {name: getattr(s, name) for name in Settings.model_fields}
    out["schedule"] = s.schedule.text
    return out


def chart_settings(
    env: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Settings:
    """Settings as the agent would load them from the rendered env (no .env file, clean env)."""
    for key in list(os.environ):
        if key.startswith("OMATICAYA_") or key == "NODE_NAME":
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no stray .env
    for key, value in env.items():
        if key.startswith("OMATICAYA_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    return load_settings()


class Vap:
    """Evaluates the rendered policy's CEL with the CEL C++ runtime (untyped, dicts as objects).

    This checks the logic of the expressions, not Kubernetes' type checker; variables are inlined
    (``variables.x`` -> ``(expr)``) as the API server evaluates them lazily.
    """

    def __init__(self, policy: dict) -> None:
        from cel_expr_python import cel

        self.spec = policy["spec"]
        self.defs = {v["name"]: v["expression"] for v in self.spec["variables"]}
        self.env = cel.NewEnv(
            variables={n: cel.Type.DYN for n in ("object", "oldObject", "request")}
        )

    def _inline(self, expr: str) -> str:
        return re.sub(
            r"\bvariables\.(\w+)", lambda m: "(" + self._inline(self.defs[m.group(1)]) + ")", expr
        )

    def _eval(self, expr: str, data: dict) -> Any:
        return self.env.compile(self._inline(expr)).eval(data=data).value()

    def denials(self, old: dict, new: dict, user: str, extra: dict | None) -> list[str] | None:
        """None when the policy does not apply, else the messages of the failed validations."""
        info: dict[str, Any] = {"username": user}
        if extra is not None:
            info["extra"] = extra
        return self.judge({"object": new, "oldObject": old, "request": {"userInfo": info}})

    def judge(self, data: dict) -> list[str] | None:
        """The policy on CEL variables ``data`` (object, oldObject, request): None when its
        match conditions do not all hold, else the messages of the failed validations."""
        if not all(self._eval(c["expression"], data) is True for c in self.spec["matchConditions"]):
            return None
        out = []
        for v in self.spec["validations"]:
            if self._eval(v["expression"], data) is not True:
                out.append(v.get("message") or self._eval(v["messageExpression"], data))
        return out


def node_doc(labels=None, annotations=None, name="gpu-1", spec=None, finalizers=None) -> dict:
    """A Node object as the admission policy sees it (``oldObject``/``object``)."""
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec or {}}
