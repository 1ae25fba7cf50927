"""The chart and the examples, for each Kubernetes version the product supports (1.31 through
1.37; Chart.yaml's ``kubeVersion: ">=1.31.0-0"`` refuses anything older).

- ``helm template --kube-version X`` picks the kube-scheduler image tag that cluster runs and the
  KubeSchedulerConfiguration API version it reads (``v1``, the only one from 1.29 on); every
  manifest it renders is validated strictly against X's OpenAPI schemas (``kubernetes-validate``,
  which ships 1.25 to 1.37); a version below 1.31 is refused with helm's kubeVersion message.
- Every KubeSchedulerConfiguration the chart renders or ``examples/`` ships is decoded into a
  typed model of the fields its API version has (``tests/project/test_kube_versions_models.py``, citing
  the upstream Go types it mirrors); an unknown field fails.
- Against the real server of the release under test (``devtools.devcluster.cluster.K8S_VERSION``:
  v1.37.2 by default, v1.31.0 in the oldest-release lane, ``OMATICAYA_KUBERNETES_VERSION``): the
  chart rendered for that version is accepted by ``kubectl apply --dry-run=server
  --validate=strict`` (the release's own kubectl), the release's kube-scheduler decodes the
  chart's configuration and the example strictly (``--write-config-to``), and the ``kubernetes``
  Python client installed here talks to that server.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, NAMESPACE, NOT_CORE, RELEASE, run_helm
from tests.project.kube_versions_models_support import (
    MODELS,
    SERVED,
    KubeSchedulerConfigurationV1,
    served_by,
)
from tests.project.kube_versions_support import (  # the names moved out, for this file's tests
    SUPPORTED,  # noqa: F401
    docs_at,  # noqa: F401
    render_at,  # noqa: F401
    under_test,  # noqa: F401
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GROUP = "kubescheduler.config.k8s.io/"

#: The oldest supported release: Chart.yaml's kubeVersion floor.
OLDEST = "1.31.0"
#: kube version -> kube-scheduler image tag the chart picks (the configuration is v1 for all)
SCHEDULER_CASES = {
    "1.31.0": "v1.31.0",
    "1.31": "v1.31.0",  # helm template --kube-version 1.31: no patch
    "1.31.0-eks-a737599": "v1.31.0",  # a pre-release-looking vendor suffix on the floor itself
    "1.31.1+k3s1": "v1.31.1",
    "1.32.2-gke.1182003": "v1.32.2",
    "1.33.4-eks-a737599": "v1.33.4",
    "1.34.0": "v1.34.0",
    "1.35.1": "v1.35.1",
    "1.36.0": "v1.36.0",
    "1.37.2": "v1.37.2",
    "v1.37.0": "v1.37.0",
}
#: Everything on that a supported cluster can take (monitors are CRDs: see NOT_CORE).
ALL_ON = {
    "scheduler": {"enabled": True},
    "service": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "podMonitor": {"enabled": True},
    "devicePlugin": False,
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "regcred"}],
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "validatingAdmissionPolicy": {"enabled": True},
}








def render_notes(helm, kube_version: str, values: dict | None = None) -> str:
    """NOTES.txt as ``helm install`` would print it against a cluster of ``kube_version``:
    helm renders NOTES only on install, which takes no --kube-version, so a copy of the chart
    holds it as an ordinary template that ``helm template --kube-version`` can show."""
    import shutil

    copy = helm["home"] / f"notes-chart-{kube_version}"
    if not copy.exists():
        shutil.copytree(CHART, copy)
        notes = (CHART / "templates" / "NOTES.txt").read_text()
        (copy / "templates" / "notes-copy.yaml").write_text(
            '{{- define "copied.notes" }}' + notes + "{{- end }}\n"
            'notes: {{ include "copied.notes" . | toJson }}\n'
        )
    args = ["template", RELEASE, str(copy), "--namespace", NAMESPACE,
            "--kube-version", kube_version, "--show-only", "templates/notes-copy.yaml"]
    if values:
        f = helm["home"] / f"notes-values-{len(list(helm['home'].glob('notes-values-*')))}.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["-f", str(f)]
    return " ".join(yaml.safe_load(run_helm(helm, *args).stdout)["notes"].split())


#: the scheduler profile's plugins when preemption is off (the chart's, as the examples write it)
PREEMPTION_OFF_PLUGINS = {"postFilter": {"disabled": [{"name": "*"}]}}


def all_on(kube_version: str) -> dict:
    """ALL_ON (the same for every supported version: nothing is version-gated any more)."""
    return dict(ALL_ON)


def scheduler_config(docs: list[dict]) -> dict:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})]
    return yaml.safe_load(cm["data"]["config.yaml"])


def scheduler_image(docs: list[dict]) -> str:
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    return containers["kube-scheduler"]["image"]


# ------------------------------------------------------------------ the version table itself ----


def test_served_table_matches_upstream_removals():
    """The table the models use: what each kube-scheduler minor reads. From 1.29 on, v1 only:
    so every supported kube-scheduler (1.31 and later) reads v1, and nothing else."""
    assert served_by("1.22") == ["v1beta1", "v1beta2"]
    assert served_by("1.25") == ["v1beta2", "v1beta3", "v1"]
    assert served_by("1.28") == ["v1beta3", "v1"]
    assert served_by("1.29") == ["v1"]
    for minor in SUPPORTED:
        assert served_by(minor) == ["v1"], minor


def test_chart_helper_picks_v1_and_names_no_older_version():
    """_helpers.tpl renders v1 and keeps no table of the versions older clusters read."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    assert "schedulerConfigRanges" not in text
    assert not re.search(r"^kubescheduler\.config\.k8s\.io/v1beta", text, re.M)
    assert '$v1 := "kubescheduler.config.k8s.io/v1"' in text


