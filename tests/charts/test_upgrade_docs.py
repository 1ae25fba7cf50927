"""docs/upgrade.md, docs/migrate-to-dra.md and CHANGELOG.md against the chart and the code
(issue 52, item 6), with the real helm (``tests/chart.py``):

- upgrade.md's restart table is what ``helm template`` shows: for each value it names, changed
  alone, exactly the workloads it marks get a new pod template; the values that delete a
  workload delete it;
- each removed chart value it lists fails ``helm template`` with the message it quotes, and the
  old ``devicePlugin: true`` gets the NOTES line it quotes;
- its renamed variables are the settings' ``Renamed`` aliases, its renamed flags the parser's
  hidden aliases (per command), and the warnings it quotes are the ones printed;
- every chart value path the three files name is a value of values.yaml (or a removed one);
- CHANGELOG.md names every issue the history names (``issue N`` in a commit message).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from omaticaya_py.cli.parser import build_parser
from omaticaya_py.core import config as config_pkg
from omaticaya_py.core.config.settings_base import Renamed
from omaticaya_py.core.config.variables import deprecated_variable_lines
from tests.chart import CHART, NAMESPACE, RELEASE, run_helm, values_args

REPO = Path(__file__).resolve().parents[2]
UPGRADE = REPO / "docs" / "upgrade.md"
MIGRATE = REPO / "docs" / "migrate-to-dra.md"
CHANGELOG = REPO / "CHANGELOG.md"
INSTALL = REPO / "examples" / "install"
KUBE = "1.37.2"

WHOLE_STACK = ["-f", str(INSTALL / "whole-stack.yaml")]
DRA = ["-f", str(INSTALL / "dra.yaml"), "-f", str(INSTALL / "gpu-operator.yaml")]


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of its level or
    above."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", body)[0]


def table(text: str) -> list[list[str]]:
    """The rows of the first Markdown table in ``text`` (header and rule left out), as cells."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split(" | ")] for r in rows[2:]]


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# --------------------------------------------------------------------------------------------
# what helm upgrade restarts
# --------------------------------------------------------------------------------------------

#: each value upgrade.md's table names -> a change of it (``--set``), on the whole-stack goal
#: (``dra.*``: the DRA goal)
CHANGES = {
    "image.repository": "image.repository=registry.example/omaticaya",
    "image.tag": "image.tag=v9",
    "priorityClassName": "priorityClassName=gpu-critical",
    "logLevel": "logLevel=DEBUG",
    "prefix": "prefix=gpu.example.com",
    "placement.policy": "placement.policy=spread",
    "placement.settleS": "placement.settleS=7",
    "devicePluginResource": "devicePluginResource=example.com/gpu",
    "sharing.resource": "sharing.resource=example.com/gpu-memory",
    "sharing.gpus": "sharing.gpus=0-1",
    "sharing.unitMib": "sharing.unitMib=2048",
    "sharing.mps.root": "sharing.mps.root=/run/example/omaticaya/mps",
    "runtimeClassName": "runtimeClassName=nvidia",
    "nodeSelector": "nodeSelector.pool=gpu-a",
    "tolerations": "tolerations=null",
    "schedule": "schedule=@every 20s",
    "jitterS": "jitterS=3",
    "cleanupOnExit": "cleanupOnExit=false",
    "resources": "resources.limits.cpu=1",
    "podAnnotations": "podAnnotations.team=ml",
    "livenessProbe": "livenessProbe.periodSeconds=30",
    "readinessProbe": "readinessProbe.periodSeconds=30",
    "sharing.mps.threadShare": "sharing.mps.threadShare=true",
    "dra.taintEffect": "dra.taintEffect=NoExecute",
    "dra.cdiDir": "dra.cdiDir=/var/run/example-cdi",
    "sharing.mps.checkS": "sharing.mps.checkS=3",
    "sharing.mps.logLevel": "sharing.mps.logLevel=DEBUG",
    "sharing.mps.shmMib": "sharing.mps.shmMib=512",
    "scheduler.replicas": "scheduler.replicas=2",
    "scheduler.extender.unknownPolicy": "scheduler.extender.unknownPolicy=allow",
    "service.enabled": "service.enabled=true",
    "serviceMonitor.enabled": "serviceMonitor.enabled=true",
    "podMonitor.enabled": "podMonitor.enabled=true",
    "prometheusRule.enabled": "prometheusRule.enabled=true",
    "grafanaDashboard.enabled": "grafanaDashboard.enabled=true",
    "validatingAdmissionPolicy.enabled": "validatingAdmissionPolicy.enabled=false",
    "cleanupOnUninstall": "cleanupOnUninstall=false",
    "dra.deviceClasses.create": "dra.deviceClasses.create=false",
    "dra.extendedResourceName": "dra.extendedResourceName=example.com/gpu",
}

