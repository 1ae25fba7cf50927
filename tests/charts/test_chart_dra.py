"""The chart's DRA driver (issue 41): with ``dra.enabled`` the agent is the DRA driver
``gpu.omaticaya.io`` instead of the device plugin.

Rendered by the real helm (``tests/chart.py``): the agent's OMATICAYA_DRA_* env and the host
folders it mounts (the plugin's own folder, the kubelet's registration folder, the CDI folder,
the host's /dev read-only at /host/dev), uid 0 and system-node-critical as for the device plugin,
the MPS supervisor with shared GPUs, the DeviceClasses with their exact CEL selectors and the
extended resource mapping (KEP-5004), the agent's resource.k8s.io RBAC (only what its code calls), the uninstall hook's
second Job that deletes every ResourceSlice of the driver, NOTES; the render failing with
``devicePlugin`` also on or below Kubernetes 1.34, the schema refusing bad values; strict
validation against each version's schemas, ``helm lint --strict``. Against the real 1.37
kube-apiserver (the API-server-only dev cluster, no kubelet; ``cluster`` marker): the
DeviceClasses are admitted (the server compiles their CEL) and read back unchanged, the agent's
token may do exactly what the DRA driver needs, and the hook's script, with the hook's token,
deletes every ResourceSlice of the driver and nothing else. The agent's own side:
tests/dra/test_dra_cluster.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import (
    CHART,
    NAMESPACE,
    NOT_CORE,
    RELEASE,
    agent_container,
    agent_daemonset,
    chart_settings,
    env_of,
    mps_container,
    mps_daemonset,
    one,
    render,
    run_helm,
    template,
    values_args,
)

DRIVER = "gpu.omaticaya.io"
#: DRA (resource.k8s.io/v1) is GA from 1.34; the dev cluster runs 1.37
KUBE = "1.37.0"
DRA = {"dra": {"enabled": True}}
ATTRS = f'device.attributes["{DRIVER}"]'
OURS = f'device.driver == "{DRIVER}"'
#: DeviceClass name -> its one CEL selector (the attributes of omaticaya_py/core/publish/dra.py)
SELECTORS = {
    DRIVER: f'{OURS} && {ATTRS}.type == "gpu" && !{ATTRS}.shared',
    f"shared.{DRIVER}": f'{OURS} && {ATTRS}.type == "gpu" && {ATTRS}.shared',
    f"mig.{DRIVER}": f'{OURS} && {ATTRS}.type == "mig"',
}
#: what the agent's DRA code calls (tests/charts/test_chart_rbac_code.py derives it from the code):
#: its slice by name (get, server-side apply: patch and create, delete), a claim by name
AGENT_RULES = {
    ("resource.k8s.io", "resourceslices"): ["get", "create", "patch", "delete"],
    ("resource.k8s.io", "resourceclaims"): ["get"],
}
#: what a dev cluster's kubelet and containerd use instead of the host's folders
DEV = {
    "kubeletPluginsDir": "/tmp/dev/kubelet/root/plugins",
    "kubeletRegistryDir": "/tmp/dev/kubelet/root/plugins_registry",
    "cdiDir": "/tmp/dev/cdi",
    "devRoot": "/tmp/dev/dev",
}


def dra(**more: Any) -> dict[str, Any]:
    """Values with DRA on; ``dra=`` merges into the dra block, any other key is set as is."""
    values: dict[str, Any] = {"dra": {"enabled": True, **more.pop("dra", {})}}
    return values | more


def docs_of(helm: dict[str, Any], values: dict[str, Any] | None, kube: str = KUBE) -> list[dict]:
    """The release's objects (hooks left out), rendered for ``kube``."""
    return render(helm, values, "--kube-version", kube)


def all_docs(helm: dict[str, Any], values: dict[str, Any] | None, kube: str = KUBE) -> list[dict]:
    """Every object, hooks included."""
    proc = template(helm, values, "--kube-version", kube)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def hooks(helm: dict[str, Any], values: dict[str, Any] | None) -> list[dict]:
    """The pre-delete hooks (not the ``helm test`` ones)."""
    return [
        d
        for d in all_docs(helm, values)
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"
    ]


