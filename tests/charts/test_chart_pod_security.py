"""Pod Security (issue 52, item 7): the level each install goal's pods need, as docs/install.md
("Pod Security") gives it, and the chart's check that refuses a namespace enforcing a stricter
one. Rendered by the real helm (``tests/chart.py``); no cluster (the check's ``lookup`` of the
Namespace on a real API server: tests/charts/test_pod_security_cluster.py).

- ``helm template`` renders every goal byte for byte as without the check (its template renders
  nothing; ``lookup`` returns nothing without a cluster).
- The level of each goal is worked out here from the rendered pods by an oracle of the Pod
  Security Standards' fields (``pod_security_level``: the checks of
  k8s.io/pod-security-admission/policy that the chart's values can reach) and must equal
  install.md's table, the chart's own reading (``omaticaya.podSecurityLevel``) and NOTES.
- The refusal (``omaticaya.podSecurityRefusal``), fed the labels a Namespace would have, in a
  copy of the chart: what fails, with which words, and what passes (warn and audit labels, a
  namespace without the label, one that enforces a level the pods meet).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import CHART, NAMESPACE, RELEASE, REPO, run_helm, values_args

INSTALL = REPO / "examples" / "install"
INSTALL_MD = REPO / "docs" / "install.md"
#: a release every goal renders for (DRA needs 1.34+)
KUBE = "1.37.0"
GOALS = ["labels.yaml", "scheduler.yaml", "device-plugin.yaml", "whole-stack.yaml", "dra.yaml"]
LEVELS = ["privileged", "baseline", "restricted"]
ENFORCE = "pod-security.kubernetes.io/enforce"
POD_KINDS = {"Pod", "DaemonSet", "Deployment", "Job"}

# --------------------------------------------------------------------------------------------
# the oracle: the Pod Security Standards' fields (k8s.io/pod-security-admission/policy v0.37.2)
# --------------------------------------------------------------------------------------------

#: capabilities baseline lets a container add (check_capabilities_baseline.go)
DEFAULT_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}  # fmt: skip
#: inline volume types restricted allows (check_restrictedVolumes.go)
VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def _baseline_breaks(spec: dict[str, Any]) -> list[str]:
    """What in a pod spec baseline forbids (host namespaces, hostPath, privileged, added
    capabilities, hostPort, Unconfined seccomp)."""
    out = [k for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"hostPath {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    psc = spec.get("securityContext") or {}
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("pod seccomp Unconfined")
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        out += [f"privileged {c['name']}"] if sc.get("privileged") else []
        out += [f"{c['name']} adds {cap}" for cap in (sc.get("capabilities") or {}).get("add") or []
                if cap not in DEFAULT_CAPS]  # fmt: skip
        out += [f"{c['name']} hostPort" for p in c.get("ports") or [] if p.get("hostPort")]
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{c['name']} seccomp Unconfined")
    return out


def _restricted_breaks(spec: dict[str, Any]) -> list[str]:
    """What in a pod spec restricted forbids on top of baseline."""
    psc = spec.get("securityContext") or {}
    out = [f"volume {v['name']}" for v in spec.get("volumes") or []
           if not set(v) - {"name"} <= VOLUME_TYPES and "hostPath" not in v]  # fmt: skip
    root_ok = spec.get("hostUsers") is False
    if not root_ok and psc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name} allowPrivilegeEscalation")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name} keeps capabilities")
        out += [f"{name} adds {cap}" for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name} seccomp {seccomp}")
        if not root_ok:
            if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
                out.append(f"{name} runAsNonRoot")
            if sc.get("runAsUser") == 0:
                out.append(f"{name} runAsUser 0")
    return out


def pod_security_level(docs: list[dict[str, Any]]) -> str:
    """The strictest level every pod of ``docs`` (Pods, and DaemonSets, Deployments and Jobs'
    templates, hooks included) meets."""
    specs = [d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]
             for d in docs if d["kind"] in POD_KINDS]  # fmt: skip
    if any(_baseline_breaks(s) for s in specs):
        return "privileged"
    if any(_restricted_breaks(s) for s in specs):
        return "baseline"
    return "restricted"


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------


def _files(goal: str) -> list[str]:
    """A goal as install.md installs it: the goal's file, then the GPU Operator's layer."""
    return ["-f", str(INSTALL / goal), "-f", str(INSTALL / "gpu-operator.yaml")]


def _template(helm: dict[str, Any], chart_dir: Path, goal: str, values: dict[str, Any] | None = None,
              *extra: str, check: bool = True):  # fmt: skip
    return run_helm(helm, "template", RELEASE, str(chart_dir), "--namespace", NAMESPACE,
                    "--kube-version", KUBE, *_files(goal), *values_args(helm, values), *extra,
                    check=check)  # fmt: skip


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def probe_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the chart; tests add a template ``zz-probe.yaml`` to it."""
    return Path(shutil.copytree(CHART, tmp_path_factory.mktemp("chart") / "omaticaya"))


