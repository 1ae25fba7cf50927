"""The Helm chart (charts/omaticaya) and .env.example, checked against the code they configure.

helm v4 comes from PyPI via tests/tools.py; manifests are validated against the Kubernetes 1.30
OpenAPI schemas shipped in ``kubernetes-validate`` (strict: unknown fields are errors).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from omaticaya_py.core.settings import Settings, load_settings
from tests.tools import ToolUnavailable, helm_path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "omaticaya"
ENV_EXAMPLE = REPO / ".env.example"
K8S_VERSION = "1.30.0"
NAMESPACE = "omaticaya-test"
RELEASE = "omaticaya"

#: Settings with no chart value, and why.
NOT_IN_CHART = {
    "trace": "rendered only when set; tests/test_chart_trace.py",
    "node_name": "always NODE_NAME from the downward API (spec.nodeName)",
    "metrics_address": "the pod has its own IP; 0.0.0.0 is the only useful bind address",
    "shutdown_timeout_s": "derived: two thirds of terminationGracePeriodSeconds (rendered)",
}
#: Settings whose chart value is nested (a group of values), by dotted path.
NESTED_VALUE = {
    "shared_gpus": "sharing.gpus",
    "share_unit_mib": "sharing.unitMib",
    "shared_resource": "sharing.resource",
    "share_policy": "sharing.policy",
    "share_settle_s": "sharing.settleS",
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


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


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
    tests/test_stop_daemonset_chart.py."""
    docs = [d for d in yaml.safe_load_all(template(helm, values, *extra).stdout) if d]
    return [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def agent_container(docs: list[dict]) -> dict:
    containers = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
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


# --------------------------------------------------------------------------------------------
# lint and schema validation of the rendered manifests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["default", "all-on"])
def test_helm_lint_strict(helm, values):
    proc = run_helm(helm, "lint", "--strict", str(CHART), *values_args(helm, values), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


#: on by default at K8S_VERSION (1.30): validatingAdmissionPolicy.enabled "auto"
VAP = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
RENDER_CASES = {
    # id: (values, kinds expected)
    "default": (
        None,
        {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet"}
        | VAP,
    ),
    "all-on": (
        ALL_ON,
        {
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
            "Service",
            "ServiceMonitor",
            "PodMonitor",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        },
    ),
    "metrics-off": (
        {"metricsPort": 0, "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet"}
        | VAP,
    ),
    "no-rbac-external-sa": (
        {"serviceAccount": {"create": False, "name": "existing"}, "rbac": {"create": False}},
        {"DaemonSet"} | VAP,
    ),
    "overrides": (
        {
            "fullnameOverride": "gpu-labeller",
            "nodeSelector": {},
            "tolerations": [],
            "resources": {},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "tmpSizeLimit": "",
            "livenessProbe": {"enabled": False},
            "readinessProbe": {"enabled": False},
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
            "podSecurityContext": {"runAsNonRoot": False, "runAsUser": 0},
        },
        {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet"}
        | VAP,
    ),
}


@pytest.mark.parametrize("case", list(RENDER_CASES))
def test_rendered_manifests_validate_against_k8s_schemas(helm, case):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    values, kinds = RENDER_CASES[case]
    docs = render(helm, values)
    assert {d["kind"] for d in docs} == kinds
    skipped = []
    for doc in docs:
        if doc["kind"] in NOT_CORE:
            skipped.append(f"{doc['kind']}: {NOT_CORE[doc['kind']]}")
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")
    for reason in skipped:  # visible with -rA; the CRDs are checked structurally below
        print(f"not schema-validated: {reason}")


def test_vap_needs_kubernetes_1_30(helm):
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        "1.29.0",
        "--set",
        "validatingAdmissionPolicy.enabled=true",
        check=False,
    )
    assert proc.returncode != 0
    assert "Kubernetes >= 1.30" in proc.stderr


# --------------------------------------------------------------------------------------------
# values.schema.json
# --------------------------------------------------------------------------------------------

BAD_VALUES = [
    # (id, values, text expected in helm's error)
    ("perGpuLabels-string", {"perGpuLabels": "yes"}, "/perGpuLabels"),
    ("cleanupOnExit-string-true", {"cleanupOnExit": "true"}, "/cleanupOnExit"),
    ("memoryStepMib-negative", {"memoryStepMib": -1}, "/memoryStepMib"),
    ("memoryStepMib-zero", {"memoryStepMib": 0}, "/memoryStepMib"),
    ("memoryStepMib-string", {"memoryStepMib": "1024"}, "/memoryStepMib"),
    ("memoryStepMib-float", {"memoryStepMib": 1.5}, "/memoryStepMib"),
    ("utilizationStepPct-over-100", {"utilizationStepPct": 101}, "/utilizationStepPct"),
    ("temperatureStepC-too-big", {"temperatureStepC": 51}, "/temperatureStepC"),
    ("hysteresisPct-too-big", {"hysteresisPct": 60}, "/hysteresisPct"),
    ("idleUtilizationPct-negative", {"idleUtilizationPct": -0.5}, "/idleUtilizationPct"),
    ("metricsPort-too-big", {"metricsPort": 70000}, "/metricsPort"),
    ("metricsPort-string", {"metricsPort": "9402"}, "/metricsPort"),
    ("heartbeatS-zero", {"heartbeatS": 0}, "/heartbeatS"),
    ("kubeTimeoutS-negative", {"kubeTimeoutS": -1}, "/kubeTimeoutS"),
    ("xidQuietS-string", {"xidQuietS": "10m"}, "/xidQuietS"),
    ("xidIgnore-string", {"xidIgnore": "13,31"}, "/xidIgnore"),
    ("xidIgnore-item-string", {"xidIgnore": [13, "x"]}, "/xidIgnore/1"),
    ("logLevel-unknown", {"logLevel": "VERBOSE"}, "/logLevel"),
    ("schedule-empty", {"schedule": ""}, "/schedule"),
    ("schedule-number", {"schedule": 10}, "/schedule"),
    ("prefix-not-dns", {"prefix": "Omaticaya_IO"}, "/prefix"),
    ("prefix-nvidia", {"prefix": "nvidia.com"}, "/prefix"),
    ("prefix-kubernetes-subdomain", {"prefix": "feature.node.kubernetes.io"}, "/prefix"),
    ("prefix-k8s", {"prefix": "k8s.io/"}, "/prefix"),
    ("unknown-top-level-key", {"perGpuLabel": True}, "perGpuLabel"),
    ("unknown-nested-key", {"image": {"repo": "x"}}, "repo"),
    ("pullPolicy-unknown", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("updateStrategy-type", {"updateStrategy": {"type": "Recreate"}}, "/updateStrategy/type"),
    (
        "nodeSelector-bool-value",
        {"nodeSelector": {"nvidia.com/gpu.present": True}},
        "/nodeSelector",
    ),
    ("extraEnv-not-list", {"extraEnv": {"A": "b"}}, "/extraEnv"),
    (
        "serviceMonitor-interval",
        {"serviceMonitor": {"interval": "often"}},
        "/serviceMonitor/interval",
    ),
    (
        "vap-enabled-string",
        {"validatingAdmissionPolicy": {"enabled": "yes"}},
        "/validatingAdmissionPolicy/enabled",
    ),
    (
        "vap-failurePolicy",
        {"validatingAdmissionPolicy": {"failurePolicy": "Maybe"}},
        "failurePolicy",
    ),
    ("sharing-gpus-name", {"sharing": {"gpus": "gpu0"}}, "/sharing/gpus"),
    ("sharing-gpus-negative", {"sharing": {"gpus": -1}}, "/sharing/gpus"),
    ("sharing-unitMib-zero", {"sharing": {"unitMib": 0}}, "/sharing/unitMib"),
    ("sharing-policy", {"sharing": {"policy": "pack"}}, "/sharing/policy"),
    ("sharing-settleS-negative", {"sharing": {"settleS": -1}}, "/sharing/settleS"),
    ("sharing-resource-no-domain", {"sharing": {"resource": "vram"}}, "/sharing/resource"),
    ("sharing-unknown-key", {"sharing": {"gpu": "all"}}, "gpu"),
    ("deviceListStrategy-unknown", {"deviceListStrategy": ["volumes"]}, "/deviceListStrategy"),
    ("deviceListStrategy-empty", {"deviceListStrategy": []}, "/deviceListStrategy"),
    ("deviceListStrategy-string", {"deviceListStrategy": "envvar"}, "/deviceListStrategy"),
]


@pytest.mark.parametrize(
    ("values", "where"), [(v, w) for _, v, w in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES]
)
def test_schema_rejects_bad_values(helm, values, where):
    proc = template(helm, values, check=False)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--set", "perGpuLabels=yes"],
        ["--set", "metricsPort=70000"],
        ["--set-string", "memoryStepMib=1024"],
        ["--set", "bogus=1"],
    ],
    ids=lambda a: a[1],
)
def test_schema_rejects_bad_set_flags(helm, args):
    proc = template(helm, None, *args, check=False)
    assert proc.returncode != 0 and "schema" in proc.stderr, proc.stderr


def test_root_without_runAsNonRoot_false_fails_with_hint(helm):
    proc = template(helm, {"securityContext": {"runAsUser": 0}}, check=False)
    assert proc.returncode != 0
    assert "securityContext.runAsNonRoot=false" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------------
# RBAC
# --------------------------------------------------------------------------------------------


def test_clusterrole_has_exactly_the_needed_rules(helm):
    docs = render(helm, ALL_ON)
    role = one(docs, "ClusterRole")
    granted = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no names, no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    granted.add((group, resource, verb))
    # Events: a Role in "default" (tests/test_chart_least_privilege.py), not cluster-wide
    assert granted == {("", "nodes", "get"), ("", "nodes", "patch")}
    # the liveness Lease: get/create/update (delete: its own on uninstall) on leases, in the
    # release namespace only
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "RoleBinding"}
    lease_role, lease_binding = roles[NAMESPACE], bindings[NAMESPACE]
    assert set(roles) == set(bindings) == {NAMESPACE, "default"}
    (rule,) = lease_role["rules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    assert {"get", "create", "update"} <= set(rule["verbs"]) <= {"get", "create", "update", "delete"}
    assert lease_binding["metadata"]["namespace"] == NAMESPACE
    assert lease_binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
        "name": lease_role["metadata"]["name"],
    }

    sa = one(docs, "ServiceAccount")
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["namespace"] == NAMESPACE
    assert lease_binding["subjects"] == binding["subjects"]
    env = env_of(docs)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


# --------------------------------------------------------------------------------------------
# env rendered from values, and the chart <-> Settings contract
# --------------------------------------------------------------------------------------------

ENV_CASES = [
    # (id, values, env name, expected value)
    ("schedule-6-field", {"schedule": "*/5 * * * * ?"}, "OMATICAYA_SCHEDULE", "*/5 * * * * ?"),
    ("schedule-every", {"schedule": "@every 1m30s"}, "OMATICAYA_SCHEDULE", "@every 1m30s"),
    ("xidIgnore-list", {"xidIgnore": [13, 31, 79]}, "OMATICAYA_XID_IGNORE", "13,31,79"),
    ("xidIgnore-empty", {"xidIgnore": []}, "OMATICAYA_XID_IGNORE", ""),
    ("xidIgnore-big", {"xidIgnore": [1000000]}, "OMATICAYA_XID_IGNORE", "1000000"),
    ("prefix", {"prefix": "gpu.example.com"}, "OMATICAYA_PREFIX", "gpu.example.com"),
    (
        "prefix-trailing-slash",
        {"prefix": "gpu.example.com/"},
        "OMATICAYA_PREFIX",
        "gpu.example.com",
    ),
    ("memoryStepMib-big", {"memoryStepMib": 1048576}, "OMATICAYA_MEMORY_STEP_MIB", "1048576"),
    ("utilizationStepPct", {"utilizationStepPct": 25}, "OMATICAYA_UTILIZATION_STEP_PCT", "25"),
    ("temperatureStepC", {"temperatureStepC": 2}, "OMATICAYA_TEMPERATURE_STEP_C", "2"),
    ("hysteresisPct-off", {"hysteresisPct": 0}, "OMATICAYA_HYSTERESIS_PCT", "0"),
    ("hysteresisPct-float", {"hysteresisPct": 12.5}, "OMATICAYA_HYSTERESIS_PCT", "12.5"),
    (
        "idleUtilizationPct-float",
        {"idleUtilizationPct": 2.5},
        "OMATICAYA_IDLE_UTILIZATION_PCT",
        "2.5",
    ),
    ("perGpuLabels-false", {"perGpuLabels": False}, "OMATICAYA_PER_GPU_LABELS", "false"),
    ("temperatureLabels-default-false", None, "OMATICAYA_TEMPERATURE_LABELS", "false"),
    ("temperatureLabels-true", {"temperatureLabels": True}, "OMATICAYA_TEMPERATURE_LABELS", "true"),
    ("cleanupOnExit-false", {"cleanupOnExit": False}, "OMATICAYA_CLEANUP_ON_EXIT", "false"),
    ("logJson-default-true", None, "OMATICAYA_LOG_JSON", "true"),
    ("logJson-false", {"logJson": False}, "OMATICAYA_LOG_JSON", "false"),
    ("logLevel", {"logLevel": "DEBUG"}, "OMATICAYA_LOG_LEVEL", "DEBUG"),
    ("xidAllFatal", {"xidAllFatal": True}, "OMATICAYA_XID_ALL_FATAL", "true"),
    ("xidQuietS", {"xidQuietS": 0}, "OMATICAYA_XID_QUIET_S", "0"),
    ("heartbeatS", {"heartbeatS": 60}, "OMATICAYA_HEARTBEAT_S", "60"),
    ("jitterS-default", None, "OMATICAYA_JITTER_S", "5"),
    ("jitterS", {"jitterS": 3}, "OMATICAYA_JITTER_S", "3"),
    ("jitterS-off", {"jitterS": 0}, "OMATICAYA_JITTER_S", "0"),
    ("minPatchIntervalS-default", None, "OMATICAYA_MIN_PATCH_INTERVAL_S", "30"),
    ("minPatchIntervalS-off", {"minPatchIntervalS": 0}, "OMATICAYA_MIN_PATCH_INTERVAL_S", "0"),
    ("metricsPort", {"metricsPort": 9500}, "OMATICAYA_METRICS_PORT", "9500"),
    ("metricsPort-off", {"metricsPort": 0}, "OMATICAYA_METRICS_PORT", "0"),
    ("failOnInitError", {"failOnInitError": True}, "OMATICAYA_FAIL_ON_INIT_ERROR", "true"),
    ("kubeTimeoutS", {"kubeTimeoutS": 2.5}, "OMATICAYA_KUBE_TIMEOUT_S", "2.5"),
    (
        "extraEnv",
        {"extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]},
        "HTTPS_PROXY",
        "http://proxy:3128",
    ),
    ("sharing-gpus-default", None, "OMATICAYA_SHARED_GPUS", "none"),
    ("sharing-gpus-range", {"sharing": {"gpus": "0-3"}}, "OMATICAYA_SHARED_GPUS", "0-3"),
    ("sharing-gpus-one-index", {"sharing": {"gpus": 2}}, "OMATICAYA_SHARED_GPUS", "2"),
    ("sharing-unitMib", {"sharing": {"unitMib": 2048}}, "OMATICAYA_SHARE_UNIT_MIB", "2048"),
    ("sharing-policy", {"sharing": {"policy": "spread"}}, "OMATICAYA_SHARE_POLICY", "spread"),
    ("sharing-settleS", {"sharing": {"settleS": 15}}, "OMATICAYA_SHARE_SETTLE_S", "15"),
    (
        "sharing-resource",
        {"sharing": {"resource": "example.com/vram"}},
        "OMATICAYA_SHARED_RESOURCE",
        "example.com/vram",
    ),
    ("deviceListStrategy-default", None, "OMATICAYA_DEVICE_LIST_STRATEGY", "envvar,volume-mounts"),
    (
        "deviceListStrategy-cdi",
        {"deviceListStrategy": ["cdi-cri", "cdi-annotations"]},
        "OMATICAYA_DEVICE_LIST_STRATEGY",
        "cdi-cri,cdi-annotations",
    ),
    ("nvidia-visible-devices", None, "NVIDIA_VISIBLE_DEVICES", "all"),
    ("nvidia-driver-capabilities", None, "NVIDIA_DRIVER_CAPABILITIES", "utility"),
]


@pytest.mark.parametrize(
    ("values", "name", "expected"), [c[1:] for c in ENV_CASES], ids=[c[0] for c in ENV_CASES]
)
def test_env_rendered_from_values(helm, values, name, expected):
    env = env_of(render(helm, values))
    assert env[name] == expected
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_schedule_via_set_flag(helm):
    docs = render(helm, None, "--set", "schedule=*/5 * * * * ?", "--set", "xidIgnore={13,31}")
    env = env_of(docs)
    assert env["OMATICAYA_SCHEDULE"] == "*/5 * * * * ?"
    assert env["OMATICAYA_XID_IGNORE"] == "13,31"


def test_every_rendered_omaticaya_env_is_a_setting(helm):
    fields = set(Settings.model_fields)
    env = env_of(render(helm, ALL_ON))
    rendered = {k.removeprefix("OMATICAYA_").lower() for k in env if k.startswith("OMATICAYA_")}
    assert rendered <= fields, f"not settings: {sorted(rendered - fields)}"
    assert all(isinstance(v, str) for k, v in env.items() if k.startswith("OMATICAYA_"))


def test_every_setting_has_a_chart_value(helm):
    values = chart_values()
    env = env_of(render(helm))
    for field in Settings.model_fields:
        if field in NOT_IN_CHART:
            continue
        path = NESTED_VALUE.get(field, camel(field))
        node: Any = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, (
                f"values.yaml lacks {path} (Settings.{field})"
            )
            node = node[part]
        assert f"OMATICAYA_{field.upper()}" in env, (
            f"chart does not render OMATICAYA_{field.upper()}"
        )
    assert set(NOT_IN_CHART) <= set(Settings.model_fields), "NOT_IN_CHART names a gone setting"


def test_chart_defaults_parse_into_the_code_defaults(helm, monkeypatch, tmp_path):
    """The defaults the chart renders load, and equal Settings' defaults (logJson, jitterS and
    podResourcesSocket aside)."""
    loaded = as_plain(chart_settings(env_of(render(helm)), monkeypatch, tmp_path))
    defaults = code_defaults()
    assert loaded.pop("log_json") is True  # JSON logs in the cluster
    defaults.pop("log_json")
    # a fleet's first ticks and writes spread, within the schedule period
    jitter_s = loaded.pop("jitter_s")
    assert loaded["schedule"] == "@every 10s" and 0 < jitter_s < 10
    assert jitter_s == 5
    defaults.pop("jitter_s")
    assert loaded.pop("node_name") == "gpu-node-1"
    defaults.pop("node_name")
    # the chart mounts no host path by default: pod attribution is turned on with a value
    assert loaded.pop("pod_resources_socket") is None
    defaults.pop("pod_resources_socket")
    assert loaded == defaults


def test_chart_values_parse_in_settings(helm, monkeypatch, tmp_path):
    """Non-default values survive the trip values -> env -> Settings."""
    values = {
        "schedule": "*/5 * * * * ?",
        "prefix": "gpu.example.com/",
        "memoryStepMib": 2048,
        "utilizationStepPct": 5,
        "temperatureStepC": 3,
        "hysteresisPct": 0,
        "idleUtilizationPct": 2.5,
        "perGpuLabels": False,
        "temperatureLabels": True,
        "cleanupOnExit": False,
        "logJson": False,
        "logLevel": "DEBUG",
        "xidIgnore": [79, 13],
        "xidAllFatal": True,
        "xidQuietS": 30,
        "heartbeatS": 60.5,
        "metricsPort": 0,
        "failOnInitError": True,
        "kubeTimeoutS": 3,
    }
    s = chart_settings(env_of(render(helm, values)), monkeypatch, tmp_path)
    assert s.schedule.text == "*/5 * * * * ?"
    assert s.prefix == "gpu.example.com"
    assert (s.memory_step_mib, s.utilization_step_pct, s.idle_utilization_pct) == (2048, 5, 2.5)
    assert (s.per_gpu_labels, s.cleanup_on_exit, s.log_json) == (False, False, False)
    assert s.temperature_labels is True
    assert s.log_level == "DEBUG" and s.xid_ignore == frozenset({13, 79}) and s.xid_all_fatal
    assert (s.xid_quiet_s, s.heartbeat_s, s.metrics_port, s.kube_timeout_s) == (30, 60.5, 0, 3)
    assert s.fail_on_init_error is True
    assert (s.temperature_step_c, s.hysteresis_pct) == (3, 0)


# --------------------------------------------------------------------------------------------
# the DaemonSet: placement, security, probes
# --------------------------------------------------------------------------------------------


def test_security_context(helm):
    docs = render(helm)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = agent_container(docs)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    # a writable /tmp on a read-only root filesystem, and no host paths
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert "emptyDir" in pod["volumes"][0]


def test_device_plugin_runs_as_root_and_keeps_the_rest_of_the_lockdown(helm):
    """The kubelet's device-plugins folder is root's: the plugin runs as uid 0, nothing else
    of the security context is loosened, and the manifest still validates."""
    docs = render(helm, {"devicePlugin": True})
    sc = agent_container(docs)["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (0, 0, False)
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and "privileged" not in sc
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"} in agent_container(
        docs
    )["volumeMounts"]
    assert any(v.get("hostPath", {}).get("path") == "/var/lib/kubelet/device-plugins" for v in pod["volumes"])
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_daemonset_defaults(helm):
    docs = render(helm)
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = agent_container(docs)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == "0.1.0"
    assert c["image"] == f"ghcr.io/omaticaya/omaticaya:{chart['appVersion']}"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert "runtimeClassName" not in pod and "priorityClassName" not in pod
    assert pod["terminationGracePeriodSeconds"] == 30
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    assert c["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "100m", "memory": "128Mi"},
    }
    assert c["ports"] == [{"name": "metrics", "containerPort": 9402, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["periodSeconds"] >= c["readinessProbe"]["periodSeconds"]
    # no GPU is requested: the agent must not take one from the device plugin
    assert "nvidia.com/gpu" not in str(c["resources"])
    # selector labels are a subset of the pod labels
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_daemonset_options(helm):
    docs = render(
        helm,
        ALL_ON
        | {
            "image": {
                "repository": "registry.example/omaticaya",
                "tag": "dev",
                "pullPolicy": "Always",
            }
        },
    )
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    meta = one(docs, "DaemonSet")["spec"]["template"]["metadata"]
    c = agent_container(docs)
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["affinity"] == ALL_ON["affinity"]
    assert meta["annotations"] == {"example.com/a": "b"}
    assert meta["labels"]["team"] == "gpu"
    assert c["image"] == "registry.example/omaticaya:dev" and c["imagePullPolicy"] == "Always"


def test_metrics_port_zero_drops_ports_and_probes(helm):
    docs = render(helm, {"metricsPort": 0, "service": {"enabled": True}})
    c = agent_container(docs)
    assert "ports" not in c and "livenessProbe" not in c and "readinessProbe" not in c
    assert not [d for d in docs if d["kind"] in ("Service", "ServiceMonitor", "PodMonitor")]


def test_names_follow_overrides(helm):
    docs = render(helm, {"fullnameOverride": "gpu-labeller"})
    assert {d["metadata"]["name"] for d in docs} == {
        "gpu-labeller",
        "gpu-labeller-events",
        "gpu-labeller-node-writes",
        "gpu-labeller-lease-writes",
    }
    docs = render(helm, {"nameOverride": "gpu"})
    assert one(docs, "DaemonSet")["metadata"]["name"] == f"{RELEASE}-gpu"


# --------------------------------------------------------------------------------------------
# optional features: Service, monitors, admission policy
# --------------------------------------------------------------------------------------------


def test_service_and_monitors_select_the_agent(helm):
    docs = render(helm, ALL_ON)
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    svc = one(docs, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9402, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert svc["spec"]["selector"].items() <= pod_labels.items()

    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (ep,) = sm["spec"]["endpoints"]
    assert (ep["port"], ep["path"], ep["scrapeTimeout"]) == ("metrics", "/metrics", "10s")

    pm = one(docs, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert (ep["port"], ep["path"]) == ("metrics", "/metrics")
    assert ep["relabelings"] == [{"action": "labeldrop", "regex": "pod"}]


def test_service_monitor_alone_creates_the_service(helm):
    docs = render(helm, {"serviceMonitor": {"enabled": True}})
    assert {d["kind"] for d in docs} >= {"Service", "ServiceMonitor"}
    assert "PodMonitor" not in {d["kind"] for d in docs}


def vap_docs(
    helm, values: dict | None = None, which: str = "node-writes"
) -> tuple[dict, dict]:
    """The policy and binding named ``<fullname>-<which>`` (node-writes or lease-writes)."""
    docs = render(helm, {"validatingAdmissionPolicy": {"enabled": True}} | (values or {}))

    def named(kind: str) -> dict:
        (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(which)]
        return doc

    return named("ValidatingAdmissionPolicy"), named("ValidatingAdmissionPolicyBinding")


def test_admission_policy_shape(helm):
    policy, binding = vap_docs(helm)
    spec = policy["spec"]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{RELEASE}'"
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["prefix"] == "'omaticaya.io/'"
    text = "\n".join(v.get("expression", "") for v in spec["variables"] + spec["validations"])
    assert "'authentication.kubernetes.io/node-name' in request.userInfo.extra" in text
    assert "object.spec == oldObject.spec" in text


def test_admission_policy_follows_prefix_and_service_account(helm):
    policy, _ = vap_docs(helm, {"prefix": "gpu.example.com/", "serviceAccount": {"name": "agent"}})
    spec = policy["spec"]
    assert {v["name"]: v["expression"] for v in spec["variables"]}["prefix"] == "'gpu.example.com/'"
    assert f"system:serviceaccount:{NAMESPACE}:agent'" in spec["matchConditions"][0]["expression"]


class _Vap:
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
        data = {"object": new, "oldObject": old, "request": {"userInfo": info}}
        if not all(self._eval(c["expression"], data) is True for c in self.spec["matchConditions"]):
            return None
        out = []
        for v in self.spec["validations"]:
            if self._eval(v["expression"], data) is not True:
                out.append(v.get("message") or self._eval(v["messageExpression"], data))
        return out


def _node(labels=None, annotations=None, name="gpu-1", spec=None, finalizers=None) -> dict:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec or {}}


CLAIM = {"authentication.kubernetes.io/node-name": ["gpu-1"]}
P = "omaticaya.io/"
CEL_CASES = [
    # (id, old, new, extra, denied-by: None = allowed, else a word of the message)
    ("add-own-label", _node({"a": "1"}), _node({"a": "1", P + "gpu.count": "8"}), CLAIM, None),
    ("labels-map-missing-before", _node(), _node({P + "gpu.count": "8"}), CLAIM, None),
    ("remove-own-label-map-gone", _node({P + "x": "1"}), _node(), CLAIM, None),
    (
        "change-own-annotation",
        _node(annotations={P + "telemetry": "{}"}),
        _node(annotations={P + "telemetry": '{"a":1}'}),
        CLAIM,
        None,
    ),
    ("change-foreign-label", _node({"a": "1"}), _node({"a": "2"}), CLAIM, "labels"),
    ("add-foreign-label", _node({"a": "1"}), _node({"a": "1", "b": "2"}), CLAIM, "labels"),
    (
        "remove-foreign-label",
        _node({"a": "1", P + "x": "1"}),
        _node({P + "x": "1"}),
        CLAIM,
        "labels",
    ),
    ("remove-all-labels", _node({"a": "1"}), _node(), CLAIM, "labels"),
    ("lookalike-prefix", _node({}), _node({"omaticaya.io.evil.com/x": "1"}), CLAIM, "labels"),
    ("prefix-without-slash", _node({}), _node({"omaticaya.io": "1"}), CLAIM, "labels"),
    (
        "foreign-annotation",
        _node(annotations={"x": "1"}),
        _node(annotations={}),
        CLAIM,
        "annotations",
    ),
    ("spec-change", _node(), _node(spec={"unschedulable": True}), CLAIM, "spec"),
    ("finalizer-added", _node(), _node(finalizers=["example.com/x"]), CLAIM, "finalizers"),
    (
        "other-node",
        _node(name="gpu-2"),
        _node({P + "x": "1"}, name="gpu-2"),
        CLAIM,
        "may not change node gpu-2",
    ),
    ("no-extra", _node(), _node({P + "x": "1"}), None, "claim"),
    ("claim-missing", _node(), _node({P + "x": "1"}), {"other": ["gpu-1"]}, "claim"),
    (
        "claim-empty",
        _node(),
        _node({P + "x": "1"}),
        {"authentication.kubernetes.io/node-name": []},
        "claim",
    ),
]


@pytest.fixture(scope="module")
def vap(helm) -> _Vap:
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    policy, _ = vap_docs(helm)
    return _Vap(policy)


@pytest.mark.parametrize(
    ("old", "new", "extra", "denied"), [c[1:] for c in CEL_CASES], ids=[c[0] for c in CEL_CASES]
)
def test_admission_policy_cel(vap, old, new, extra, denied):
    agent = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    got = vap.denials(old, new, agent, extra)
    if denied is None:
        assert got == []
    else:
        assert len(got) == 1 and denied in got[0], got


def test_admission_policy_ignores_other_users(vap):
    assert vap.denials(_node({"a": "1"}), _node({"a": "2"}), "system:node:gpu-1", CLAIM) is None
    other_sa = f"system:serviceaccount:{NAMESPACE}:other"
    assert vap.denials(_node({"a": "1"}), _node({"a": "2"}), other_sa, CLAIM) is None


def test_admission_policy_claim_optional(helm):
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    policy, _ = vap_docs(
        helm, {"validatingAdmissionPolicy": {"enabled": True, "requireNodeClaim": False}}
    )
    agent = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    v = _Vap(policy)
    assert v.denials(_node(), _node({P + "x": "1"}), agent, None) == []
    assert v.denials(_node(name="gpu-2"), _node({P + "x": "1"}, name="gpu-2"), agent, CLAIM) != []


# --------------------------------------------------------------------------------------------
# NOTES.txt
# --------------------------------------------------------------------------------------------


def test_notes_show_how_to_see_the_labels(helm):
    proc = run_helm(
        helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"
    )
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl get nodes -L omaticaya.io/gpu.health,omaticaya.io/gpu.memory.free-mib" in notes
    assert (
        r"kubectl get node $NODE -o jsonpath='{.metadata.annotations.omaticaya\.io/telemetry}'"
        in notes
    )


# --------------------------------------------------------------------------------------------
# .env.example
# --------------------------------------------------------------------------------------------

_ENV_LINE = re.compile(r"^(?P<off>#\s*)?(?P<key>NODE_NAME|OMATICAYA_[A-Z0-9_]+)=(?P<value>.*)$")


def env_example() -> dict[str, tuple[str, bool, str]]:
    """key -> (value, commented out, the comment line above)."""
    lines = ENV_EXAMPLE.read_text().splitlines()
    out: dict[str, tuple[str, bool, str]] = {}
    for i, line in enumerate(lines):
        m = _ENV_LINE.match(line)
        if not m:
            continue
        assert m["key"] not in out, f"{m['key']} twice in .env.example"
        above = lines[i - 1] if i else ""
        out[m["key"]] = (m["value"], bool(m["off"]), above)
    return out


def env_name(field: str) -> str:
    return "NODE_NAME" if field == "node_name" else f"OMATICAYA_{field.upper()}"


EXTENDER_ENV = "OMATICAYA_EXTENDER_"


def _setting_of(key: str) -> Any:
    """The pydantic field behind a .env.example key (agent or extender settings)."""
    from omaticaya_py.scheduler import ExtenderSettings

    if key.startswith(EXTENDER_ENV):
        return ExtenderSettings.model_fields[key.removeprefix(EXTENDER_ENV).lower()]
    field = "node_name" if key == "NODE_NAME" else key.removeprefix("OMATICAYA_").lower()
    return Settings.model_fields[field]


def test_env_example_lists_every_setting_with_a_comment():
    from omaticaya_py.scheduler import ExtenderSettings

    entries = env_example()
    expected = {env_name(f) for f in Settings.model_fields} | {
        f"{EXTENDER_ENV}{f.upper()}" for f in ExtenderSettings.model_fields
    }
    assert set(entries) == expected, (
        f"missing: {sorted(expected - set(entries))}, unknown: {sorted(set(entries) - expected)}"
    )
    for key, (_value, off, above) in entries.items():
        assert (
            above.startswith("#") and not _ENV_LINE.match(above) and len(above.strip("# ")) > 10
        ), f"{key} needs a one-line comment above it"
        # settings without a default are shown commented out: an empty value is not "unset"
        assert off == (_setting_of(key).default is None), key


def test_env_example_defaults_are_the_code_defaults(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith("OMATICAYA_") or key == "NODE_NAME":
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no .env
    for key, (value, off, _) in env_example().items():
        if not off:
            monkeypatch.setenv(key, value)
    assert as_plain(load_settings()) == code_defaults()
    from omaticaya_py.scheduler import ExtenderSettings, load_extender_settings

    assert load_extender_settings() == ExtenderSettings(_env_file=None)  # type: ignore[call-arg]


# --------------------------------------------------------------------------------------------
# docs/chart.md and values.schema.json cover every value
# --------------------------------------------------------------------------------------------

#: Values whose children are chart options (documented one by one), not Kubernetes objects.
STRUCTURED = (
    "image",
    "serviceAccount",
    "rbac",
    "service",
    "serviceMonitor",
    "podMonitor",
    "grafanaDashboard",
    "prometheusRule",
    "validatingAdmissionPolicy",
    "sharing",
)


def test_docs_table_lists_every_value():
    docs = (REPO / "docs" / "chart.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", docs, re.MULTILINE))
    values = chart_values()
    expected = set()
    for key, value in values.items():
        if key in STRUCTURED:
            expected |= {f"{key}.{child}" for child in value}
        elif key in ("livenessProbe", "readinessProbe"):
            expected.add(f"{key}.enabled")
        else:
            expected.add(key)
    assert expected <= documented, f"not in docs/chart.md: {sorted(expected - documented)}"
    assert documented <= expected, f"documented but not values: {sorted(documented - expected)}"


def test_schema_describes_every_value():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    for key, value in chart_values().items():
        assert key in props, f"values.schema.json lacks {key}"
        if key in STRUCTURED:
            sub = props[key]
            if "$ref" in sub:
                sub = schema["definitions"][sub["$ref"].rsplit("/", 1)[1]]
            assert sub.get("additionalProperties") is False, key
            assert set(value) <= set(sub["properties"]), key


def test_extender_gets_the_shared_resource(helm, monkeypatch, tmp_path):
    """The scheduler's extender places slices of the same resource the device plugin serves:
    ``sharing.resource`` reaches both, and the extender's rendered env loads."""
    from omaticaya_py.scheduler import load_extender_settings

    values = {"scheduler": {"enabled": True}, "sharing": {"resource": "example.com/vram"}}
    docs = render(helm, values)
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    (extender,) = [
        c for c in deploy["spec"]["template"]["spec"]["containers"]
        if any(e["name"].startswith(EXTENDER_ENV) for e in c.get("env", []))
    ]  # fmt: skip
    env = {e["name"]: e["value"] for e in extender["env"] if "value" in e}
    assert env["OMATICAYA_EXTENDER_SHARED_RESOURCE"] == "example.com/vram"
    assert env_of(docs)["OMATICAYA_SHARED_RESOURCE"] == "example.com/vram"
    for key in list(os.environ):
        if key.startswith("OMATICAYA_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        if key.startswith(EXTENDER_ENV):
            monkeypatch.setenv(key, value)
    assert load_extender_settings().shared_resource == "example.com/vram"