def pod_spec(docs: list[dict]) -> dict[str, Any]:
    return agent_daemonset(docs)["spec"]["template"]["spec"]


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or []}


def volumes(docs: list[dict]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(docs)["volumes"]}


def device_classes(docs: list[dict]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}


def rules(role: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out[(group, resource)] = list(rule["verbs"])
    return out


def fails(helm: dict[str, Any], values: dict[str, Any], kube: str = KUBE) -> str:
    proc = template(helm, values, "--kube-version", kube, check=False)
    assert proc.returncode != 0, f"helm template accepted {values}"
    return proc.stderr


# --------------------------------------------------------------------------------------------
# off by default
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kube", ["1.31.0", KUBE])
def test_default_renders_nothing_of_dra(helm, kube):
    docs = [  # the helm test's hooks left out
        d
        for d in all_docs(helm, None, kube)
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") != "test"
    ]
    assert not [d for d in docs if d["apiVersion"].startswith("resource.k8s.io/")]
    assert not [
        d
        for d in docs
        if d["kind"].startswith("Cluster")
        and "helm.sh/hook" in (d["metadata"].get("annotations") or {})
    ]
    assert [d["kind"] for d in docs if d["kind"] == "Job"] == ["Job"]  # stop-daemonset only
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert all(g != "resource.k8s.io" for g, _ in rules(role))
    assert not [v for v in volumes(docs) if v.startswith("dra-")]
    env = env_of(docs)
    assert env["OMATICAYA_DRA"] == "false"
    # the code's defaults, so that nothing differs while DRA is off
    assert env["OMATICAYA_DRA_PLUGIN_DIR"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert env["OMATICAYA_DRA_REGISTRY_DIR"] == "/var/lib/kubelet/plugins_registry"
    assert env["OMATICAYA_DRA_CDI_DIR"] == "/var/run/cdi"
    assert env["OMATICAYA_DRA_DEV_ROOT"] == "/dev"
    assert env["OMATICAYA_DRA_TAINT_EFFECT"] == "NoSchedule"
    assert agent_container(docs)["securityContext"]["runAsUser"] == 65532
    assert "priorityClassName" not in pod_spec(docs)


def test_default_values():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["dra"]
    assert values == {
        "enabled": False,
        "kubeletPluginsDir": "/var/lib/kubelet/plugins",
        "kubeletRegistryDir": "/var/lib/kubelet/plugins_registry",
        "cdiDir": "/var/run/cdi",
        "devRoot": "",  # <driverRoot>/dev: /dev with the default driverRoot /
        "taintEffect": "NoSchedule",
        "driverFiles": True,  # tests/charts/test_chart_dra_driver_files.py
        "deviceClasses": {"create": True},
        "extendedResourceName": "nvidia.com/gpu",
    }


# --------------------------------------------------------------------------------------------
# the DaemonSet with DRA on
# --------------------------------------------------------------------------------------------


def test_dra_env_mounts_and_volumes(helm):
    docs = docs_of(helm, DRA)
    agent = agent_container(docs)
    env = env_of(docs)
    assert env["OMATICAYA_DRA"] == "true"
    assert env["OMATICAYA_DEVICE_PLUGIN"] == "false"
    assert env["OMATICAYA_DRA_PLUGIN_DIR"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert env["OMATICAYA_DRA_REGISTRY_DIR"] == "/var/lib/kubelet/plugins_registry"
    assert env["OMATICAYA_DRA_CDI_DIR"] == "/var/run/cdi"
    assert env["OMATICAYA_DRA_DEV_ROOT"] == "/host/dev"
    assert env["OMATICAYA_DRA_TAINT_EFFECT"] == "NoSchedule"
    m, v = mounts(agent), volumes(docs)
    assert {
        k: (x["mountPath"], x.get("readOnly", False)) for k, x in m.items() if k.startswith("dra-")
    } == {
        "dra-plugin": (f"/var/lib/kubelet/plugins/{DRIVER}", False),
        "dra-registry": ("/var/lib/kubelet/plugins_registry", False),
        "dra-cdi": ("/var/run/cdi", False),
        "dra-dev": ("/host/dev", True),
        "dra-driver-root": ("/host/driver-root", True),  # test_chart_dra_driver_files.py
    }
    assert {k: x["mountPropagation"] for k, x in m.items() if "mountPropagation" in x} == {
        "dra-driver-root": "HostToContainer"
    }
    assert {k: x["hostPath"] for k, x in v.items() if k.startswith("dra-")} == {
        "dra-plugin": {"path": f"/var/lib/kubelet/plugins/{DRIVER}", "type": "DirectoryOrCreate"},
        "dra-registry": {"path": "/var/lib/kubelet/plugins_registry", "type": "Directory"},
        "dra-cdi": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"},
        "dra-dev": {"path": "/dev", "type": "Directory"},
        "dra-driver-root": {"path": "/", "type": "DirectoryOrCreate"},
    }
    # no device plugin folder; the kubelet's PodResources (read-only), as with the device
    # plugin: the telemetry names the pod holding each GPU, DRA devices included
    assert "device-plugins" not in v
    assert v["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert m["pod-resources"].get("readOnly") is True
    assert env["OMATICAYA_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_dra_pod_is_root_and_node_critical_as_the_device_plugin(helm):
    docs = docs_of(helm, DRA)
    sc = agent_container(docs)["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (0, 0, False)
    # nothing else loosened
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and "privileged" not in sc
    assert pod_spec(docs)["priorityClassName"] == "system-node-critical"
    assert (
        pod_spec(docs_of(helm, dra(priorityClassName="gpu-high")))["priorityClassName"]
        == "gpu-high"
    )


def test_dra_probes_and_containers_stay(helm):
    """The agent's readiness and liveness probes are the default render's; no mps container
    without shared GPUs."""
    base, on = agent_container(docs_of(helm, None)), agent_container(docs_of(helm, DRA))
    assert on["livenessProbe"] == base["livenessProbe"]
    assert on["readinessProbe"] == base["readinessProbe"]
    assert on["ports"] == base["ports"]
    assert mps_container(docs_of(helm, DRA)) is None


def test_dra_dirs_follow_the_values(helm):
    """The dev cluster's kubelet (--root-dir) and containerd (cdi_spec_dirs) folders."""
    docs = docs_of(helm, dra(dra={**DEV, "taintEffect": "NoExecute"}))
    env, m, v = env_of(docs), mounts(agent_container(docs)), volumes(docs)
    plugin = f"/tmp/dev/kubelet/root/plugins/{DRIVER}"
    assert (
        env["OMATICAYA_DRA_PLUGIN_DIR"]
        == m["dra-plugin"]["mountPath"]
        == v["dra-plugin"]["hostPath"]["path"]
        == plugin
    )
    registry = DEV["kubeletRegistryDir"]
    assert (
        env["OMATICAYA_DRA_REGISTRY_DIR"]
        == m["dra-registry"]["mountPath"]
        == v["dra-registry"]["hostPath"]["path"]
        == registry
    )
    assert (
        env["OMATICAYA_DRA_CDI_DIR"]
        == m["dra-cdi"]["mountPath"]
        == v["dra-cdi"]["hostPath"]["path"]
        == DEV["cdiDir"]
    )
    assert v["dra-dev"]["hostPath"]["path"] == DEV["devRoot"]
    assert env["OMATICAYA_DRA_DEV_ROOT"] == m["dra-dev"]["mountPath"] == "/host/tmp/dev/dev"
    assert env["OMATICAYA_DRA_TAINT_EFFECT"] == "NoExecute"


def test_dra_env_loads_into_settings(helm, monkeypatch, tmp_path):
    """The rendered env is what the agent accepts (its model refuses DRA with the plugin)."""
    s = chart_settings(env_of(docs_of(helm, dra(dra=DEV))), monkeypatch, tmp_path)
    assert s.dra is True and s.device_plugin is False
    assert s.dra_plugin_dir == Path(f"/tmp/dev/kubelet/root/plugins/{DRIVER}")
    assert s.dra_registry_dir == Path(DEV["kubeletRegistryDir"])
    assert s.dra_cdi_dir == Path(DEV["cdiDir"])
    assert s.dra_dev_root == Path("/host/tmp/dev/dev")
    assert s.dra_taint_effect == "NoSchedule"


@pytest.mark.parametrize("enforcement", ["mps", "none"])
def test_dra_with_shared_gpus_runs_the_mps_container(helm, enforcement):
    """Shared-GPU claims are MPS clients: the same MPS supervisor DaemonSet (<fullname>-mps)
    and sharing env as with the device plugin."""
    values = dra(sharing={"gpus": "0-1", "enforcement": enforcement})
    docs = docs_of(helm, values)
    env = env_of(docs)
    assert (env["OMATICAYA_SHARED_GPUS"], env["OMATICAYA_SHARE_ENFORCEMENT"]) == (
        "0-1",
        enforcement,
    )
    mps = mps_container(docs)
    if enforcement == "none":
        assert mps is None and "mps-state" not in mounts(agent_container(docs))
        return
    assert mps is not None and mps["args"] == ["mps"]
    # the agent's DRA driver writes its slices' requests there (core.allocation.mps.SliceRequest)
    assert mounts(agent_container(docs))["mps-state"] == {
        "name": "mps-state", "mountPath": "/var/lib/omaticaya/mps-state"}  # fmt: skip
    # the same DaemonSet as the device plugin's, byte for byte: switching from the device
    # plugin to DRA leaves the running daemons alone (its updateStrategy is OnDelete)
    plugin = docs_of(helm, {"devicePlugin": True, "sharing": {"gpus": "0-1"}})
    assert mps_daemonset(docs) == mps_daemonset(plugin)
    assert mps_daemonset(docs)["spec"]["updateStrategy"] == {"type": "OnDelete"}


# --------------------------------------------------------------------------------------------
# DeviceClasses
# --------------------------------------------------------------------------------------------


def test_device_classes_exact_selectors(helm):
    classes = device_classes(docs_of(helm, DRA))
    assert set(classes) == set(SELECTORS)
    for name, dc in classes.items():
        assert dc["apiVersion"] == "resource.k8s.io/v1"
        assert "namespace" not in dc["metadata"]
        assert dc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert dc["spec"]["selectors"] == [{"cel": {"expression": SELECTORS[name]}}], name
    assert classes[DRIVER]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes[f"shared.{DRIVER}"]["spec"]
    assert "extendedResourceName" not in classes[f"mig.{DRIVER}"]["spec"]


@pytest.mark.parametrize(("name", "want"), [("", None), ("example.com/gpu", "example.com/gpu")])
def test_extended_resource_name(helm, name, want):
    spec = device_classes(docs_of(helm, dra(dra={"extendedResourceName": name})))[DRIVER]["spec"]
    assert spec.get("extendedResourceName") == want


def test_device_classes_create_false(helm):
    docs = docs_of(helm, dra(dra={"deviceClasses": {"create": False}}))
    assert device_classes(docs) == {}
    assert env_of(docs)["OMATICAYA_DRA"] == "true"


# --------------------------------------------------------------------------------------------
# RBAC and the uninstall hook
# --------------------------------------------------------------------------------------------


def test_agent_rbac(helm):
    role = one(docs_of(helm, DRA), "ClusterRole")
    got = rules(role)
    assert got == {("", "nodes"): ["get", "patch"], **AGENT_RULES}
    # with sharing: the pods/events rules stay
    shared = rules(one(docs_of(helm, dra(sharing={"gpus": "all"})), "ClusterRole"))
    assert shared == {
        ("", "nodes"): ["get", "patch"],
        ("", "pods"): ["get"],
        ("", "events"): ["create"],
        **AGENT_RULES,
    }


def test_uninstall_hook_deletes_the_drivers_resourceslices(helm):
    docs = hooks(helm, DRA)
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    name = f"{RELEASE}-uninstall"
    # helm runs hooks by weight (then kind): the order is in the weights below
    assert sorted(kinds) == sorted(
        [
            ("ServiceAccount", name),
            ("Role", name),
            ("ClusterRole", name),
            ("RoleBinding", name),
            ("ClusterRoleBinding", name),
            ("Job", name),
            ("Job", f"{RELEASE}-uninstall-slices"),
        ]
    )
    weights = {
        (d["kind"], d["metadata"]["name"]): int(d["metadata"]["annotations"]["helm.sh/hook-weight"])
        for d in docs
    }
    # the slice Job after the stop-daemonset Job (the agents deleted their own first), the
    # cluster RBAC before either
    assert weights[("Job", f"{RELEASE}-uninstall-slices")] > weights[("Job", name)]
    assert (
        weights[("ClusterRole", name)]
        < weights[("ClusterRoleBinding", name)]
        < weights[("Job", name)]
    )
    for d in docs:
        ann = d["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == "pre-delete"
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert rules(by[("ClusterRole", name)]) == {
        ("resource.k8s.io", "resourceslices"): ["list", "deletecollection"]
    }
    binding = by[("ClusterRoleBinding", name)]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": name,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    job = by[("Job", f"{RELEASE}-uninstall-slices")]["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == name
    (c,) = job["containers"]
    assert "command" not in c  # the image's entrypoint: omaticaya
    assert c["args"] == ["delete-resourceslices", "--driver", DRIVER]
    assert c["securityContext"]["runAsNonRoot"] is True  # the agent's uid 0 is not the hook's
    # where the agent runs, as the stop-daemonset Job
    stop = by[("Job", name)]["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "securityContext"):
        assert job[key] == stop[key], key


@pytest.mark.parametrize("values", [{"cleanupOnUninstall": False}, {"rbac": {"create": False}}])
def test_no_hook_without_cleanup(helm, values):
    assert hooks(helm, dra(**values)) == []


def test_hook_job_name_fits_a_label(helm):
    jobs = [
        d["metadata"]["name"]
        for d in hooks(helm, dra(fullnameOverride="r" * 63))
        if d["kind"] == "Job"
    ]
    assert len(jobs) == 2 and all(len(n) <= 63 for n in jobs) and len(set(jobs)) == 2, jobs


# --------------------------------------------------------------------------------------------
# refused values
# --------------------------------------------------------------------------------------------


def test_dra_and_device_plugin_fail_the_render(helm):
    err = fails(helm, dra(devicePlugin=True))
    assert "dra.enabled and devicePlugin.enabled are both true" in err, err
    assert "set devicePlugin.enabled=false" in err


@pytest.mark.parametrize("kube", ["1.31.0", "1.33.4-eks-a737599"])
def test_dra_below_1_34_fails_the_render(helm, kube):
    err = fails(helm, DRA, kube)
    assert "dra.enabled needs resource.k8s.io/v1" in err and "Kubernetes v1.3" in err, err


@pytest.mark.parametrize("kube", ["1.34.0", "1.35.0", "1.36.0", KUBE])
def test_dra_renders_from_1_34(helm, kube):
    assert set(device_classes(docs_of(helm, DRA, kube))) == set(SELECTORS)


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_taint_effect_values(helm, effect):
    assert (
        env_of(docs_of(helm, dra(dra={"taintEffect": effect})))["OMATICAYA_DRA_TAINT_EFFECT"]
        == effect
    )


BAD = [
    ("taintEffect-evict", {"taintEffect": "Evict"}, "/dra/taintEffect"),
    ("taintEffect-lower", {"taintEffect": "noschedule"}, "/dra/taintEffect"),
    ("taintEffect-prefer", {"taintEffect": "PreferNoSchedule"}, "/dra/taintEffect"),
    ("enabled-string", {"enabled": "true"}, "/dra/enabled"),
    ("pluginsDir-relative", {"kubeletPluginsDir": "var/lib/kubelet/plugins"}, "/dra/kubeletPluginsDir"),
    ("registryDir-dotdot", {"kubeletRegistryDir": "/var/lib/../plugins_registry"}, "/dra/kubeletRegistryDir"),
    ("cdiDir-slash", {"cdiDir": "/var/run/cdi/"}, "/dra/cdiDir"),
    ("devRoot-root", {"devRoot": "/"}, "/dra/devRoot"),
    ("extendedResourceName-no-domain", {"extendedResourceName": "gpu"}, "/dra/extendedResourceName"),
    ("extendedResourceName-kubernetes-io", {"extendedResourceName": "kubernetes.io/gpu"}, "/dra/extendedResourceName"),
    ("deviceClasses-string", {"deviceClasses": {"create": "yes"}}, "/dra/deviceClasses/create"),
    ("unknown-key", {"enable": True}, "enable"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "where"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_schema_refuses_bad_dra_values(helm, values, where):
    err = fails(helm, {"dra": values})
    assert "values don't meet the specifications of the schema" in err, err
    assert where in err, err


# --------------------------------------------------------------------------------------------
# lint, strict schemas, NOTES
# --------------------------------------------------------------------------------------------

FULL = dra(
    sharing={"gpus": "0-1"},
    dra={"taintEffect": "NoExecute"},
    validatingAdmissionPolicy={"enabled": True},
    service={"enabled": True},
)


def test_helm_lint_strict(helm):
    proc = run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        KUBE,
        *values_args(helm, FULL),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("kube", ["1.34.0", "1.35.0", "1.36.0", KUBE])
def test_rendered_manifests_validate_strictly(helm, kube):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = all_docs(helm, FULL, kube)
    assert {"DeviceClass", "ClusterRole", "ClusterRoleBinding", "Job", "DaemonSet"} <= {
        d["kind"] for d in docs
    }
    for doc in docs:
        if doc["kind"] in NOT_CORE:
            continue
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{kube} {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def notes(helm: dict[str, Any], values: dict[str, Any]) -> str:
    """NOTES.txt as ``helm install`` prints it (a dry run against no cluster: helm's default
    Kubernetes version, 1.34 or later)."""
    proc = run_helm(
        helm,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        *values_args(helm, values),
    )
    return proc.stdout.split("NOTES:", 1)[1]


def test_notes(helm):
    text = notes(helm, dra(sharing={"gpus": "all"}))
    assert f"kubectl get resourceslices --field-selector spec.driver={DRIVER}" in text
    assert "kubectl get deviceclasses" in text
    assert f"deviceClassName: {DRIVER}" in text and "kind: ResourceClaim" in text
    assert f'device.attributes["{DRIVER}"].freeMemoryMiB >= 61440' in text
    assert "capacity: {requests: {memory: 20Gi}}" in text
    assert "pods asking nvidia.com/gpu get one" in text
    assert "enforced by CUDA MPS" in text
    assert "deletes every ResourceSlice" in text
    off = notes(helm, dra(cleanupOnUninstall=False, dra={"deviceClasses": {"create": False}}))
    assert f"kubectl delete resourceslices --field-selector spec.driver={DRIVER}" in off
    assert "come from another release" in off
    assert "resourceslices" not in notes(helm, {})


# --------------------------------------------------------------------------------------------
# the real 1.37 kube-apiserver (no kubelet)
# --------------------------------------------------------------------------------------------


def _slice(name: str, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"type": {"string": "gpu"}, "shared": {"bool": False}},
                }
            ],
        },
    }


def _token_client(dev_cluster, admin_client, namespace: str, sa: str):
    from kubernetes import client

    token = (
        client.CoreV1Api(admin_client)
        .create_namespaced_service_account_token(
            sa,
            namespace,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600},
            },
        )
        .status.token
    )
    cfg = client.Configuration(host=dev_cluster.server, ssl_ca_cert=str(dev_cluster.ca_file))
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg), token


def _create(admin_client, docs: list[dict]) -> None:
    from kubernetes import utils

    for doc in docs:
        try:
            utils.create_from_dict(admin_client, doc)
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise


def _wait_allowed(fn, timeout_s: float = 20.0) -> None:
    """RBAC reaches the authorizer through an informer: retry a 403 for a while."""
    import time

    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fn()
            return
        except ApiException as exc:
            if exc.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _status(fn) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        fn()
    except ApiException as exc:
        return exc.status
    return 200


@pytest.fixture
def resource_api(admin_client):
    from kubernetes import client

    api = client.ResourceV1Api(admin_client)
    yield api
    for sel in (f"spec.driver={DRIVER}", "spec.driver=other.example.com"):
        api.delete_collection_resource_slice(field_selector=sel)


@pytest.mark.cluster
def test_device_classes_on_the_real_api_server(helm, admin_client, resource_api):
    """The 1.37 API server compiles each selector's CEL at admission: the classes are created
    and read back as rendered (extendedResourceName kept: DRAExtendedResource is GA in 1.37);
    a class with a typo in its CEL is refused (the check is not vacuous)."""
    from kubernetes.client.exceptions import ApiException

    classes = device_classes(docs_of(helm, DRA))
    for name in classes:
        try:
            resource_api.delete_device_class(name)
        except ApiException as exc:
            assert exc.status == 404
    try:
        for dc in classes.values():
            resource_api.create_device_class(dc)
        for name, dc in classes.items():
            got = resource_api.read_device_class(name, _preload_content=False)
            spec = yaml.safe_load(got.data)["spec"]
            assert spec["selectors"] == dc["spec"]["selectors"], name
            assert spec.get("extendedResourceName") == dc["spec"].get("extendedResourceName"), name
        bad = {**classes[DRIVER], "metadata": {"name": "bad.gpu.omaticaya.io"}}
        bad["spec"] = {"selectors": [{"cel": {"expression": f'{OURS} && {ATTRS}.type = "gpu"'}}]}
        with pytest.raises(ApiException) as refused:
            resource_api.create_device_class(bad)
        assert refused.value.status == 422
    finally:
        for name in classes:
            try:
                resource_api.delete_device_class(name)
            except ApiException:
                pass


@pytest.mark.cluster
def test_agent_token_can_do_what_the_driver_needs(
    helm, dev_cluster, admin_client, resource_api, make_node, tmp_path
):
    """The agent's own requests (``ResourceSliceClient``: get, server-side apply that creates
    then updates, delete; the DRA plugin's GET of a claim by name) succeed with the chart's
    ClusterRole alone; what the code never calls (a list or watch of slices or claims, a PUT of
    a slice, DeviceClasses, a delete-collection, claim writes) is 403. Which rules the code needs:
    tests/charts/test_chart_rbac_code.py."""
    from kubernetes import client

    from omaticaya_py.core.publish.dra import slice_body
    from omaticaya_py.dra.plugin import _CLAIM_PATH
    from omaticaya_py.kube import ApiSession
    from omaticaya_py.kube.node_client import NodeClient
    from omaticaya_py.kube.resourceslice import ResourceSliceClient
    from tests.conftest import ensure_namespace

    ensure_namespace(client.CoreV1Api(admin_client), NAMESPACE)
    docs = [
        d
        for d in docs_of(helm, DRA)
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    _create(admin_client, docs)
    node = make_node()
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "dra-chart-claim"},
        "spec": {"devices": {}},
    }
    resource_api.create_namespaced_resource_claim(NAMESPACE, claim)
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    api_client, token = _token_client(dev_cluster, admin_client, NAMESPACE, sa)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "agent",
        "clusters": [{"name": "dev", "cluster": {"server": dev_cluster.server, "certificate-authority": str(dev_cluster.ca_file)}}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": "dev", "user": "agent"}}],
    }))  # fmt: skip
    session = ApiSession(kubeconfig=str(kubeconfig), attempts=1)
    slices = ResourceSliceClient(session, node)
    try:
        uid = NodeClient(node, session=session).get_node().uid
        device = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
        # the apply that creates the slice: patch, and create (checked when it is missing)
        _wait_allowed_kube(lambda: slices.apply(slice_body(node, uid, [device])))
        assert slices.get() is not None
        stored = slices.apply(slice_body(node, uid, [device], generation=2))  # an update
        assert stored["spec"]["pool"]["generation"] == 2
        got = session.call("get", "claim", lambda: session.http(
            "GET", _CLAIM_PATH, path_params={"namespace": NAMESPACE, "name": "dra-chart-claim"}))  # fmt: skip
        assert yaml.safe_load(got.data)["metadata"]["name"] == "dra-chart-claim"
        assert slices.delete() is True and slices.get() is None
        # nothing more: the code never lists, watches or PUTs slices, reads claims otherwise,
        # reads or writes DeviceClasses, deletes by collection or writes claims
        agent = client.ResourceV1Api(api_client)
        body = _slice("dra-chart-agent", node)
        dc = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
              "metadata": {"name": "x.example.com"}, "spec": {}}  # fmt: skip
        refused = {
            "list slices": lambda: agent.list_resource_slice(field_selector=f"spec.driver={DRIVER}"),
            "watch slices": lambda: agent.list_resource_slice(
                watch=True, timeout_seconds=1, _preload_content=False
            ),
            "put slice": lambda: agent.replace_resource_slice(body["metadata"]["name"], body),
            "list claims": lambda: agent.list_resource_claim_for_all_namespaces(),
            "list claims in a namespace": lambda: agent.list_namespaced_resource_claim(NAMESPACE),
            "get device class": lambda: agent.read_device_class(DRIVER),
            "list device classes": lambda: agent.list_device_class(),
            "create device class": lambda: agent.create_device_class(dc),
            "delete slices by collection": lambda: agent.delete_collection_resource_slice(),
            "create claim": lambda: agent.create_namespaced_resource_claim(NAMESPACE, claim),
            "delete claim": lambda: agent.delete_namespaced_resource_claim("dra-chart-claim", NAMESPACE),
        }  # fmt: skip
        statuses = {what: _status(call) for what, call in refused.items()}
        assert statuses == dict.fromkeys(refused, 403)
    finally:
        session.close()
        api_client.close()
        resource_api.delete_namespaced_resource_claim("dra-chart-claim", NAMESPACE)
        rbac = client.RbacAuthorizationV1Api(admin_client)
        name = one(docs, "ClusterRole")["metadata"]["name"]
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def _wait_allowed_kube(fn, timeout_s: float = 20.0) -> None:
    """As ``_wait_allowed``, for the agent's own clients (``KubeForbidden``)."""
    import time

    from omaticaya_py.kube import KubeForbidden

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fn()
            return
        except KubeForbidden:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.cluster