def _probe(helm: dict[str, Any], chart_dir: Path, goal: str, body: str,
           values: dict[str, Any] | None = None, check: bool = True):  # fmt: skip
    """``helm template`` of the copy with ``body`` as its template zz-probe.yaml, that one only."""
    (chart_dir / "templates" / "zz-probe.yaml").write_text(body)
    return _template(helm, chart_dir, goal, values, "--show-only", "templates/zz-probe.yaml",
                     check=check)  # fmt: skip


def _chart_level(helm: dict[str, Any], chart_dir: Path, goal: str, values: dict[str, Any] | None = None) -> str:
    out = _probe(helm, chart_dir, goal, '# level={{ include "omaticaya.podSecurityLevel" . }}\n', values)
    return re.search(r"level=(\w+)", out.stdout).group(1)  # type: ignore[union-attr]


def _install_md_levels() -> dict[str, str]:
    """install.md's "Pod Security" table: values file -> level."""
    text = INSTALL_MD.read_text()
    section = re.split(r"\n#{2,3} ", text.split("\n### Pod Security\n", 1)[1])[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`([\w-]+\.yaml)`", cells[0]) if len(cells) > 2 else None
        if found:
            rows[found.group(1)] = cells[1].strip("`* ")
    return rows


# --------------------------------------------------------------------------------------------
# the render is unchanged; the level of each goal
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("goal", GOALS)
def test_the_check_changes_no_render(helm, tmp_path, goal):
    """helm template (no cluster: lookup returns nothing) renders each goal byte for byte as the
    chart without the check does, and the check's own template renders nothing."""
    without = Path(shutil.copytree(CHART, tmp_path / "omaticaya"))
    (without / "templates" / "podsecurity-check.yaml").unlink()
    assert _template(helm, CHART, goal).stdout == _template(helm, without, goal).stdout
    alone = _template(helm, CHART, goal, None, "--show-only", "templates/podsecurity-check.yaml",
                      check=False)  # fmt: skip
    assert alone.returncode != 0 and "could not find template" in alone.stderr, alone.stderr


def test_install_md_gives_a_level_for_every_goal():
    assert set(_install_md_levels()) == set(GOALS), _install_md_levels()


@pytest.mark.parametrize("goal", GOALS)
def test_each_goal_needs_the_level_install_md_gives(helm, probe_chart, goal):
    """The oracle's level of the rendered pods (hooks included) is install.md's, the chart's
    reading and what NOTES (helm install, a client dry run) say."""
    level = pod_security_level(_docs(_template(helm, CHART, goal).stdout))
    assert level == _install_md_levels()[goal]
    assert _chart_level(helm, probe_chart, goal) == level
    out = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
                   *_files(goal)).stdout  # fmt: skip
    notes = " ".join(out.split("NOTES:", 1)[1].split())
    said = ('these pods meet "restricted"' if level == "restricted"
            else f'these pods need the level "{level}" in namespace {NAMESPACE}')  # fmt: skip
    assert said in notes, notes
    if level != "restricted":
        assert f"kubectl label namespace {NAMESPACE} {ENFORCE}={level} --overwrite" in notes


#: (goal, values over it, the level): values that change the level, each judged by the oracle too
VARIANTS = [
    ("whole-stack.yaml", {"sharing": {"enforcement": "none"}}, "privileged"),  # no mps: hostPaths stay
    ("labels.yaml", {"podResourcesSocket": "/var/lib/kubelet/pod-resources/kubelet.sock"}, "privileged"),
    ("labels.yaml", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}}, "privileged"),
    ("labels.yaml", {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}, "privileged"),
    ("labels.yaml", {"securityContext": {"allowPrivilegeEscalation": True}}, "baseline"),
    ("labels.yaml", {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}, "baseline"),
    ("labels.yaml", {"trace": "h100-trace.json"}, "restricted"),
    ("dra.yaml", {"sharing": {"gpus": "all"}}, "privileged"),
]


@pytest.mark.parametrize(("goal", "values", "level"), VARIANTS)
def test_the_level_follows_the_values(helm, probe_chart, goal, values, level):
    docs = _docs(_template(helm, CHART, goal, values).stdout)
    assert pod_security_level(docs) == level
    assert _chart_level(helm, probe_chart, goal, values) == level


