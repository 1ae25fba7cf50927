"""The chart and the examples, for each Kubernetes version users run (1.20 through 1.36).

- ``helm template --kube-version X`` picks the KubeSchedulerConfiguration API version and the
  kube-scheduler image tag that cluster runs; every manifest it renders is validated strictly
  against X's OpenAPI schemas (``kubernetes-validate``; it ships 1.25 and later, so 1.20 is
  checked against the real 1.20.2 API server of the dev cluster instead: ``kubectl apply
  --dry-run=server --validate=strict``).
- Every KubeSchedulerConfiguration the chart renders or ``examples/`` ships is decoded into a
  typed model of the fields its API version has (``tests/test_kube_versions_models.py``, each model
  citing the upstream Go type it mirrors); an unknown field fails.
- The ``kubernetes`` Python client installed here talks to the real 1.20.2 server.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, NAMESPACE, NOT_CORE, RELEASE, run_helm
from tests.test_kube_versions_models import (
    MODELS,
    SERVED,
    KubeSchedulerConfigurationV1,
    KubeSchedulerConfigurationV1beta1,
    served_by,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
GROUP = "kubescheduler.config.k8s.io/"

#: The versions the README promises; the chart's Chart.yaml kubeVersion must admit all.
SUPPORTED = ["1.20", "1.25", "1.30", "1.33", "1.36"]
#: kube version -> (KubeSchedulerConfiguration apiVersion, kube-scheduler image tag) the chart picks
SCHEDULER_CASES = {
    "1.20.2": ("v1beta1", "v1.20.2"),
    "1.20": ("v1beta1", "v1.20.0"),
    "1.21.14": ("v1beta1", "v1.21.14"),
    "1.22.17": ("v1beta1", "v1.22.17"),
    "1.23.0": ("v1beta3", "v1.23.0"),
    "1.24.17": ("v1beta3", "v1.24.17"),
    "1.25.0": ("v1", "v1.25.0"),
    "1.28.15": ("v1", "v1.28.15"),
    "1.29.0": ("v1", "v1.29.0"),
    "1.30.4-eks-a737599": ("v1", "v1.30.4"),
    "1.31.1+k3s1": ("v1", "v1.31.1"),
    "1.32.2-gke.1182003": ("v1", "v1.32.2"),
    "1.33.0": ("v1", "v1.33.0"),
    "1.36.0": ("v1", "v1.36.0"),
}
#: Everything on that a cluster of that version can take (monitors are CRDs: see NOT_CORE).
ALL_ON = {
    "scheduler": {"enabled": True},
    "service": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "podMonitor": {"enabled": True},
    "devicePlugin": False,
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "regcred"}],
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
}


def render_at(helm, kube_version: str, values: dict | None = None, *, check: bool = True):
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", kube_version]
    if values:
        n = len(list(helm["home"].glob("kv-values-*.yaml")))
        f = helm["home"] / f"kv-values-{n}.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["-f", str(f)]
    return run_helm(helm, *args, check=check)


def docs_at(helm, kube_version: str, values: dict | None = None) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_at(helm, kube_version, values).stdout) if d]


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
    minor = int(kube_version.split(".")[1])
    return ALL_ON | {"validatingAdmissionPolicy": {"enabled": minor >= 30}}


def scheduler_config(docs: list[dict]) -> dict:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {})]
    return yaml.safe_load(cm["data"]["config.yaml"])


def scheduler_image(docs: list[dict]) -> str:
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    return containers["kube-scheduler"]["image"]


# ------------------------------------------------------------------ the version table itself ----


def test_served_table_matches_upstream_removals():
    """The table the chart and the models use: what each kube-scheduler minor reads."""
    assert served_by("1.20") == ["v1beta1"]
    assert served_by("1.22") == ["v1beta1", "v1beta2"]
    assert served_by("1.23") == ["v1beta2", "v1beta3"]
    assert served_by("1.25") == ["v1beta2", "v1beta3", "v1"]
    assert served_by("1.28") == ["v1beta3", "v1"]
    assert served_by("1.29") == served_by("1.36") == ["v1"]


def test_chart_helper_table_is_the_same_table():
    """_helpers.tpl carries the same ranges as tests/test_kube_versions_models.SERVED."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    ranges = dict(re.findall(r"^kubescheduler\.config\.k8s\.io/(\w+): \"([^\"]+)\"$", text, re.M))
    expect = {}
    for version, (first, removed) in SERVED.items():
        expect[version] = f">={first}.0-0" + (f" <{removed}.0-0" if removed else "")
    assert ranges == expect


