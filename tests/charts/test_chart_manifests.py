"""The chart's rendered manifests: ``helm lint --strict``, the Kubernetes 1.31 schemas
(``kubernetes-validate``, strict), RBAC, the DaemonSet, the optional Service and monitors, and
NOTES.txt. Helpers: tests/chart.py.
"""

from __future__ import annotations

import os

import pytest
import yaml

from tests.chart import (
    ALL_ON,
    CHART,
    K8S_VERSION,
    NAMESPACE,
    NOT_CORE,
    RELEASE,
    agent_container,
    agent_daemonset,
    env_of,
    one,
    render,
    run_helm,
    template,
    values_args,
)

# --------------------------------------------------------------------------------------------
# lint and schema validation of the rendered manifests
# --------------------------------------------------------------------------------------------


#: ALL_ON with MPS enforcement: the MPS supervisor's DaemonSet, its Service, the monitors of both
MPS_ON = {**ALL_ON, "devicePlugin": True, "sharing": {"gpus": "0-1"}}


@pytest.mark.parametrize("values", [None, ALL_ON, MPS_ON], ids=["default", "all-on", "mps-on"])
def test_helm_lint_strict(helm, values):
    proc = run_helm(helm, "lint", "--strict", str(CHART), *values_args(helm, values), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


#: on by default at K8S_VERSION (1.31), as at every supported version: validatingAdmissionPolicy.enabled "auto"
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
    "mps-on": (
        MPS_ON,
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


def test_vap_needs_kubernetes_1_30_and_the_chart_needs_1_31(helm):
    """The policies need 1.30 (admissionregistration.k8s.io/v1); the chart installs from 1.31 on
    only, so a cluster without them is refused before any template runs."""
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
    assert "chart requires kubeVersion: >=1.31.0-0" in proc.stderr
    docs = render(helm, {"validatingAdmissionPolicy": {"enabled": True}}, "--kube-version", "1.31.0")
    assert VAP <= {d["kind"] for d in docs}


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
    # Events: a Role in "default" (tests/charts/test_chart_least_privilege.py), not cluster-wide
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
# optional features: Service, monitors (the admission policy: tests/charts/test_chart_admission.py)
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


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions In) selects ``labels``."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def test_monitors_scrape_the_mps_supervisor_where_it_runs(helm):
    """With the MPS supervisor (its DaemonSet <fullname>-mps), its port is scraped too
    (OmaticayaMpsDaemonDown needs omaticaya_mps_daemon_up): its own headless Service, which the
    ServiceMonitor selects beside the agent's, and the PodMonitor selects its pods beside the
    agent's; with enforcement off, only the agent's."""
    values = {**ALL_ON, "devicePlugin": True, "sharing": {"gpus": "0-1"}}
    docs = render(helm, values)
    mps_ds = next(d for d in docs if d["kind"] == "DaemonSet" and d is not agent_daemonset(docs))
    (c,) = mps_ds["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"mps-metrics": 9403}
    agent_pod = agent_daemonset(docs)["spec"]["template"]["metadata"]["labels"]
    mps_pod = mps_ds["spec"]["template"]["metadata"]["labels"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(services) == {f"{RELEASE}-metrics", f"{RELEASE}-mps-metrics"}
    svc, mps_svc = services[f"{RELEASE}-metrics"], services[f"{RELEASE}-mps-metrics"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("metrics", 9402, "metrics")]  # fmt: skip
    assert [(p["name"], p["port"], p["targetPort"]) for p in mps_svc["spec"]["ports"]] == [
        ("mps-metrics", 9403, "mps-metrics")]  # fmt: skip
    assert mps_svc["spec"]["clusterIP"] == "None"
    # each Service selects its own DaemonSet's pods only
    assert svc["spec"]["selector"].items() <= agent_pod.items()
    assert not svc["spec"]["selector"].items() <= mps_pod.items()
    assert mps_svc["spec"]["selector"].items() <= mps_pod.items()
    assert not mps_svc["spec"]["selector"].items() <= agent_pod.items()
    sm, pm = one(docs, "ServiceMonitor"), one(docs, "PodMonitor")
    for s in (svc, mps_svc):  # the ServiceMonitor selects both Services
        assert _selects(sm["spec"]["selector"], s["metadata"]["labels"]), s["metadata"]["name"]
    for labels in (agent_pod, mps_pod):  # the PodMonitor both DaemonSets' pods
        assert _selects(pm["spec"]["selector"], labels), labels
    # not the uninstall hook's pods
    hook_pod = {**agent_pod, "app.kubernetes.io/name": "omaticaya-uninstall"}
    assert not _selects(pm["spec"]["selector"], hook_pod)
    for endpoints in (sm["spec"]["endpoints"], pm["spec"]["podMetricsEndpoints"]):
        assert [(e["port"], e["path"]) for e in endpoints] == [
            ("metrics", "/metrics"), ("mps-metrics", "/metrics"),
        ]
        assert endpoints[0].get("relabelings") == endpoints[1].get("relabelings")
    off = render(helm, {**values, "sharing": {"gpus": "0-1", "enforcement": "none"}})
    assert [e["port"] for e in one(off, "PodMonitor")["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert [p["name"] for p in one(off, "Service")["spec"]["ports"]] == ["metrics"]
    assert one(off, "PodMonitor")["spec"]["selector"] == {"matchLabels": svc["spec"]["selector"]}


#: ALL_ON with the second scheduler: its extender's metrics port, Service and monitor endpoints
SCHEDULER_ON = {**ALL_ON, "scheduler": {"enabled": True}}


def _load_extender_env(env: dict[str, str], monkeypatch, tmp_path):
    """``ExtenderSettings`` loaded from a rendered container's ``OMATICAYA_*`` variables alone
    (no other variable, no ``.env``)."""
    from omaticaya_py.scheduler.settings import load_extender_settings

    for key in [k for k in os.environ if k.startswith("OMATICAYA_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        if key.startswith("OMATICAYA_"):
            monkeypatch.setenv(key, value)
    return load_extender_settings()


def _scheduler_pod_labels(docs: list[dict]) -> dict:
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    return deploy["spec"]["template"]["metadata"]["labels"]


def test_monitors_scrape_the_extender_on_its_own_port(helm, monkeypatch, tmp_path):
    """With the scheduler, its extender serves /metrics alone on the pod's IP (container port
    ext-metrics, 9404) while its verbs stay on 127.0.0.1:port; its own headless Service, which
    the ServiceMonitor selects beside the agent's, and the PodMonitor selects the scheduler's
    pods beside the agent's. The rendered env loads into those settings."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(helm, SCHEDULER_ON)
    c = _extender_container(docs)
    assert c["ports"] == [{"name": "ext-metrics", "containerPort": 9404, "protocol": "TCP"}]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    s = _load_extender_env(env, monkeypatch, tmp_path)
    assert (s.address, s.port, s.scrape_address, s.scrape_port) == ("127.0.0.1", 8888, "0.0.0.0", 9404)
    agent_pod = agent_daemonset(docs)["spec"]["template"]["metadata"]["labels"]
    sched_pod = _scheduler_pod_labels(docs)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(services) == {f"{RELEASE}-metrics", f"{RELEASE}-extender-metrics"}
    svc, ext_svc = services[f"{RELEASE}-metrics"], services[f"{RELEASE}-extender-metrics"]
    for doc in (ext_svc, one(docs, "Deployment")):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert [(p["name"], p["port"], p["targetPort"]) for p in ext_svc["spec"]["ports"]] == [
        ("ext-metrics", 9404, "ext-metrics")]  # fmt: skip
    assert ext_svc["spec"]["clusterIP"] == "None"
    # each Service selects its own pods only
    assert ext_svc["spec"]["selector"].items() <= sched_pod.items()
    assert not ext_svc["spec"]["selector"].items() <= agent_pod.items()
    assert not svc["spec"]["selector"].items() <= sched_pod.items()
    sm, pm = one(docs, "ServiceMonitor"), one(docs, "PodMonitor")
    for service in (svc, ext_svc):
        assert _selects(sm["spec"]["selector"], service["metadata"]["labels"]), service["metadata"]["name"]
    for labels in (agent_pod, sched_pod):
        assert _selects(pm["spec"]["selector"], labels), labels
    assert not _selects(pm["spec"]["selector"], {**agent_pod, "app.kubernetes.io/name": "omaticaya-uninstall"})
    for endpoints in (sm["spec"]["endpoints"], pm["spec"]["podMetricsEndpoints"]):
        assert [(e["port"], e["path"]) for e in endpoints] == [
            ("metrics", "/metrics"), ("ext-metrics", "/metrics")]  # fmt: skip
        assert endpoints[0].get("relabelings") == endpoints[1].get("relabelings")
        assert endpoints[0].get("scrapeTimeout") == endpoints[1].get("scrapeTimeout")


def test_monitors_scrape_the_agent_the_mps_supervisor_and_the_extender_together(helm):
    docs = render(helm, {**MPS_ON, "scheduler": {"enabled": True}})
    pm, sm = one(docs, "PodMonitor"), one(docs, "ServiceMonitor")
    for endpoints in (sm["spec"]["endpoints"], pm["spec"]["podMetricsEndpoints"]):
        assert [e["port"] for e in endpoints] == ["metrics", "mps-metrics", "ext-metrics"]
    mps_pod = next(d for d in docs if d["kind"] == "DaemonSet" and d is not agent_daemonset(docs))
    pods = (agent_daemonset(docs)["spec"]["template"]["metadata"]["labels"],
            mps_pod["spec"]["template"]["metadata"]["labels"], _scheduler_pod_labels(docs))  # fmt: skip
    for labels in pods:
        assert _selects(pm["spec"]["selector"], labels), labels
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(services) == 3
    for service in services:
        assert _selects(sm["spec"]["selector"], service["metadata"]["labels"])
    proc = run_helm(helm, "lint", "--strict", str(CHART),
                    *values_args(helm, {**MPS_ON, "scheduler": {"enabled": True}}), check=False)  # fmt: skip
    assert proc.returncode == 0 and "[WARNING]" not in proc.stdout, proc.stdout + proc.stderr


def test_extender_metrics_port_zero_keeps_its_metrics_on_the_loopback(helm, monkeypatch, tmp_path):
    """scheduler.extender.metricsPort 0: no container port, no Service, no monitor endpoint; the
    PodMonitor selects the agent's pods alone, as without the scheduler."""
    docs = render(helm, {**ALL_ON, "scheduler": {"enabled": True, "extender": {"metricsPort": 0}}})
    c = _extender_container(docs)
    assert "ports" not in c
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert _load_extender_env(env, monkeypatch, tmp_path).scrape_port == 0
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == [f"{RELEASE}-metrics"]
    pm, sm = one(docs, "PodMonitor"), one(docs, "ServiceMonitor")
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]
    assert pm["spec"]["selector"] == {"matchLabels": one(docs, "Service")["spec"]["selector"]}
    assert not _selects(pm["spec"]["selector"], _scheduler_pod_labels(docs))


@pytest.mark.parametrize(("values", "says"), [
    ({"metricsPort": 8888}, "scheduler.extender.metricsPort 8888 is also scheduler.extender.port"),
    ({"port": 9404}, "scheduler.extender.metricsPort 9404 is also scheduler.extender.port"),
    ({"metricsPort": -1}, "metricsPort"),
    ({"metricsPort": 65536}, "metricsPort"),
], ids=["same-as-port", "port-on-metrics-port", "negative", "too-large"])  # fmt: skip
def test_a_bad_extender_metrics_port_fails_the_render_and_lint(helm, values, says):
    """The extender exits on a metrics port equal to its own (OMATICAYA_EXTENDER_SCRAPE_PORT
    must differ): the render and helm lint refuse it first, saying which values."""
    bad = {"scheduler": {"enabled": True, "extender": values}}
    proc = template(helm, bad, check=False)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    lint = run_helm(helm, "lint", "--strict", str(CHART), *values_args(helm, bad), check=False)
    assert lint.returncode != 0 and says in lint.stdout + lint.stderr, lint.stdout + lint.stderr


def test_service_monitor_alone_creates_the_service(helm):
    docs = render(helm, {"serviceMonitor": {"enabled": True}})
    assert {d["kind"] for d in docs} >= {"Service", "ServiceMonitor"}
    assert "PodMonitor" not in {d["kind"] for d in docs}



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


@pytest.mark.parametrize(("extra", "said"), [
    ((), "The agent reads the kubelet's PodResources (/var/lib/kubelet/pod-resources/kubelet.sock)"),
    (("--set", "podResourcesSocket=off"), "podResourcesSocket is off: the extender cannot see"),
])  # fmt: skip
def test_notes_say_what_the_device_plugin_turns_on(helm, extra, said):
    """With devicePlugin the chart turns the PodResources reading on, and says so (issue 30)."""
    proc = run_helm(
        helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
        "-f", str(CHART.parent.parent / "examples" / "install" / "whole-stack.yaml"), *extra,
    )  # fmt: skip
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "omaticaya.io/gpu-memory units of 1024 MiB" in notes
    assert said in " ".join(notes.split()), notes


# --------------------------------------------------------------------------------------------
# what the chart promises for a GPU Operator cluster (issue 31)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "expected"), [
    ({}, None),
    ({"devicePlugin": True}, "system-node-critical"),  # as NVIDIA's device plugin chart
    ({"devicePlugin": True, "priorityClassName": "gpu-node-agents"}, "gpu-node-agents"),
    ({"priorityClassName": "gpu-node-agents"}, "gpu-node-agents"),
])  # fmt: skip
def test_the_device_plugin_pod_is_node_critical_by_default(helm, values, expected):
    spec = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]
    assert spec.get("priorityClassName") == expected


def _extender_container(docs: list[dict]) -> dict:
    deploy = one(docs, "Deployment")
    (c,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    return c


def test_the_extender_is_probed_inside_its_container(helm):
    """It listens on 127.0.0.1 only, so the kubelet's httpGet (to the pod IP) cannot reach it:
    an exec probe GETs /readyz, which fails while the Node watch is dead or stalled."""
    c = _extender_container(render(helm, {"scheduler": {"enabled": True,
                                                        "extender": {"port": 9999}}}))
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        command = probe["exec"]["command"]
        assert command[:2] == ["python3", "-c"] and command[3] == "http://127.0.0.1:9999/readyz"
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] == 120
    off = _extender_container(render(helm, {"scheduler": {"enabled": True, "extender": {
        "livenessProbe": {"enabled": False}, "readinessProbe": {"enabled": False}}}}))
    assert "livenessProbe" not in off and "readinessProbe" not in off


def test_the_extender_probe_command_fails_on_503_and_passes_on_200(helm):
    """The rendered probe's one-liner itself, against the extender's two answers."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    status = {"code": 503}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    c = _extender_container(render(helm, {"scheduler": {"enabled": True}}))
    code = c["livenessProbe"]["exec"]["command"][2]
    url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
    try:
        assert subprocess.run([sys.executable, "-c", code, url], capture_output=True).returncode == 1
        status["code"] = 200
        assert subprocess.run([sys.executable, "-c", code, url], capture_output=True).returncode == 0
    finally:
        server.shutdown()


INSTALL = CHART.parent.parent / "examples" / "install"


@pytest.mark.parametrize("layer", ["gpu-operator.yaml", "nvidia-device-plugin.yaml"])
@pytest.mark.parametrize("goal", ["labels.yaml", "scheduler.yaml", "device-plugin.yaml",
                                  "whole-stack.yaml", "dra.yaml"])  # fmt: skip
def test_every_goal_renders_with_every_layer(helm, goal, layer):
    """docs/install.md's files, as it passes them (goal, then layer): they pass the values
    schema and render what the page says; the operator layer is installed on the dev cluster
    by tests/project/test_product_install.py, the other selects nodes by node-feature-discovery."""
    docs = render(helm, None, "-f", str(INSTALL / goal), "-f", str(INSTALL / layer),
                  "--kube-version", "1.37.2")
    spec = agent_daemonset(docs)["spec"]["template"]["spec"]
    goals = yaml.safe_load((INSTALL / goal).read_text())
    assert ("Deployment" in {d["kind"] for d in docs}) is goals["scheduler"]["enabled"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env.get("OMATICAYA_DEVICE_PLUGIN") == str(goals["devicePlugin"]["enabled"]).lower()
    dra = goals.get("dra", {}).get("enabled", False)
    assert env.get("OMATICAYA_DRA") == str(dra).lower()
    classes = {d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"}
    assert classes == ({"gpu.omaticaya.io", "shared.gpu.omaticaya.io", "mig.gpu.omaticaya.io"}
                       if dra else set())
    if layer == "gpu-operator.yaml":
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    else:
        assert "runtimeClassName" not in spec
        assert spec["nodeSelector"] == {"feature.node.kubernetes.io/pci-10de.present": "true"}
    # shared GPUs (whole-stack.yaml): the MPS supervisor's DaemonSet runs where the agent does,
    # under the same runtime
    (mps,) = [d["spec"]["template"]["spec"] for d in docs
              if d["kind"] == "DaemonSet" and d["metadata"]["name"] == f"{RELEASE}-mps"] or [None]  # fmt: skip
    assert (mps is not None) is (goals.get("sharing", {}).get("gpus", "none") != "none")
    if mps is not None:
        for key in ("runtimeClassName", "nodeSelector", "tolerations", "affinity"):
            assert mps.get(key) == spec.get(key), key


def test_an_offline_render_says_which_kubernetes_version_it_assumed(helm):
    """``helm template`` asks no cluster and renders for its --kube-version or helm's default,
    which picks the scheduler's image, configuration and preemption: the manifest says which
    (a GitOps reviewer reads the manifest, not NOTES.txt, which template does not print)."""
    out = template(helm, None, "--kube-version", "1.33.1").stdout
    assert "# Rendered for Kubernetes v1.33.1 without asking a cluster" in out