def test_every_template_that_renders_pods_is_read(helm, probe_chart):
    """omaticaya.podSecurity reads the pods of the template files omaticaya.podSecurityTemplates
    names: every file that renders a pod in any goal (and DRA with MPS) is one of them."""
    listed = _probe(helm, probe_chart, "labels.yaml",
                    '# files={{ include "omaticaya.podSecurityTemplates" . }}\n').stdout  # fmt: skip
    names = set(re.search(r"files=(.*)", listed).group(1).split())  # type: ignore[union-attr]
    rendering = set()
    for goal, values in [(g, None) for g in GOALS] + [("dra.yaml", {"sharing": {"gpus": "all"}})]:
        out = _template(helm, CHART, goal, values).stdout
        for chunk in out.split("\n---\n"):
            source = re.search(r"^# Source: omaticaya/templates/(\S+)$", chunk, re.M)
            doc = yaml.safe_load(chunk)
            if source and isinstance(doc, dict) and doc.get("kind") in POD_KINDS:
                rendering.add(source.group(1))
    assert rendering <= names, f"pods rendered by {sorted(rendering - names)}: name them in omaticaya.podSecurityTemplates"
    assert {"daemonset.yaml", "mps-daemonset.yaml", "scheduler.yaml"} <= rendering


# --------------------------------------------------------------------------------------------
# the refusal, fed a Namespace's labels
# --------------------------------------------------------------------------------------------


def _refusal(helm: dict[str, Any], chart_dir: Path, goal: str, labels: dict[str, str]):
    pairs = " ".join(["dict", *(f'"{k}" "{v}"' for k, v in labels.items())])
    body = '{{ include "omaticaya.podSecurityRefusal" (dict "top" . "labels" (' + pairs + ")) }}\n"
    return _probe(helm, chart_dir, goal, body, check=False)


def _flat(text: str) -> str:
    return " ".join(text.split())


#: (goal, the Namespace's labels, the words the refusal must say; None: it passes)
REFUSALS = [
    ("device-plugin.yaml", {ENFORCE: "baseline"}, [
        'namespace omaticaya-test enforces Pod Security "baseline"',
        "this release's pods need \"privileged\"",
        "DaemonSet omaticaya: hostPath volumes device-plugins (/var/lib/kubelet/device-plugins), "
        "pod-resources (/var/lib/kubelet/pod-resources)",
        f"kubectl label namespace omaticaya-test {ENFORCE}=privileged --overwrite",
        "or install into a namespace of its own"]),
    ("whole-stack.yaml", {ENFORCE: "baseline"}, [
        "DaemonSet omaticaya-mps: hostPath volumes mps-state (/run/omaticaya-mps-state), "
        "mps-host (/run); privileged container mps"]),
    ("dra.yaml", {ENFORCE: "baseline"}, [
        "dra-plugin (/var/lib/kubelet/plugins/gpu.omaticaya.io)", "dra-dev (/run/nvidia/driver/dev)"]),
    ("device-plugin.yaml", {ENFORCE: "restricted"}, [
        'enforces Pod Security "restricted"', "container agent runAsUser 0",
        "container agent without runAsNonRoot true"]),
    ("device-plugin.yaml", {ENFORCE: "Baseline", "pod-security.kubernetes.io/warn": "baseline"}, [
        f'has {ENFORCE}="Baseline", not a level (privileged, baseline, restricted), which Pod '
        'Security enforces as "restricted"', f"{ENFORCE}=privileged --overwrite"]),
    ("device-plugin.yaml", {ENFORCE: "privileged"}, None),
    ("whole-stack.yaml", {"pod-security.kubernetes.io/warn": "restricted",
                          "pod-security.kubernetes.io/audit": "restricted"}, None),
    ("whole-stack.yaml", {"kubernetes.io/metadata.name": "omaticaya-test"}, None),
    ("labels.yaml", {ENFORCE: "restricted"}, None),
    ("scheduler.yaml", {ENFORCE: "restricted"}, None),
]


@pytest.mark.parametrize(("goal", "labels", "said"), REFUSALS)
def test_the_refusal_says_what_to_do(helm, probe_chart, goal, labels, said):
    proc = _refusal(helm, probe_chart, goal, labels)
    if said is None:
        assert proc.returncode != 0 and "could not find template" in proc.stderr, proc.stderr
        return
    assert proc.returncode != 0
    err = _flat(proc.stderr)
    for words in said:
        assert words in err, err