def test_chart_kube_version_admits_every_supported_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.20.0-0"


# ------------------------------------------------------------ the chart's second scheduler ----


@pytest.mark.parametrize(
    ("kube", "expected"), list(SCHEDULER_CASES.items()), ids=list(SCHEDULER_CASES)
)
def test_scheduler_follows_the_cluster_version(helm, kube, expected):
    api, tag = expected
    docs = docs_at(helm, kube, {"scheduler": {"enabled": True}})
    config = scheduler_config(docs)
    assert config["apiVersion"] == GROUP + api
    assert api in served_by(kube)
    assert scheduler_image(docs) == f"registry.k8s.io/kube-scheduler:{tag}"
    MODELS[api].model_validate(config)


@pytest.mark.parametrize(
    ("kube", "values", "api", "image"),
    [
        ("1.30.0", {"image": {"tag": "v1.30.9"}}, "v1", "registry.k8s.io/kube-scheduler:v1.30.9"),
        ("1.24.0", {"configApiVersion": GROUP + "v1beta2"}, "v1beta2", None),
        ("1.22.0", {"configApiVersion": GROUP + "v1beta2"}, "v1beta2", None),
        ("1.27.3", {"configApiVersion": GROUP + "v1beta3"}, "v1beta3", None),
        (
            "1.33.1",
            {"image": {"repository": "mirror.example.com/kube-scheduler", "tag": "v1.33.1"}},
            "v1",
            "mirror.example.com/kube-scheduler:v1.33.1",
        ),
    ],
)
def test_scheduler_overrides(helm, kube, values, api, image):
    docs = docs_at(helm, kube, {"scheduler": {"enabled": True} | values})
    assert scheduler_config(docs)["apiVersion"] == GROUP + api
    if image:
        assert scheduler_image(docs) == image


@pytest.mark.parametrize(
    ("kube", "api"),
    [
        ("1.23.0", "v1beta1"),
        ("1.36.0", "v1beta1"),
        ("1.28.0", "v1beta2"),
        ("1.29.0", "v1beta3"),
        ("1.24.9", "v1"),
        ("1.20.2", "v1"),
        ("1.21.0", "v1beta2"),
    ],
)
def test_scheduler_refuses_an_api_version_the_cluster_does_not_read(helm, kube, api):
    proc = render_at(
        helm, kube, {"scheduler": {"enabled": True, "configApiVersion": GROUP + api}}, check=False
    )
    assert proc.returncode != 0
    assert f"scheduler.configApiVersion {GROUP}{api} is not read by kube-scheduler" in proc.stderr


@pytest.mark.parametrize("kube", ["1.29.9", "1.25.0", "1.20.2"])
def test_admission_policy_refused_before_1_30(helm, kube):
    proc = render_at(helm, kube, {"validatingAdmissionPolicy": {"enabled": True}}, check=False)
    assert proc.returncode != 0 and "needs Kubernetes >= 1.30" in proc.stderr


# ---------------------------------------------------- strict schemas of each version (static) ----


def _schema_versions() -> list[str]:
    kv = pytest.importorskip("kubernetes_validate")
    root = Path(kv.__file__).parent / "kubernetes-json-schema"
    return sorted(
        (p.name.split("-")[0].lstrip("v") for p in root.glob("v*-local-strict")),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )


def test_kubernetes_validate_ships_the_supported_versions_from_1_25():
    shipped = {".".join(v.split(".")[:2]) for v in _schema_versions()}
    # 1.20 is not shipped (the oldest is 1.25): it is checked on the real 1.20.2 server below
    assert {"1.25", "1.30", "1.33", "1.36"} <= shipped
    assert "1.20" not in shipped


