"""The chart <-> Settings contract: the env the chart renders from its values, every setting a
value and every rendered variable a setting, the chart's defaults the code's, values that
survive values -> env -> Settings; .env.example lists every setting with its default; the
extender's env. Helpers: tests/chart.py.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from omaticaya_py.core.config.settings import Settings, load_settings
from omaticaya_py.core.config.settings_base import env_names, field_env_names
from tests.chart import (
    ALL_ON,
    ENV_EXAMPLE,
    NESTED_VALUE,
    NOT_IN_CHART,
    as_plain,
    camel,
    chart_settings,
    chart_values,
    code_defaults,
    env_of,
    render,
    template,
)

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
    ("sharing-gpus-range", {"devicePlugin": {"enabled": True}, "sharing": {"gpus": "0-3"}}, "OMATICAYA_SHARED_GPUS", "0-3"),
    ("sharing-gpus-one-index", {"devicePlugin": {"enabled": True}, "sharing": {"gpus": 2}}, "OMATICAYA_SHARED_GPUS", "2"),
    ("sharing-unitMib", {"sharing": {"unitMib": 2048}}, "OMATICAYA_SHARE_UNIT_MIB", "2048"),
    ("placement-policy-default", None, "OMATICAYA_PLACEMENT_POLICY", "binpack"),
    (
        "placement-policy",
        {"placement": {"policy": "spread"}},
        "OMATICAYA_PLACEMENT_POLICY",
        "spread",
    ),
    ("placement-settleS", {"placement": {"settleS": 15}}, "OMATICAYA_SETTLE_S", "15"),
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
    known = env_names(Settings)
    env = env_of(render(helm, ALL_ON))
    rendered = {k for k in env if k.startswith("OMATICAYA_")}
    assert rendered <= known, f"not settings: {sorted(rendered - known)}"
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
        var = field_env_names(Settings, field)[0]
        assert var in env, f"chart does not render {var}"
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
    # the emptyDir both containers share, off /run: the mps container's /run is the host's
    assert str(loaded.pop("mps_state_dir")) == "/var/lib/omaticaya/mps-state"
    defaults.pop("mps_state_dir")
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


EXTENDER_ENV = "OMATICAYA_EXTENDER_"


def _env_names() -> dict[str, Any]:
    """Each setting's variable (the first of ``field_env_names``: one a setting both the agent
    and the extender read, the placement section's, once) -> its pydantic field; the agent's,
    the MPS supervisor's and the extender's."""
    from omaticaya_py.mps.settings import MpsSettings
    from omaticaya_py.scheduler import ExtenderSettings

    out: dict[str, Any] = {}
    for cls in (Settings, MpsSettings, ExtenderSettings):
        for field, info in cls.model_fields.items():
            out.setdefault(field_env_names(cls, field)[0], info)
    return out


def _setting_of(key: str) -> Any:
    """The pydantic field behind a .env.example key (agent or extender settings)."""
    return _env_names()[key]


def test_env_example_lists_every_setting_with_a_comment():
    entries = env_example()
    expected = set(_env_names())
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
    from omaticaya_py.scheduler import ExtenderSettings
    from omaticaya_py.scheduler.settings import load_extender_settings

    assert load_extender_settings() == ExtenderSettings(_env_file=None)  # type: ignore[call-arg]


def _extender_loading(env: dict[str, str], monkeypatch, tmp_path) -> Any:
    """``ExtenderSettings`` loaded from the ``OMATICAYA_*`` variables of ``env`` (a rendered
    container's) alone: no other variable, no ``.env``."""
    from omaticaya_py.scheduler.settings import load_extender_settings

    for key in list(os.environ):
        if key.startswith("OMATICAYA_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        if key.startswith("OMATICAYA_"):
            monkeypatch.setenv(key, value)
    return load_extender_settings()


def test_extender_gets_the_shared_resource(helm, monkeypatch, tmp_path):
    """The scheduler's extender places slices of the same resource the device plugin serves:
    ``sharing.resource`` reaches both, and the extender's rendered env loads."""

    values = {"scheduler": {"enabled": True}, "sharing": {"resource": "example.com/vram"}}
    docs = render(helm, values)
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    (extender,) = [
        c for c in deploy["spec"]["template"]["spec"]["containers"]
        if any(e["name"].startswith(EXTENDER_ENV) for e in c.get("env", []))
    ]  # fmt: skip
    env = {e["name"]: e["value"] for e in extender["env"] if "value" in e}
    assert env["OMATICAYA_SHARED_RESOURCE"] == "example.com/vram"
    assert env_of(docs)["OMATICAYA_SHARED_RESOURCE"] == "example.com/vram"
    assert _extender_loading(env, monkeypatch, tmp_path).shared_resource == "example.com/vram"
    # one name per fact (issue 49): the extender's container has none of its former names
    assert not {"OMATICAYA_EXTENDER_SHARED_RESOURCE", "OMATICAYA_EXTENDER_DEVICE_PLUGIN_RESOURCE",
                "OMATICAYA_EXTENDER_SETTLE_S", "OMATICAYA_EXTENDER_STRATEGY"} & set(env)  # fmt: skip


@pytest.mark.parametrize("settle_s", [None, 0, 15])
def test_settle_time_reaches_both_sides(helm, monkeypatch, tmp_path, settle_s):
    """``placement.settleS`` is the one value (issue 49): rendered as OMATICAYA_SETTLE_S into the
    agent (a slice's memory counts on its GPU until the reading shows it) and the extender (a
    placed pod's), and both load it."""

    values: dict[str, Any] = {"scheduler": {"enabled": True}, "devicePlugin": True}
    if settle_s is not None:
        values["placement"] = {"settleS": settle_s}
    docs = render(helm, values)
    agent, extender = env_of(docs), _extender_env(docs)
    want = 60 if settle_s is None else settle_s
    assert agent["OMATICAYA_SETTLE_S"] == extender["OMATICAYA_SETTLE_S"] == str(want)
    assert _extender_loading(extender, monkeypatch, tmp_path).settle_s == want


@pytest.mark.parametrize(
    ("name", "values"),
    [("sharing.settleS", {"sharing": {"settleS": 5}}),
     ("scheduler.extender.settleS", {"scheduler": {"enabled": True, "extender": {"settleS": 5}}})],
)  # fmt: skip
def test_a_removed_settle_value_fails_the_render_naming_the_new_one(helm, name, values):
    proc = template(helm, values, check=False)
    assert proc.returncode != 0
    assert f"{name} (5): removed, use placement.settleS instead" in proc.stderr


# --------------------------------------------------------------------------------------------
# the placement policy: one value, both sides (issue 38)
# --------------------------------------------------------------------------------------------


def _extender_env(docs: list[dict]) -> dict[str, str]:
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    (extender,) = [c for c in deploy["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "extender"]  # fmt: skip
    return {e["name"]: e["value"] for e in extender["env"] if "value" in e}


@pytest.mark.parametrize("policy", [None, "binpack", "spread"])
def test_placement_policy_reaches_both_sides(helm, monkeypatch, tmp_path, policy):
    """``placement.policy`` is the one value: rendered as OMATICAYA_PLACEMENT_POLICY into the
    agent (the device plugin's slices) and the extender alike, and the extender loads it. The
    two values it replaced could be set apart: the extender reserved a GPU the device plugin
    would not hand out."""

    values: dict[str, Any] = {"scheduler": {"enabled": True}, "devicePlugin": True}
    if policy:
        values["placement"] = {"policy": policy}
    docs = render(helm, values)
    agent, extender = env_of(docs), _extender_env(docs)
    want = policy or "binpack"
    assert agent["OMATICAYA_PLACEMENT_POLICY"] == extender["OMATICAYA_PLACEMENT_POLICY"] == want
    for old in ("OMATICAYA_SHARE_POLICY", "OMATICAYA_EXTENDER_STRATEGY"):
        assert old not in agent and old not in extender
    assert _extender_loading(extender, monkeypatch, tmp_path).placement_policy == want


REMOVED_POLICY_VALUES = [
    ("sharing.policy", {"sharing": {"policy": "spread"}}),
    ("sharing.policy-same", {"sharing": {"policy": "binpack"}}),
    ("scheduler.extender.strategy", {"scheduler": {"extender": {"strategy": "spread"}}}),
    (
        "scheduler.extender.strategy-enabled",
        {"scheduler": {"enabled": True, "extender": {"strategy": "binpack"}}},
    ),
]


@pytest.mark.parametrize(
    "values", [v for _, v in REMOVED_POLICY_VALUES], ids=[i for i, _ in REMOVED_POLICY_VALUES]
)
def test_removed_policy_values_fail_the_render_naming_placement_policy(helm, values):
    """A user who still sets the old values is told to set ``placement.policy``, rather than
    have them ignored (or refused by the schema as unknown keys, without the way out)."""
    proc = template(helm, values, check=False)
    assert proc.returncode != 0, "helm template accepted a removed value"
    (name,) = [n for n in ("sharing.policy", "scheduler.extender.strategy")
               if n.split(".")[-1] in str(values)]  # fmt: skip
    assert f"{name} (" in proc.stderr and "use placement.policy" in proc.stderr, proc.stderr


def test_both_removed_policy_values_are_named_at_once(helm):
    proc = template(helm, {"sharing": {"policy": "spread"},
                           "scheduler": {"extender": {"strategy": "binpack"}}}, check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "sharing.policy (spread) and scheduler.extender.strategy (binpack)" in proc.stderr
    assert "use placement.policy" in proc.stderr
