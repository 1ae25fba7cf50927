"""Values a user gets wrong in the first hour (issue 52, items 2 and 3), each refused by the chart
with the reason, or accepted in the spelling the user typed. Rendered by the real helm
(``tests/chart.py``).

- Refused at ``helm template``, ``helm install`` (a client dry run) and ``helm lint --strict``
  alike: a schedule the agent cannot parse; ``sharing.gpus`` with neither the device plugin nor
  DRA (the labels-only goal: the agent would leave the shared GPUs out of every label); a
  ``sharing.resource`` that is the device plugin's resource (the agent exits on it); and every
  refusal the chart already had (helm lint runs the templates with a ``fail`` that only logs:
  ``omaticaya.fail`` makes lint refuse them too).
- The schedule check mirrors ``omaticaya_py/core/config/schedule.py``: one table of examples, each
  judged by the agent's ``parse_schedule`` and by the chart.
- The GPU Operator's conventions: ``devicePlugin.enabled`` (the old boolean still read, with a
  deprecation line in NOTES), ``driverRoot`` (/run/nvidia/driver: the DRA plugin's device
  nodes), and YAML's unquoted ``off`` (false) read as "off" for ``scheduler.preemption`` and
  ``podResourcesSocket``.
- With DRA on Kubernetes 1.34 to 1.36, NOTES (and the DaemonSet, as a comment) name the
  feature gates the driver's features need.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from omaticaya_py.core.config.schedule import parse_schedule
from tests import chart
from tests.chart import NAMESPACE, RELEASE, agent_daemonset, env_of, render, run_helm, values_args

# --------------------------------------------------------------------------------------------
# the ways to run the chart
# --------------------------------------------------------------------------------------------


def _template(helm: dict[str, Any], values: dict[str, Any], kube: str = chart.K8S_VERSION):
    return run_helm(
        helm, "template", RELEASE, str(chart.CHART), "--namespace", NAMESPACE,
        "--kube-version", kube, *values_args(helm, values), check=False,
    )  # fmt: skip


def _install(helm: dict[str, Any], values: dict[str, Any]):
    """``helm install --dry-run=client``: no cluster, helm's default Kubernetes version (1.35)."""
    return run_helm(
        helm, "install", RELEASE, str(chart.CHART), "--namespace", NAMESPACE,
        "--dry-run=client", *values_args(helm, values), check=False,
    )  # fmt: skip


def _lint(helm: dict[str, Any], values: dict[str, Any], kube: str = chart.K8S_VERSION):
    return run_helm(
        helm, "lint", "--strict", str(chart.CHART), "--namespace", NAMESPACE,
        "--kube-version", kube, *values_args(helm, values), check=False,
    )  # fmt: skip


def _notes(helm: dict[str, Any], values: dict[str, Any]) -> str:
    proc = _install(helm, values)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


def _flat(text: str) -> str:
    """Text with its line breaks and runs of spaces made one space (helm wraps nothing, but the
    messages and NOTES are wrapped in the templates)."""
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------
# item 2: values that render, then fail or misbehave on the cluster
# --------------------------------------------------------------------------------------------

PLUGIN = {"devicePlugin": {"enabled": True}}