#: the table's columns, in order, as the workloads' names (release "omaticaya")
WORKLOADS = ["omaticaya", "omaticaya-mps", "omaticaya-scheduler"]


def pod_templates(helm: dict[str, Any], files: list[str], *sets: str) -> dict[str, str]:
    """Workload name -> its pod template (JSON), hooks left out."""
    args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE, *files]
    for s in sets:
        args += ["--set", s]
    out = {}
    for d in yaml.safe_load_all(run_helm(helm, *args).stdout):
        if d and d["kind"] in ("DaemonSet", "Deployment"):
            if "helm.sh/hook" not in (d["metadata"].get("annotations") or {}):
                out[d["metadata"]["name"]] = json.dumps(d["spec"]["template"], sort_keys=True)
    return out


def restart_rows() -> list[tuple[list[str], list[bool]]]:
    """upgrade.md's table: (values, [restarts?] per workload); a cell "-" is no change."""
    text = section(UPGRADE.read_text(), "## What `helm upgrade` restarts")
    return [(spans(r[0]), [c != "-" for c in r[1:]]) for r in table(text)]


def test_the_restart_table_names_exactly_the_values_tried():
    named = [v for values, _ in restart_rows() for v in values]
    assert len(named) == len(set(named)), "a value in two rows"
    assert set(named) == set(CHANGES)


@pytest.mark.parametrize(
    ("value", "marks"),
    [(v, marks) for values, marks in restart_rows() for v in values],
    ids=[v for values, _ in restart_rows() for v in values],
)
def test_a_value_changes_the_pod_templates_the_table_marks(helm, value, marks):
    files = DRA if value.startswith("dra.") else WHOLE_STACK
    before = pod_templates(helm, files)
    after = pod_templates(helm, files, CHANGES[value])
    changed = [w for w in WORKLOADS if before.get(w) != after.get(w)]
    marked = [w for w, m in zip(WORKLOADS, marks, strict=True) if m and w in before]
    assert changed == marked, f"{value}: helm template changes {changed}, upgrade.md says {marked}"


@pytest.mark.parametrize(
    ("change", "gone"),
    [("sharing.gpus=none", "omaticaya-mps"), ("sharing.enforcement=none", "omaticaya-mps"),
     ("scheduler.enabled=false", "omaticaya-scheduler")],
)  # fmt: skip
def test_a_value_that_removes_a_workload_deletes_it(helm, change, gone):
    text = " ".join(UPGRADE.read_text().split())
    key, value = change.split("=")
    assert f"`{key}: {value}`" in text
    assert gone in pod_templates(helm, WHOLE_STACK)
    assert gone not in pod_templates(helm, WHOLE_STACK, change)


# --------------------------------------------------------------------------------------------
# removed and renamed names
# --------------------------------------------------------------------------------------------

#: each old chart value upgrade.md lists -> values that set it
OLD_VALUES: dict[str, dict[str, Any]] = {
    "devicePlugin: true": {"devicePlugin": True},
    "sharing.policy": {"sharing": {"policy": "spread"}},
    "scheduler.extender.strategy": {"scheduler": {"extender": {"strategy": "spread"}}},
    "sharing.settleS": {"sharing": {"settleS": 30}},
    "scheduler.extender.settleS": {"scheduler": {"extender": {"settleS": 30}}},
    "scheduler.configApiVersion": {
        "scheduler": {"enabled": True, "configApiVersion": "kubescheduler.config.k8s.io/v1beta3"}
    },
}


def value_rows() -> list[tuple[list[str], str]]:
    """upgrade.md's "Chart values" table: (the old names, what the chart does)."""
    text = section(UPGRADE.read_text(), "### Chart values")
    return [([s for s in spans(r[0]) if not s.startswith("v1beta")], r[2]) for r in table(text)]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_value_table_names_exactly_the_old_values_tried():
    assert sorted(n for names, _ in value_rows() for n in names) == sorted(OLD_VALUES)


@pytest.mark.parametrize(
    ("name", "said"), [(n, said) for names, said in value_rows() for n in names]
)
def test_an_old_value_gets_the_message_upgrade_md_quotes(helm, name, said):
    (quoted,) = spans(said)
    proc = run_helm(
        helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
        *values_args(helm, OLD_VALUES[name]), check=False,
    )  # fmt: skip
    if said.startswith("reads it"):  # still read: NOTES say so
        assert proc.returncode == 0, proc.stderr
        assert flat(quoted) in flat(proc.stdout.split("NOTES:", 1)[1])
        return
    assert said.startswith("fails the render:")
    assert proc.returncode != 0, f"{name} rendered"
    message = flat(proc.stderr)
    assert name.split(": ")[0] in message, message
    for fragment in (f.strip() for f in quoted.split("...")):
        assert flat(fragment) in message, (fragment, message)