@pytest.mark.parametrize("kube", ["1.25.0", "1.28.0", "1.30.0", "1.33.0", "1.36.0"])
def test_rendered_manifests_validate_against_that_versions_schemas(helm, kube):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = docs_at(helm, kube, all_on(kube))
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "ConfigMap", "ClusterRole"} <= kinds
    assert ("ValidatingAdmissionPolicy" in kinds) == (int(kube.split(".")[1]) >= 30)
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
        kubernetes_validate.validate(bad, "1.36.0", strict=True)


# ---------------------------------------------------------------------------- the examples ----


def example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*.yaml") if not p.is_symlink())


def scheduler_examples() -> list[Path]:
    return [p for p in example_files() if "KubeSchedulerConfiguration" in p.read_text()]


def test_every_scheduler_api_version_a_supported_cluster_needs_has_an_example():
    apis = {yaml.safe_load(p.read_text())["apiVersion"] for p in scheduler_examples()}
    for minor in range(20, 37):
        assert {GROUP + v for v in served_by(f"1.{minor}")} & apis, f"no example for 1.{minor}"


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


def test_examples_agree_apart_from_the_api_version():
    configs = [yaml.safe_load(p.read_text()) for p in scheduler_examples()]
    assert len(configs) >= 3
    for c in configs:
        c.pop("apiVersion")
    assert all(c == configs[0] for c in configs)


@pytest.mark.parametrize("kube", ["1.20.2", "1.23.0", "1.36.0"])
def test_chart_extender_stanza_is_the_examples(helm, kube):
    config = scheduler_config(docs_at(helm, kube, {"scheduler": {"enabled": True}}))
    (example,) = [
        yaml.safe_load(p.read_text())
        for p in scheduler_examples()
        if yaml.safe_load(p.read_text())["apiVersion"] == config["apiVersion"]
    ]
    if int(kube.split(".")[1]) < 22:  # preemption "auto" is off there (issue 31)
        (extender,) = example["extenders"]
        del extender["preemptVerb"]
        example["profiles"][0]["plugins"] = PREEMPTION_OFF_PLUGINS
    assert config["extenders"] == example["extenders"]
    assert config["profiles"] == example["profiles"]


@pytest.mark.parametrize(
    ("kube", "values", "on"),
    [
        # "auto": kube-scheduler 1.22+ only (1.20/1.21 before kubernetes#102971's fix panic)
        ("1.20.2", {}, False),
        ("1.21.14", {}, False),
        ("1.22.0", {}, True),
        ("1.36.0", {}, True),
        # the scheduler image's own version decides when the tag names one
        ("1.20.2", {"image": {"tag": "v1.22.17"}}, True),
        ("1.30.0", {"image": {"tag": "v1.21.3"}}, False),
        ("1.30.0", {"image": {"tag": "custom-build"}}, True),  # not a version: the cluster's
        # chosen outright
        ("1.20.2", {"preemption": "on"}, True),
        ("1.36.0", {"preemption": "off"}, False),
    ],
)  # fmt: skip
def test_preemption_is_off_where_kube_scheduler_would_crash(helm, kube, values, on):
    docs = docs_at(helm, kube, {"scheduler": {"enabled": True, **values}})
    config = scheduler_config(docs)
    (extender,) = config["extenders"]
    (profile,) = config["profiles"]
    assert ("preemptVerb" in extender) is on
    assert profile.get("plugins") == (None if on else PREEMPTION_OFF_PLUGINS)
    notes = render_notes(helm, kube, {"scheduler": {"enabled": True, **values}})
    assert ("Preemption is on" if on else "Preemption is off") in notes