MISTAKES = [
    # (id, values, Kubernetes version, text the refusal must hold)
    ("schedule-words", {"schedule": "every 10s"}, "1.31.0",
     "schedule 'every 10s': expected a 5-field crontab"),
    ("schedule-bare-duration", {"schedule": "10s"}, "1.31.0", "schedule '10s': expected"),
    ("schedule-every-too-short", {"schedule": "@every 50ms"}, "1.31.0",
     "@every takes 100ms to 366 days"),
    ("schedule-minute-60", {"schedule": "60 * * * *"}, "1.31.0", "schedule '60 * * * *'"),
    ("sharing-labels-only", {"sharing": {"gpus": "0-3"}}, "1.31.0",
     "set devicePlugin.enabled=true (Kubernetes 1.31+) or dra.enabled=true"),
    ("sharing-all-labels-only", {"sharing": {"gpus": "all", "enforcement": "none"}}, "1.31.0",
     "gpu.memory.free-mib and gpu.healthy-count drop to 0"),
    ("sharing-resource-is-device-plugin", {"sharing": {"resource": "nvidia.com/gpu"}}, "1.31.0",
     "sharing.resource nvidia.com/gpu is also devicePluginResource"),
    ("sharing-resource-is-custom-device-plugin",
     {**PLUGIN, "devicePluginResource": "example.com/gpu",
      "sharing": {"gpus": "all", "resource": "example.com/gpu"}}, "1.31.0",
     "sharing.resource example.com/gpu is also devicePluginResource"),
    # refusals the chart had before, which helm lint let through
    ("dra-and-device-plugin", {**PLUGIN, "dra": {"enabled": True}}, "1.34.0",
     "dra.enabled and devicePlugin.enabled are both true"),
    ("dra-below-1.34", {"dra": {"enabled": True}}, "1.33.0",
     "dra.enabled needs resource.k8s.io/v1"),
    ("removed-sharing-policy", {"sharing": {"policy": "spread"}}, "1.31.0",
     "sharing.policy (spread): removed, use placement.policy"),
    ("scheduler-config-v1beta3",
     {"scheduler": {"enabled": True, "configApiVersion": "kubescheduler.config.k8s.io/v1beta3"}},
     "1.31.0", "scheduler.configApiVersion kubescheduler.config.k8s.io/v1beta3 is not read"),
    ("root-without-runAsNonRoot-false", {"securityContext": {"runAsUser": 0}}, "1.31.0",
     "set securityContext.runAsNonRoot=false"),
    ("serviceAccount-without-name", {"serviceAccount": {"create": False}}, "1.31.0",
     "serviceAccount.name is required when serviceAccount.create is false"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "kube", "said"),
    [m[1:] for m in MISTAKES],
    ids=[m[0] for m in MISTAKES],
)
def test_template_and_lint_refuse_with_the_reason(helm, values, kube, said):
    proc = _template(helm, values, kube)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert said in _flat(proc.stderr), proc.stderr
    lint = _lint(helm, values, kube)
    assert lint.returncode != 0, f"helm lint --strict accepted {values}:\n{lint.stdout}"
    assert said in _flat(lint.stdout + lint.stderr), lint.stdout + lint.stderr


@pytest.mark.parametrize(
    ("values", "said"),
    [m[1::2] for m in MISTAKES if m[2] == "1.31.0"],
    ids=[m[0] for m in MISTAKES if m[2] == "1.31.0"],
)
def test_install_refuses_with_the_reason(helm, values, said):
    proc = _install(helm, values)
    assert proc.returncode != 0, f"helm install accepted {values}"
    assert said in _flat(proc.stderr), proc.stderr


@pytest.mark.parametrize(
    "values",
    [
        {},
        {**PLUGIN, "sharing": {"gpus": "0-3"}},
        {"dra": {"enabled": True}, "sharing": {"gpus": "all"}},
        {**PLUGIN, "sharing": {"resource": "example.com/gpu-memory"}},
        {"devicePluginResource": "example.com/gpu", "sharing": {"resource": "nvidia.com/gpu"}},
        {"schedule": "*/5 * * * * ?"},
    ],
    ids=[
        "defaults",
        "plugin-sharing",
        "dra-sharing",
        "plugin-own-resource",
        "swapped-names",
        "six-fields",
    ],  # fmt: skip
)
def test_lint_strict_passes_what_template_renders(helm, values):
    kube = "1.34.0"
    assert _template(helm, values, kube).returncode == 0
    lint = _lint(helm, values, kube)
    assert lint.returncode == 0, lint.stdout + lint.stderr


# the schedule: the chart's check against the agent's parser, one table ----------------------

#: (schedule, the agent and the chart accept it)
SCHEDULES = [
    ("@every 10s", True), ("@every 1m30s", True), ("@every 500ms", True), ("@every 100ms", True),
    ("@every 1.5s", True), ("@every10s", True), ("@Every 10s", True), ("@every 8784h", True),
    ("  @hourly  ", True), ("@Daily", True), ("@midnight", True), ("@annually", True),
    ("*/5 * * * *", True), ("*/5 * * * * ?", True), ("0 */2 * * * *", True), ("0 0 1 1 *", True),
    ("0  9 * * *", True), ("0 0 last * *", True), ("0 9 * jan-mar mon-fri", True),
    ("0 9 * * 1-5", True), ("0 9 * * 7", True), ("0 9 * * 0-7", True), ("0 9 * * sunday", True),
    ("0 9 * * */2", True), ("30 2 1,15 * *", True), ("0-59/10 * * * * ?", True),
    ("*/59 * * * *", True), ("0 0 31 12 *", True), ("5/10 * * * *", True), ("? * * * *", True),
    ("07 * * * *", True), ("0 0 * DEC *", True), ("0 */23 * * *", True),
    ("every 10s", False), ("10s", False), ("@every", False), ("@every 10", False),
    ("@every 10S", False), ("@every 10d", False), ("@every 50ms", False), ("@every 8785h", False),
    ("@every 1.5.2s", False), ("@every 10s 5s", False), ("@weekly 1", False), ("@often", False),
    ("* * * *", False), ("* * * * * * *", False), ("60 * * * *", False), ("*/60 * * * *", False),
    ("* 24 * * *", False), ("* */24 * * *", False), ("* * 0 * *", False), ("* * 32 * *", False),
    ("* * * 13 *", False), ("* * * */12 *", False), ("* * * foo *", False), ("* * * * 8", False),
    ("* * * * funday", False), ("*/0 * * * *", False), ("* * * * */0", False),
    ("1,,2 * * * *", False), ("-1 * * * *", False),
]  # fmt: skip