def test_chart_kube_version_admits_every_supported_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.31.0-0"
    assert min(SUPPORTED, key=lambda v: int(v.split(".")[1])) + ".0" == OLDEST


@pytest.mark.parametrize("kube", SUPPORTED)
def test_chart_renders_at_every_supported_version(helm, kube):
    assert render_at(helm, kube).returncode == 0


@pytest.mark.parametrize("kube", ["1.30.0", "1.30.14-eks-a737599", "1.29.9", "1.25.0", "1.20.2"])
def test_chart_refuses_a_version_below_1_31(helm, kube):
    """helm checks Chart.yaml's kubeVersion before it renders anything: no template runs."""
    proc = render_at(helm, kube, {"scheduler": {"enabled": True}}, check=False)
    assert proc.returncode != 0
    assert (
        f"chart requires kubeVersion: >=1.31.0-0 which is incompatible with Kubernetes v{kube}"
        in proc.stderr
    ), proc.stderr


# ------------------------------------------------------------ the chart's second scheduler ----


@pytest.mark.parametrize(("kube", "tag"), list(SCHEDULER_CASES.items()), ids=list(SCHEDULER_CASES))
def test_scheduler_follows_the_cluster_version(helm, kube, tag):
    docs = docs_at(helm, kube, {"scheduler": {"enabled": True}})
    config = scheduler_config(docs)
    assert config["apiVersion"] == GROUP + "v1"
    assert "v1" in served_by(kube)
    assert scheduler_image(docs) == f"registry.k8s.io/kube-scheduler:{tag}"
    MODELS["v1"].model_validate(config)


@pytest.mark.parametrize(
    ("kube", "values", "image"),
    [
        ("1.31.0", {"image": {"tag": "v1.31.9"}}, "registry.k8s.io/kube-scheduler:v1.31.9"),
        ("1.37.2", {"configApiVersion": GROUP + "v1"}, None),  # naming v1 outright
        ("1.31.0", {"configApiVersion": ""}, None),
        (
            "1.33.1",
            {"image": {"repository": "mirror.example.com/kube-scheduler", "tag": "v1.33.1"}},
            "mirror.example.com/kube-scheduler:v1.33.1",
        ),
    ],
)
def test_scheduler_overrides(helm, kube, values, image):
    docs = docs_at(helm, kube, {"scheduler": {"enabled": True} | values})
    assert scheduler_config(docs)["apiVersion"] == GROUP + "v1"
    if image:
        assert scheduler_image(docs) == image