def settings_classes() -> list[type]:
    """The settings classes of ``core.config`` (pydantic models defined there)."""
    out = []
    for info in pkgutil.iter_modules(config_pkg.__path__):
        module = importlib.import_module(f"{config_pkg.__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                if hasattr(obj, "model_fields"):
                    out.append(obj)
    return out


def renamed_settings() -> dict[str, str]:
    """Every former variable name of a setting -> the one to use, from the settings classes."""
    out: dict[str, str] = {}
    for cls in settings_classes():
        for field in cls.model_fields.values():
            alias = field.validation_alias
            if isinstance(alias, Renamed):
                new, *old = alias.names
                out.update(dict.fromkeys(old, new))
    return out


def deprecated_flags() -> dict[tuple[str, str], str]:
    """(command, former flag) -> the flag to use, from the parser's hidden aliases."""
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for command, p in sub.choices.items():
        p.format_help()  # adds the sub-command's flags
        for action in p._actions:
            new = getattr(action, "new", None)
            if new is not None and action.help == argparse.SUPPRESS:
                for flag in action.option_strings:
                    out[(command, flag)] = new
    return out


def rename_rows() -> list[list[str]]:
    return table(section(UPGRADE.read_text(), "### Environment variables and flags"))


def test_the_renamed_variables_are_the_settings():
    documented = {
        old: spans(use)[0]
        for former, use in rename_rows()
        for old in spans(former)
        if old.startswith("OMATICAYA_")
    }
    assert documented == renamed_settings()


def test_the_renamed_flags_are_the_parsers():
    documented = {}
    for former, use in rename_rows():
        for flag, commands in re.findall(r"`(--[a-z-]+)` \(([^)]*)\)", former):
            for command in spans(commands):
                documented[(command, flag)] = spans(use)[0]
    assert documented == deprecated_flags()


def test_the_warnings_quoted_are_printed(capsys):
    text = section(UPGRADE.read_text(), "### Environment variables and flags")
    quoted = [s for s in spans(text) if "is deprecated" in s]
    variable, flag = quoted
    name = variable.split(" ", 1)[0]
    lines = [
        line for cls in settings_classes() for line in deprecated_variable_lines(cls, {name: "30"})
    ]
    assert variable in lines, lines
    build_parser().parse_args(["show", "--share-policy", "spread"])
    assert capsys.readouterr().err.strip() == flag


# --------------------------------------------------------------------------------------------
# chart values named in the docs, and the issues in the changelog
# --------------------------------------------------------------------------------------------

REMOVED = {"sharing.policy", "scheduler.extender.strategy", "sharing.settleS",
           "scheduler.extender.settleS"}  # fmt: skip
VALUE_PATH = re.compile(r"^[a-z][A-Za-z0-9]*(\.[a-z][A-Za-z0-9]*)*(\.\*)?$")
FILE_NAME = re.compile(r"\.(ya?ml|md|json|py|txt|sh)$")


def value_paths(text: str, top: set[str]) -> set[str]:
    """The code spans of ``text`` (a span ``a.b: c`` read as ``a.b``) that look like a value
    path and start with a top-level value."""
    out = set()
    for s in re.findall(r"`([^`\n]+)`", text):
        s = s.split(":", 1)[0].split("=", 1)[0].strip()
        if FILE_NAME.search(s):
            continue
        if VALUE_PATH.match(s) and s.split(".")[0] in top:
            out.add(s)
    return out


def resolves(values: dict[str, Any], path: str) -> bool:
    node: Any = values
    for part in path.removesuffix(".*").split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return not path.endswith(".*") or isinstance(node, dict)


@pytest.mark.parametrize("doc", [UPGRADE, MIGRATE, CHANGELOG], ids=lambda p: p.name)
def test_every_chart_value_named_is_a_value(doc):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    named = value_paths(doc.read_text(), set(values))
    assert named, doc
    unknown = sorted(p for p in named if p not in REMOVED and not resolves(values, p))
    assert not unknown, f"{doc.name} names values the chart does not have: {unknown}"


def test_the_changelog_names_every_issue_of_the_history():
    try:
        shallow = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
            text=True, check=True,
        ).stdout.strip()  # fmt: skip
        log = subprocess.run(
            ["git", "log", "--format=%B"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no git history here: {exc}")
    if shallow == "true":
        pytest.skip("a shallow clone: the history is cut")

    def issues(text: str) -> set[int]:
        found = re.findall(r"\bissues? (\d+(?:(?:, | and |, and )\d+)*)", text)
        return {int(n) for group in found for n in re.findall(r"\d+", group)}

    missing = issues(log) - issues(CHANGELOG.read_text())
    assert not missing, f"CHANGELOG.md names no entry for issues {sorted(missing)}"