#: what the chart lets through and the agent refuses at start (ranges the pattern cannot order)
SCHEDULE_GAPS = ["5-3 * * * *", "10-20/15 * * * *", "0 9 * * sat-sun"]


def _chart_accepts_schedule(helm: dict[str, Any], text: str) -> bool:
    proc = _template(helm, {"schedule": text})
    assert proc.returncode == 0 or "schedule" in proc.stderr, proc.stderr
    if proc.returncode == 0:
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        assert env_of(docs)["OMATICAYA_SCHEDULE"] == text
    return proc.returncode == 0


def _agent_accepts_schedule(text: str) -> bool:
    try:
        parse_schedule(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(("text", "valid"), SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_schedule_chart_and_agent_agree(helm, text, valid):
    assert _agent_accepts_schedule(text) is valid, f"the agent's parse_schedule on {text!r}"
    assert _chart_accepts_schedule(helm, text) is valid, f"the chart on {text!r}"


@pytest.mark.parametrize("text", SCHEDULE_GAPS)
def test_schedule_gaps_are_the_known_ones(helm, text):
    """The chart's check orders no range; the agent refuses these at start. A row that the
    chart comes to refuse belongs in SCHEDULES (and the comment of omaticaya.schedule)."""
    assert not _agent_accepts_schedule(text)
    assert _chart_accepts_schedule(helm, text)


# --------------------------------------------------------------------------------------------
# DRA on 1.34-1.36: the feature gates
# --------------------------------------------------------------------------------------------

DRA_SHARED = {"dra": {"enabled": True}, "sharing": {"gpus": "all"}}


@pytest.mark.parametrize(
    ("kube", "values", "said", "unsaid"),
    [
        ("1.34.0", DRA_SHARED,
         ["alpha", "DRADeviceTaints", "DRAConsumableCapacity", "DRAExtendedResource"], []),
        ("1.35.2", {"dra": {"enabled": True, "extendedResourceName": ""}},
         ["alpha", "DRADeviceTaints"], ["DRAConsumableCapacity", "DRAExtendedResource"]),
        ("1.36.0", DRA_SHARED,
         ["beta, on by default", "DRADeviceTaints", "DRAConsumableCapacity",
          "DRAExtendedResource"], ["alpha"]),
        ("1.37.0", DRA_SHARED, [], ["DRADeviceTaints", "DRAConsumableCapacity"]),
        ("1.35.0", {}, [], ["DRADeviceTaints"]),
    ],
    ids=["1.34-sharing", "1.35-whole", "1.36", "1.37", "no-dra"],
)  # fmt: skip
def test_dra_feature_gates_named_by_release(helm, kube, values, said, unsaid):
    proc = _template(helm, values, kube)
    assert proc.returncode == 0, proc.stderr
    comments = _flat(" ".join(line for line in proc.stdout.splitlines() if line.startswith("#")))
    for text in said:
        assert text in comments, comments
    for text in unsaid:
        assert text not in comments, comments


def test_notes_name_the_feature_gates(helm):
    """helm install's default Kubernetes (1.35): the gates are alpha there."""
    text = _flat(_notes(helm, DRA_SHARED))
    assert "Kubernetes v1.35.0: DRA is GA, but these features the driver uses are alpha" in text
    assert "DRAConsumableCapacity: sharing by memory" in text
    assert "DRADeviceTaints: the taint on an unhealthy GPU's device" in text
    # the gate without the API version stalls the whole scheduler (seen on v1.34.4)
    assert "--runtime-config=resource.k8s.io/v1alpha3=true" in text
    assert "feature-gates" not in _flat(_notes(helm, {}))


# --------------------------------------------------------------------------------------------
# item 3: the GPU Operator's conventions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "on"),
    [
        ({"devicePlugin": {"enabled": True}}, True),
        ({"devicePlugin": True}, True),
        ({"devicePlugin": {"enabled": False}}, False),
        ({"devicePlugin": False}, False),
        ({}, False),
    ],
    ids=["enabled-true", "bool-true", "enabled-false", "bool-false", "default"],
)
def test_device_plugin_enabled_or_boolean(helm, values, on):
    docs = render(helm, values)
    env = env_of(docs)
    assert env["OMATICAYA_DEVICE_PLUGIN"] == ("true" if on else "false")
    volumes = {v["name"] for v in agent_daemonset(docs)["spec"]["template"]["spec"]["volumes"]}
    assert ("device-plugins" in volumes) is on
    notes = _flat(_notes(helm, values))
    assert ("device plugin (nvidia.com/gpu" in notes) is on
    deprecated = isinstance(values.get("devicePlugin"), bool)
    assert ("DEPRECATED: devicePlugin:" in notes) is deprecated, notes


def test_device_plugin_enabled_by_set_flag(helm):
    """``--set devicePlugin.enabled=true``, the GPU Operator's and docs/dra.md's spelling (once
    "Not a table"), and the old ``--set devicePlugin=true``."""
    for flag in ("devicePlugin.enabled=true", "devicePlugin=true"):
        docs = render(helm, None, "--set", flag)
        assert env_of(docs)["OMATICAYA_DEVICE_PLUGIN"] == "true", flag


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"devicePlugin": {"enabled": "yes"}}, "/devicePlugin"),
        ({"devicePlugin": {"enable": True}}, "enable"),
        ({"devicePlugin": "true"}, "/devicePlugin"),
        ({"driverRoot": "run/nvidia/driver"}, "/driverRoot"),
        ({"driverRoot": "/run/nvidia/driver/"}, "/driverRoot"),
        ({"scheduler": {"preemption": "maybe"}}, "/scheduler/preemption"),
        ({"podResourcesSocket": True}, "/podResourcesSocket"),
    ],
    ids=[
        "enabled-string",
        "enable-typo",
        "string",
        "driverRoot-relative",
        "driverRoot-trailing-slash",
        "preemption-unknown",
        "podResourcesSocket-true",
    ],  # fmt: skip
)
def test_schema_refuses(helm, values, where):
    proc = _template(helm, values)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "dev_root"),
    [
        ({}, "/dev"),
        ({"driverRoot": "/run/nvidia/driver"}, "/run/nvidia/driver/dev"),
        ({"driverRoot": "/run/nvidia/driver", "dra": {"devRoot": "/dev"}}, "/dev"),
        ({"dra": {"devRoot": "/tmp/dev/dev"}}, "/tmp/dev/dev"),
    ],
    ids=["host-driver", "gpu-operator", "devRoot-wins", "devRoot"],
)
def test_driver_root_places_the_dra_device_nodes(helm, values, dev_root):
    values = {**values, "dra": {"enabled": True, **values.get("dra", {})}}
    docs = render(helm, values, "--kube-version", "1.34.0")
    spec = agent_daemonset(docs)["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "dra-dev")
    assert volume["hostPath"]["path"] == dev_root
    assert env_of(docs)["OMATICAYA_DRA_DEV_ROOT"] == f"/host{dev_root}"
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["dra-dev"]["mountPath"] == f"/host{dev_root}"


def _scheduler_docs(helm: dict[str, Any], values_text: str) -> list[dict]:
    """The scheduler's objects from a values file written as a user types it (YAML 1.1:
    unquoted off/on are booleans)."""
    n = len(list(helm["home"].glob("values-*.yaml")))
    f = helm["home"] / f"values-{n}.yaml"
    f.write_text(values_text)
    proc = run_helm(
        helm, "template", RELEASE, str(chart.CHART), "--namespace", NAMESPACE,
        "--kube-version", chart.K8S_VERSION, "-f", str(f), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "ConfigMap"]


@pytest.mark.parametrize(
    ("typed", "quoted"),
    [("off", '"off"'), ("on", '"on"'), ("false", '"off"'), ("true", '"on"')],
)
def test_preemption_unquoted_reads_as_typed(helm, typed, quoted):
    base = "scheduler:\n  enabled: true\n  preemption: {}\n"
    assert _scheduler_docs(helm, base.format(typed)) == _scheduler_docs(helm, base.format(quoted))


def test_preemption_off_unquoted_turns_preemption_off(helm):
    on, off = (
        _flat(yaml.safe_dump(_scheduler_docs(helm, f"scheduler:\n  enabled: true\n  preemption: {v}\n")))
        for v in ("auto", "off")
    )  # fmt: skip
    assert "preemptVerb" in on and "preemptVerb" not in off


@pytest.mark.parametrize("typed", ["off", '"off"', "false"])
def test_pod_resources_socket_off_unquoted(helm, typed):
    n = len(list(helm["home"].glob("values-*.yaml")))
    f = helm["home"] / f"values-{n}.yaml"
    f.write_text(f"devicePlugin:\n  enabled: true\npodResourcesSocket: {typed}\n")
    proc = run_helm(
        helm, "template", RELEASE, str(chart.CHART), "--namespace", NAMESPACE,
        "--kube-version", chart.K8S_VERSION, "-f", str(f),
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    docs = [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
    assert env_of(docs)["OMATICAYA_POD_RESOURCES_SOCKET"] == ""