def test_hook_command_deletes_every_slice_of_the_driver_only(
    helm, dev_cluster, admin_client, resource_api, tmp_path
):
    """The hook's ServiceAccount, ClusterRole and ClusterRoleBinding as rendered; its script run
    with that token alone: every ResourceSlice of the driver goes (two nodes'), another driver's
    stays; a second run finds none and succeeds."""
    from kubernetes import client

    from tests.conftest import ensure_namespace

    ensure_namespace(client.CoreV1Api(admin_client), NAMESPACE)
    docs = [
        d
        for d in hooks(helm, DRA)
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    for d in docs:
        d["metadata"].pop("annotations")  # plain objects here, not hooks
    _create(admin_client, docs)
    for body in (_slice("dra-chart-a", "dra-node-a"), _slice("dra-chart-b", "dra-node-b"),
                 _slice("dra-chart-other", "dra-node-a", "other.example.com")):  # fmt: skip
        resource_api.create_resource_slice(body)
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    api_client, token = _token_client(dev_cluster, admin_client, NAMESPACE, sa)
    api_client.close()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hook",
        "clusters": [{"name": "dev", "cluster": {"server": dev_cluster.server, "certificate-authority": str(dev_cluster.ca_file)}}],
        "users": [{"name": "hook", "user": {"token": token}}],
        "contexts": [{"name": "hook", "context": {"cluster": "dev", "user": "hook"}}],
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env["KUBECONFIG"] = str(kubeconfig)

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "omaticaya_py", "delete-resourceslices", "--driver", DRIVER],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    try:
        import time

        deadline = time.monotonic() + 20
        while (
            (proc := run()).returncode != 0
            and "HTTP 403" in proc.stderr
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)  # the binding reaches the authorizer
        assert proc.returncode == 0, proc.stderr
        assert (
            proc.stdout.strip() == f"ResourceSlices of {DRIVER} deleted: dra-chart-a, dra-chart-b"
        )
        left = resource_api.list_resource_slice(_preload_content=False)
        names = {i["metadata"]["name"] for i in yaml.safe_load(left.data)["items"]}
        assert "dra-chart-other" in names and not {"dra-chart-a", "dra-chart-b"} & names
        again = run()
        assert (
            again.returncode == 0
            and again.stdout.strip() == f"ResourceSlices of {DRIVER} deleted: none was left"
        )
    finally:
        rbac = client.RbacAuthorizationV1Api(admin_client)
        name = one(docs, "ClusterRole")["metadata"]["name"]
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