@pytest.mark.parametrize(
    ("kube", "api"),
    [
        ("1.31.0", "v1beta1"),
        ("1.31.0", "v1beta2"),
        ("1.31.0", "v1beta3"),
        ("1.37.2", "v1beta3"),
    ],
)
def test_scheduler_refuses_an_api_version_no_supported_cluster_reads(helm, kube, api):
    """values.schema.json still takes the beta versions (a values file written for an older
    chart), so that the render fails with the chart's own message, naming what to do."""
    assert api not in served_by(kube)
    proc = render_at(
        helm, kube, {"scheduler": {"enabled": True, "configApiVersion": GROUP + api}}, check=False
    )
    assert proc.returncode != 0
    said = f"scheduler.configApiVersion {GROUP}{api} is not read by kube-scheduler v{kube}"
    assert said in proc.stderr, proc.stderr
    assert "1.31 and later" in proc.stderr and "leave it empty" in proc.stderr


@pytest.mark.parametrize("kube", SUPPORTED)
@pytest.mark.parametrize(("enabled", "on"), [("auto", True), (True, True), (False, False)])
def test_admission_policy_at_every_supported_version(helm, kube, enabled, on):
    """On by default everywhere the chart installs (ValidatingAdmissionPolicy v1 is 1.30's);
    ``auto`` off against a live cluster that turned the API off: test_chart_least_privilege.py."""
    docs = docs_at(helm, kube, {"validatingAdmissionPolicy": {"enabled": enabled}})
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ValidatingAdmissionPolicy") == (2 if on else 0)
    assert kinds.count("ValidatingAdmissionPolicyBinding") == (2 if on else 0)


# ---------------------------------------------------- strict schemas of each version (static) ----


def _schema_versions() -> list[str]:
    kv = pytest.importorskip("kubernetes_validate")
    root = Path(kv.__file__).parent / "kubernetes-json-schema"
    return sorted(
        (p.name.split("-")[0].lstrip("v") for p in root.glob("v*-local-strict")),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )


def test_kubernetes_validate_ships_every_supported_version():
    shipped = {".".join(v.split(".")[:2]) for v in _schema_versions()}
    assert set(SUPPORTED) <= shipped, sorted(set(SUPPORTED) - shipped)