@pytest.mark.parametrize(
    "config",
    [
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "healthzBindAddress": ""},
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "extenders": [{"urlPrefix": "x", "filterVerbs": "f"}]},
        {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "leaderElection": {"leaderElection": True}},
        {"apiVersion": GROUP + "v1beta1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "plugins": {"multiPoint": {}}}]},
        {"apiVersion": GROUP + "v1beta1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "percentageOfNodesToScore": 5}]},
    ],
    ids=["v1-healthzBindAddress", "misspelt-extender-field", "misspelt-leader-election", "v1beta1-multiPoint", "v1beta1-profile-percentage"],
)  # fmt: skip
def test_scheduler_models_refuse_fields_their_version_lacks(config):
    from pydantic import ValidationError

    model = MODELS[config["apiVersion"].removeprefix(GROUP)]
    with pytest.raises(ValidationError):
        model.model_validate(config)


@pytest.mark.parametrize(
    ("model", "config", "read", "expected"),
    [
        (KubeSchedulerConfigurationV1beta1, {"apiVersion": GROUP + "v1beta1", "kind": "KubeSchedulerConfiguration", "healthzBindAddress": "0.0.0.0:10251"}, lambda c: c.healthzBindAddress, "0.0.0.0:10251"),
        (KubeSchedulerConfigurationV1, {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "plugins": {"multiPoint": {"enabled": [{"name": "A"}]}}}]}, lambda c: c.profiles[0].plugins.multiPoint.enabled[0].name, "A"),
        (KubeSchedulerConfigurationV1, {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x", "percentageOfNodesToScore": 5}]}, lambda c: c.profiles[0].percentageOfNodesToScore, 5),
        (KubeSchedulerConfigurationV1, {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "extenders": [{"urlPrefix": "https://x", "tlsConfig": {"insecure": True}, "managedResources": [{"name": "a/b", "ignoredByScheduler": True}]}]}, lambda c: (c.extenders[0].tlsConfig.insecure, c.extenders[0].managedResources[0].ignoredByScheduler), (True, True)),
        (KubeSchedulerConfigurationV1, {"apiVersion": GROUP + "v1", "kind": "KubeSchedulerConfiguration", "leaderElection": {"leaderElect": True}}, lambda c: c.leaderElection.leaderElect, True),
    ],
    ids=["v1beta1-healthzBindAddress", "v1-multiPoint", "v1-profile-percentage", "v1-extender-tls-and-resources", "v1-leader-election"],
)  # fmt: skip
def test_scheduler_models_take_their_versions_fields(model, config, read, expected):
    """Each field a version has is read, as that field, with its value (the counterparts of the
    refused documents above: the same fields, in the version that has them)."""
    assert MODELS[config["apiVersion"].removeprefix(GROUP)] is model
    parsed = model.model_validate(config)
    assert read(parsed) == expected
    # nothing dropped, renamed or added: the document the model read is the one it writes
    assert parsed.model_dump(exclude_unset=True) == config


# --------------------------------------------------------------- the real 1.20.2 API server ----