@pytest.mark.parametrize("kube", [f"{minor}.0" for minor in SUPPORTED])
def test_rendered_manifests_validate_against_that_versions_schemas(helm, kube):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = docs_at(helm, kube, all_on(kube))
    kinds = {d["kind"] for d in docs}
    want = {"DaemonSet", "Deployment", "ConfigMap", "ClusterRole", "ValidatingAdmissionPolicy"}
    assert want <= kinds
    for doc in docs:
        if doc["kind"] in NOT_CORE:
            continue
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{kube} {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


def test_strict_validation_can_fail():
    """The check above is not vacuous: a field unknown to the schema fails."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    bad = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "typo": 1},
        "data": {},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, OLDEST, strict=True)


# ---------------------------------------------------------------------------- the examples ----


def example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*.yaml") if not p.is_symlink())


def scheduler_examples() -> list[Path]:
    return [p for p in example_files() if "KubeSchedulerConfiguration" in p.read_text()]


def test_every_scheduler_api_version_a_supported_cluster_needs_has_an_example():
    apis = {yaml.safe_load(p.read_text())["apiVersion"] for p in scheduler_examples()}
    for minor in SUPPORTED:
        assert {GROUP + v for v in served_by(minor)} & apis, f"no example for {minor}"


def test_no_example_only_an_unsupported_kube_scheduler_reads():
    """Every scheduler example is read by every supported kube-scheduler (the v1beta1 and
    v1beta3 ones, for 1.19-1.22 and 1.23-1.28, went with Kubernetes 1.20's support)."""
    for path in scheduler_examples():
        version = yaml.safe_load(path.read_text())["apiVersion"].removeprefix(GROUP)
        for minor in SUPPORTED:
            assert version in served_by(minor), (path.name, minor)


@pytest.mark.parametrize("path", scheduler_examples(), ids=lambda p: p.name)
def test_scheduler_example_decodes_into_its_versions_model_and_says_which_versions(path):
    text = path.read_text()
    config = yaml.safe_load(text)
    version = config["apiVersion"].removeprefix(GROUP)
    MODELS[version].model_validate(config)
    assert path.name == f"scheduler-config-{version}.yaml"
    first, removed = SERVED[version]
    header = text.split("\napiVersion:")[0]
    said = re.search(r"# For kube-scheduler (1\.\d+)(?: and 1\.(\d+)|-1\.(\d+)| and later)", header)
    assert said, f"{path.name} does not say which kube-scheduler versions it is for"
    assert said.group(1) == first
    last = said.group(2) or said.group(3)
    if last:  # the named last version must still read it
        assert version in served_by(f"1.{last}")
    else:
        assert removed is None


@pytest.mark.parametrize("kube", ["1.31.0", "1.34.0", "1.37.2"])
def test_chart_extender_stanza_is_the_examples(helm, kube):
    config = scheduler_config(docs_at(helm, kube, {"scheduler": {"enabled": True}}))
    (example,) = [
        yaml.safe_load(p.read_text())
        for p in scheduler_examples()
        if yaml.safe_load(p.read_text())["apiVersion"] == config["apiVersion"]
    ]
    assert config["extenders"] == example["extenders"]
    assert config["profiles"] == example["profiles"]


@pytest.mark.parametrize(
    ("kube", "values", "on"),
    [
        # "auto": on at every supported version (it was off below kube-scheduler 1.22, whose
        # 1.20/1.21 releases before kubernetes#102971's fix panic: no longer installable)
        ("1.31.0", {}, True),
        ("1.37.2", {}, True),
        ("1.31.0", {"preemption": "auto"}, True),
        # the scheduler image's tag no longer decides
        ("1.31.0", {"image": {"tag": "v1.31.9"}}, True),
        ("1.33.0", {"image": {"tag": "custom-build"}}, True),
        # chosen outright
        ("1.31.0", {"preemption": "on"}, True),
        ("1.31.0", {"preemption": "off"}, False),
        ("1.37.2", {"preemption": "off"}, False),
    ],
)  # fmt: skip
def test_preemption_follows_the_value(helm, kube, values, on):
    docs = docs_at(helm, kube, {"scheduler": {"enabled": True, **values}})
    config = scheduler_config(docs)
    (extender,) = config["extenders"]
    (profile,) = config["profiles"]
    assert ("preemptVerb" in extender) is on
    assert profile.get("plugins") == (None if on else PREEMPTION_OFF_PLUGINS)
    notes = render_notes(helm, kube, {"scheduler": {"enabled": True, **values}})
    assert ("Preemption is on" if on else "Preemption is off") in notes
    assert "102971" not in notes


@pytest.mark.parametrize(
    "config",
    [
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "healthzBindAddress": ""},
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "metricsBindAddress": "0.0.0.0:10251"},
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "extenders": [{"urlPrefix": "x", "filterVerbs": "f"}]},
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "leaderElection": {"leaderElection": True}},
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "plugins": {"postFilters": {}}}]},
        {"apiVersion": GROUP + "v1beta3", "kind": "KubeSchedulerConfiguration"},
    ],
    ids=["v1-healthzBindAddress", "v1-metricsBindAddress", "misspelt-extender-field", "misspelt-leader-election", "misspelt-plugin-point", "v1beta3-apiVersion"],
)  # fmt: skip
def test_scheduler_model_refuses_what_v1_lacks(config):
    """v1beta1/v1beta2's bind addresses, misspelt fields, and another apiVersion."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        KubeSchedulerConfigurationV1.model_validate(config)


@pytest.mark.parametrize(
    ("config", "read", "expected"),
    [
        ({"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "plugins": {"multiPoint": {"enabled": [{"name": "A"}]}}}]}, lambda c: c.profiles[0].plugins.multiPoint.enabled[0].name, "A"),
        ({"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "plugins": {"podGroupPostFilter": {"disabled": [{"name": "*"}]}}}]}, lambda c: c.profiles[0].plugins.podGroupPostFilter.disabled[0].name, "*"),
        ({"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "percentageOfNodesToScore": 5}]}, lambda c: c.profiles[0].percentageOfNodesToScore, 5),
        ({"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "extenders": [{"urlPrefix": "https://x", "tlsConfig": {"insecure": True}, "managedResources": [{"name": "a/b", "ignoredByScheduler": True}]}]}, lambda c: (c.extenders[0].tlsConfig.insecure, c.extenders[0].managedResources[0].ignoredByScheduler), (True, True)),
        ({"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "leaderElection": {"leaderElect": True}}, lambda c: c.leaderElection.leaderElect, True),
        ({"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "delayCacheUntilActive": True}, lambda c: c.delayCacheUntilActive, True),
    ],
    ids=["v1-multiPoint", "v1-podGroupPostFilter", "v1-profile-percentage", "v1-extender-tls-and-resources", "v1-leader-election", "v1-delayCacheUntilActive"],
)  # fmt: skip
def test_scheduler_model_takes_v1s_fields(config, read, expected):
    """Each field v1 has is read, as that field, with its value (the counterparts of the refused
    documents above)."""
    assert MODELS[config["apiVersion"].removeprefix(GROUP)] is KubeSchedulerConfigurationV1
    parsed = KubeSchedulerConfigurationV1.model_validate(config)
    assert read(parsed) == expected
    # nothing dropped, renamed or added: the document the model read is the one it writes
    assert parsed.model_dump(exclude_unset=True) == config


# ------------------------------------------- the real server of the release under test ----


def _kubectl(dev_cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The release's own kubectl (``<cache>/k8s-<release>/bin/kubectl``) as admin."""
    from devtools.devcluster.cluster import bin_dir

    path = bin_dir() / "kubectl"
    if not path.exists():
        pytest.skip(f"{path} not built: scripts/dev-cluster build")
    return subprocess.run(
        [str(path), "--kubeconfig", str(dev_cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.cluster
def test_chart_is_accepted_by_the_real_server(helm, dev_cluster):
    """The chart rendered for the release under test, everything on: the server validates each
    object strictly (server-side field validation, ``--validate=strict``) and admits it (dry
    run); the same check refuses a field the server does not know."""
    kube = under_test()
    version = json.loads(_kubectl(dev_cluster, "version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v" + kube, version
    assert version["clientVersion"]["gitVersion"] == "v" + kube, version
    docs = [d for d in docs_at(helm, kube, all_on(kube)) if d["kind"] not in NOT_CORE]
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "ConfigMap", "ValidatingAdmissionPolicy"} <= kinds
    ns = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    made = _kubectl(dev_cluster, "apply", "-f", "-", stdin=ns)
    assert made.returncode == 0, made.stderr
    stream = "\n---\n".join(yaml.safe_dump(d) for d in docs)
    proc = _kubectl(
        dev_cluster, "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=stream
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs), proc.stdout
    # and the same check refuses a field the server does not have
    bad = yaml.safe_load(stream.split("\n---\n")[0])
    bad["metadata"]["typo"] = "x"
    proc = _kubectl(
        dev_cluster,
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        stdin=json.dumps(bad),
    )
    assert proc.returncode != 0 and "typo" in proc.stderr, proc.stderr


@pytest.mark.cluster
def test_installed_kubernetes_client_talks_to_the_real_server(dev_cluster):
    from importlib.metadata import version

    from kubernetes import client, config

    from devtools.devcluster.cluster import K8S_VERSION, minor

    api_client = config.new_client_from_config(config_file=str(dev_cluster.kubeconfig))
    try:
        info = client.VersionApi(api_client).get_code()
        assert (info.major, info.minor, info.git_version) == ("1", str(minor()), K8S_VERSION)
        core = client.CoreV1Api(api_client)
        assert core.list_namespace().items  # typed models deserialize the server's objects
        assert core.list_node() is not None
        assert client.CoordinationV1Api(api_client).list_namespaced_lease("kube-system") is not None
        admission = client.AdmissionregistrationV1Api(api_client)
        assert admission.list_validating_admission_policy() is not None
    finally:
        api_client.close()
    print(f"kubernetes client {version('kubernetes')} against kube-apiserver {info.git_version}")


def test_models_cover_every_version_the_chart_can_render():
    assert set(MODELS) == {v for minor in SUPPORTED for v in served_by(minor)} == {"v1"}


def _v1_example() -> dict:
    return yaml.safe_load((EXAMPLES / "scheduler" / "scheduler-config-v1.yaml").read_text())


def _chart_config(helm, **values) -> dict:
    return scheduler_config(docs_at(helm, under_test(), {"scheduler": {"enabled": True, **values}}))


def _misspelt(config: dict) -> dict:
    config["extenders"][0]["ignorabel"] = config["extenders"][0].pop("ignorable")
    return config


def _as_v1beta3(config: dict) -> dict:
    return config | {"apiVersion": GROUP + "v1beta3"}


#: (config builder, expected error or None): decoded by the real kube-scheduler under test
REAL_SCHEDULER_CASES = {
    "chart": (_chart_config, None),
    "chart-preemption-off": (lambda h: _chart_config(h, preemption="off"), None),
    "chart-at-the-oldest": (
        lambda h: scheduler_config(docs_at(h, OLDEST, {"scheduler": {"enabled": True}})),
        None,
    ),
    "example-v1": (lambda h: _v1_example(), None),
    "v1beta3-is-refused": (
        lambda h: _as_v1beta3(_chart_config(h)),
        'no kind "KubeSchedulerConfiguration" is registered for version '
        '"kubescheduler.config.k8s.io/v1beta3"',
    ),
    "misspelt-field-is-refused": (
        lambda h: _misspelt(_chart_config(h)),
        'unknown field "extenders[0].ignorabel"',
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(REAL_SCHEDULER_CASES))
def test_real_kube_scheduler_reads_the_config(helm, dev_cluster, tmp_path, case):
    """The release's kube-scheduler decodes the configuration strictly and writes the defaulted
    result (``--write-config-to``, then exits): no scheduling, no waiting."""
    from tests.devcluster import scheduler_binary

    binary = scheduler_binary()
    if not binary.exists():
        pytest.skip("kube-scheduler not built: scripts/dev-cluster build --scheduler")
    build, error = REAL_SCHEDULER_CASES[case]
    config = build(helm)
    config["clientConnection"] = {"kubeconfig": str(dev_cluster.kubeconfig)}
    path, out = tmp_path / "config.yaml", tmp_path / "written.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [str(binary), "--config", str(path), "--write-config-to", str(out)]
        + ["--secure-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if error is None:
        assert proc.returncode == 0, proc.stderr[-2000:]
        written = yaml.safe_load(out.read_text())
        assert written["apiVersion"] == GROUP + "v1"
        assert [p["schedulerName"] for p in written["profiles"]] == ["omaticaya-scheduler"]
        (ext,) = written["extenders"]
        assert ext["nodeCacheCapable"] is True and ext["filterVerb"] == "filter"
        assert ("preemptVerb" in ext) is (case != "chart-preemption-off")
    else:  # klog's structured line quotes the error: \" for "
        assert proc.returncode != 0, proc.stderr[-2000:]
        assert error in proc.stderr.replace('\\"', '"'), proc.stderr[-2000:]


def test_installed_kubernetes_client_satisfies_the_pin():
    """The client the cluster test above talks to the server with is the one pyproject allows."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "kubernetes"]
    assert req.specifier.contains(version("kubernetes")), (str(req), version("kubernetes"))


@pytest.mark.parametrize("kube", [f"{minor}.0" for minor in SUPPORTED])
def test_helm_lint_strict_at_each_version(helm, kube):
    values = helm["home"] / f"lint-{kube}.yaml"
    values.write_text(yaml.safe_dump(all_on(kube)))
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", kube, "-f", str(values))
    assert "0 chart(s) failed" in proc.stdout


def test_defaults_name_no_scheduler_api_version_or_tag():
    """The defaults follow the cluster: nothing that a newer Kubernetes could have removed."""
    scheduler = yaml.safe_load((CHART / "values.yaml").read_text())["scheduler"]
    assert scheduler["configApiVersion"] == "" and scheduler["image"]["tag"] == ""


def test_no_example_without_its_api_version_in_the_name():
    """Every scheduler configuration example names its API version; none hides a removed one
    behind a generic name. v1 is the only one a supported kube-scheduler reads."""
    configs = sorted(p.name for p in (EXAMPLES / "scheduler").glob("scheduler-config*.yaml"))
    assert configs == ["scheduler-config-v1.yaml"]