def _kubectl(dev_cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    from tests.tools import ToolUnavailable, kubectl_path

    try:
        path = kubectl_path()
    except ToolUnavailable as exc:
        pytest.skip(f"kubectl unavailable: {exc}")
    return subprocess.run(
        [str(path), "--kubeconfig", str(dev_cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.cluster
def test_chart_at_1_20_is_accepted_by_the_real_1_20_server(helm, dev_cluster):
    """kubectl validates strictly against the server's own OpenAPI (1.20 has no server-side
    field validation, so kubectl does it client side) and the server admits it (dry run)."""
    docs = [d for d in docs_at(helm, "1.20.2", all_on("1.20.2")) if d["kind"] not in NOT_CORE]
    assert {"DaemonSet", "Deployment", "ConfigMap"} <= {d["kind"] for d in docs}
    ns = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    made = _kubectl(dev_cluster, "apply", "-f", "-", stdin=ns)
    assert made.returncode == 0, made.stderr
    stream = "\n---\n".join(yaml.safe_dump(d) for d in docs)
    proc = _kubectl(
        dev_cluster, "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=stream
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs), proc.stdout
    # and the same check refuses a field 1.20 does not have
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
    assert proc.returncode != 0 and "typo" in proc.stderr


@pytest.mark.cluster
def test_installed_kubernetes_client_talks_to_the_real_1_20_server(dev_cluster):
    from importlib.metadata import version

    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(dev_cluster.kubeconfig))
    try:
        info = client.VersionApi(api_client).get_code()
        assert (info.major, info.minor, info.git_version) == ("1", "20", "v1.20.2")
        core = client.CoreV1Api(api_client)
        assert core.list_namespace().items  # typed models deserialize 1.20's objects
        assert client.CoordinationV1Api(api_client).list_namespaced_lease("kube-system") is not None
    finally:
        api_client.close()
    print(f"kubernetes client {version('kubernetes')} against kube-apiserver {info.git_version}")


def test_models_cover_every_version_the_chart_can_render():
    assert set(MODELS) == set(SERVED)


def _v1beta1_example() -> dict:
    return yaml.safe_load((EXAMPLES / "scheduler" / "scheduler-config-v1beta1.yaml").read_text())


def _chart_at_1_20(helm) -> dict:
    return scheduler_config(docs_at(helm, "1.20.2", {"scheduler": {"enabled": True}}))


def _misspelt(config: dict) -> dict:
    config["extenders"][0]["ignorabel"] = config["extenders"][0].pop("ignorable")
    return config


#: (config builder, expected error or None): decoded by the real kube-scheduler v1.20.2
SCHEDULER_1_20_CASES = {
    "chart-at-1.20": (_chart_at_1_20, None),
    "example-v1beta1": (lambda h: _v1beta1_example(), None),
    "chart-at-1.36-is-refused": (
        lambda h: scheduler_config(docs_at(h, "1.36.0", {"scheduler": {"enabled": True}})),
        'no kind "KubeSchedulerConfiguration" is registered for version '
        '"kubescheduler.config.k8s.io/v1"',
    ),
    "misspelt-field-is-refused": (
        lambda h: _misspelt(_chart_at_1_20(h)),
        "found unknown field: ignorabel",
    ),
}


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(SCHEDULER_1_20_CASES))
def test_real_kube_scheduler_1_20_reads_the_config(helm, dev_cluster, tmp_path, case):
    """kube-scheduler v1.20.2 decodes the configuration strictly and writes the defaulted
    result (``--write-config-to``, then exits): no API server contact, no waiting."""
    from tests.devcluster import scheduler_binary

    binary = scheduler_binary()
    if not binary.exists():
        pytest.skip("kube-scheduler not built: scripts/dev-cluster build --scheduler")
    build, error = SCHEDULER_1_20_CASES[case]
    config = build(helm)
    config["clientConnection"] = {"kubeconfig": str(dev_cluster.kubeconfig)}
    path, out = tmp_path / "config.yaml", tmp_path / "written.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [str(binary), "--config", str(path), "--write-config-to", str(out)]
        + ["--port", "0", "--secure-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if error is None:
        assert proc.returncode == 0, proc.stderr[-2000:]
        written = yaml.safe_load(out.read_text())
        assert written["apiVersion"] == GROUP + "v1beta1"
        assert [p["schedulerName"] for p in written["profiles"]] == ["omaticaya-scheduler"]
        (ext,) = written["extenders"]
        assert ext["nodeCacheCapable"] is True and ext["filterVerb"] == "filter"
    else:
        assert proc.returncode != 0 and error in proc.stderr, proc.stderr[-2000:]


def test_installed_kubernetes_client_satisfies_the_pin():
    """The client the cluster test above talks to 1.20.2 with is the one pyproject allows."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "kubernetes"]
    assert req.specifier.contains(version("kubernetes")), (str(req), version("kubernetes"))


@pytest.mark.parametrize("kube", ["1.20.2", "1.25.0", "1.30.0", "1.33.0", "1.36.0"])
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
    behind a generic name (the 1.20 tests read scheduler-config-v1beta1.yaml by that name)."""
    configs = sorted(p.name for p in (EXAMPLES / "scheduler").glob("scheduler-config*.yaml"))
    assert configs == [
        "scheduler-config-v1.yaml",
        "scheduler-config-v1beta1.yaml",
        "scheduler-config-v1beta3.yaml",
    ]
