"""Bad input in the environment and on the command line: each value gets a one-line error naming
the variable (or flag) and the expected form, exit status 2, no traceback, and nothing is sent
to the API server."""

from __future__ import annotations

import pytest

from omaticaya_py.core.config.settings import SettingsError, load_settings
from omaticaya_py.scheduler.settings import load_extender_settings
from tests.conftest import node_metadata
from tests.helpers import H100_TRACE
from tests.helpers import run_cli as cli

OWN = "expected a prefix this agent owns, like 'omaticaya.io'"

# (prefix, refused)
PREFIXES = [
    ("nvidia.com", True),  # GPU Feature Discovery's labels, the device plugin's resource
    ("gpu.nvidia.com", True),
    ("kubernetes.io", True),  # kubernetes.io/hostname, arch, os
    ("node.kubernetes.io", True),  # node.kubernetes.io/instance-type
    ("feature.node.kubernetes.io", True),  # node-feature-discovery
    ("k8s.io", True),
    ("node-role.k8s.io", True),
    ("NVIDIA.com/", True),  # case and a trailing slash do not get around it
    ("omaticaya.io", False),
    ("gpu.example.com", False),
    ("nvidia.community", False),  # not under nvidia.com
    ("mykubernetes.io", False),  # not under kubernetes.io
]


@pytest.mark.parametrize(("prefix", "refused"), PREFIXES, ids=[p for p, _ in PREFIXES])
def test_well_known_prefixes_are_refused(monkeypatch, prefix, refused):
    for load, var in ((load_settings, "OMATICAYA_PREFIX"), (load_extender_settings, "OMATICAYA_EXTENDER_PREFIX")):
        monkeypatch.setenv(var, prefix)
        if not refused:
            assert load().prefix == prefix.strip().rstrip("/")
            continue
        with pytest.raises(SettingsError) as err:
            load()
        line = str(err.value)
        assert "\n" not in line and line.startswith(f"invalid setting {var}={prefix!r}: {OWN}")
        monkeypatch.delenv(var)


@pytest.mark.cluster
def test_cleanup_with_a_foreign_prefix_exits_2_and_removes_nothing(dev_cluster, admin_api, make_node):
    node = make_node({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    before = node_metadata(admin_api, node)
    kc = str(dev_cluster.kubeconfig)
    for args, env, named in (
        (("cleanup", "--prefix", "nvidia.com"), {}, "--prefix='nvidia.com'"),
        (("cleanup",), {"OMATICAYA_PREFIX": "kubernetes.io"}, "OMATICAYA_PREFIX='kubernetes.io'"),
        (("once", "--trace", str(H100_TRACE), "--prefix", "node.kubernetes.io"), {},
         "--prefix='node.kubernetes.io'"),
    ):  # fmt: skip
        done = cli(*args, "--node", node, "--kubeconfig", kc, **env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and OWN in lines[0], done.stderr
    assert node_metadata(admin_api, node) == before


# ------------------------------------------------------------------- the campaign: values ----

#: (variable, value, expected text in the one-line error). Every one used to be accepted and
#: fail later: an infinite heartbeat overflowed the telemetry's expiry, an infinite jitter or a
#: 10^20-hour interval crashed APScheduler at start with a traceback.
BAD_VALUES = [
    ("OMATICAYA_HEARTBEAT_S", "inf", "finite number"),
    ("OMATICAYA_HEARTBEAT_S", "Infinity", "finite number"),
    ("OMATICAYA_HEARTBEAT_S", "1e300", "less than or equal to"),
    ("OMATICAYA_JITTER_S", "inf", "finite number"),
    ("OMATICAYA_JITTER_S", "1e12", "less than or equal to"),
    ("OMATICAYA_XID_QUIET_S", "inf", "finite number"),
    ("OMATICAYA_XID_QUIET_S", "nan", "finite number"),
    ("OMATICAYA_KUBE_TIMEOUT_S", "inf", "finite number"),
    ("OMATICAYA_KUBE_TIMEOUT_S", "1e9", "less than or equal to"),
    ("OMATICAYA_SHUTDOWN_TIMEOUT_S", "inf", "finite number"),
    ("OMATICAYA_HYSTERESIS_PCT", "nan", "finite number"),
    ("OMATICAYA_IDLE_UTILIZATION_PCT", "-inf", "finite number"),
    ("OMATICAYA_SCHEDULE", "@every 99999999999999999999h", "at most 366 days"),
    ("OMATICAYA_SCHEDULE", "", "expected a 5-field crontab"),
    ("OMATICAYA_SCHEDULE", "\t", "expected a 5-field crontab"),
    ("OMATICAYA_MEMORY_STEP_MIB", "1e400", "expected an integer"),
    ("OMATICAYA_MEMORY_STEP_MIB", "１０２４", "expected an integer"),  # full-width digits
    ("OMATICAYA_METRICS_PORT", "-1", "greater than or equal to 0"),
    ("OMATICAYA_PREFIX", "a" * 254, "at most 253 characters"),
    ("OMATICAYA_PREFIX", "omaticaya.io/sub", "DNS subdomain"),
    ("OMATICAYA_PREFIX", "", "DNS subdomain"),
    ("OMATICAYA_METRICS_ADDRESS", "localhost", "expected an IP address"),
    ("OMATICAYA_METRICS_ADDRESS", "", "expected an IP address"),
    ("NODE_NAME", "Gpu_Node", "expected a Node name"),
    ("NODE_NAME", "n" * 254, "expected a Node name"),
    ("OMATICAYA_XID_IGNORE", "13;31", "comma-separated list"),
]

EXTENDER_BAD_VALUES = [
    ("OMATICAYA_EXTENDER_TTL_S", "inf", "finite number"),
    ("OMATICAYA_EXTENDER_TTL_S", "nan", "finite number"),
    ("OMATICAYA_EXTENDER_GRACE_S", "inf", "finite number"),
    ("OMATICAYA_EXTENDER_GRACE_S", "1e300", "less than or equal to"),
    ("OMATICAYA_EXTENDER_PORT", "0", "greater than or equal to 1"),
    ("OMATICAYA_EXTENDER_PORT", "65536", "less than or equal to 65535"),
    ("OMATICAYA_EXTENDER_ADDRESS", "::ffff:not", "expected an IP address"),
    ("OMATICAYA_EXTENDER_STRATEGY", "", "'binpack' or 'spread'"),
    ("OMATICAYA_EXTENDER_PREFIX", "k8s.io", OWN),
]


@pytest.mark.parametrize(("var", "value", "expected"), BAD_VALUES + EXTENDER_BAD_VALUES,
                         ids=[f"{v}={x[:24]!r}" for v, x, _ in BAD_VALUES + EXTENDER_BAD_VALUES])  # fmt: skip
def test_bad_environment_value_is_one_line_naming_the_variable(monkeypatch, var, value, expected):
    monkeypatch.setenv(var, value)
    load = load_extender_settings if var.startswith("OMATICAYA_EXTENDER_") else load_settings
    with pytest.raises(SettingsError) as err:
        load()
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"invalid setting {var}="), line
    assert expected in line, line


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("show", "--trace", str(H100_TRACE), "--schedule", "@every 99999999999999999999h"), "--schedule"),
        (("show", "--trace", str(H100_TRACE), "--memory-step-mib", "-5"), "--memory-step-mib"),
        (("show", "--trace", str(H100_TRACE), "--prefix", "nvidia.com"), "--prefix"),
        (("show", "--trace", "/no/such/file"), "--trace"),
        (("run", "--node", "n1", "--trace", str(H100_TRACE), "--metrics-port", "http"), "--metrics-port"),
        (("extender", "--ttl-s", "inf"), "OMATICAYA_EXTENDER_TTL_S"),
        (("extender", "--port", "99999"), "OMATICAYA_EXTENDER_PORT"),
    ],
    ids=["schedule", "memory-step", "prefix", "trace", "metrics-port", "extender-ttl", "extender-port"],
)
def test_bad_flag_is_one_line_exit_2(args, flag):
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in done.stderr, done.stderr


# ------------------------------------------- the placement policy: one setting, two names ----

#: issue 38: the extender's strategy and the device plugin's share policy were two settings
#: (two chart values): set differently, the extender reserved a GPU the plugin would not hand
#: out. Both now read OMATICAYA_PLACEMENT_POLICY; the old names are still read.
POLICY = "OMATICAYA_PLACEMENT_POLICY"
OLD_STRATEGY = "OMATICAYA_EXTENDER_STRATEGY"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    import os

    for key in list(os.environ):
        if key.upper().startswith("OMATICAYA_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no .env but the test's
    return tmp_path


@pytest.mark.parametrize(
    ("env", "strategy"),
    [
        ({}, "binpack"),
        ({POLICY: "spread"}, "spread"),
        ({OLD_STRATEGY: "spread"}, "spread"),  # the old name alone: still read
        ({POLICY: "spread", OLD_STRATEGY: "Spread"}, "spread"),  # both, alike
        ({POLICY: "binpack", OLD_STRATEGY: "binpack"}, "binpack"),
        ({"omaticaya_placement_policy": "spread"}, "spread"),  # names are not case-sensitive
    ],
)
def test_the_extender_reads_the_placement_policy(clean_env, monkeypatch, env, strategy):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_extender_settings().placement_policy == strategy


@pytest.mark.parametrize(
    ("env", "dotenv"),
    [
        ({POLICY: "spread", OLD_STRATEGY: "binpack"}, ""),
        ({POLICY: "spread"}, f"{OLD_STRATEGY}=binpack\n"),  # one in .env, one in the environment
        ({}, f"{OLD_STRATEGY}=binpack\n{POLICY}=spread\n"),
    ],
    ids=["environment", "environment-and-dotenv", "dotenv"],
)
def test_both_names_set_differently_is_an_error_naming_both(clean_env, monkeypatch, env, dotenv):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (clean_env / ".env").write_text(dotenv)
    with pytest.raises(SettingsError) as err:
        load_extender_settings()
    line = str(err.value)
    assert "\n" not in line, line
    assert line == (
        f"invalid settings: {POLICY}='spread' and {OLD_STRATEGY}='binpack' differ: set {POLICY} "
        f"alone ({OLD_STRATEGY} is its old name), expected 'binpack' or 'spread'"
    )


def test_a_flag_wins_over_both_names(clean_env, monkeypatch):
    monkeypatch.setenv(POLICY, "spread")
    monkeypatch.setenv(OLD_STRATEGY, "binpack")
    assert load_extender_settings(placement_policy="spread").placement_policy == "spread"


@pytest.mark.parametrize("var", [POLICY, OLD_STRATEGY])
def test_a_bad_policy_names_the_variable_it_came_from(clean_env, monkeypatch, var):
    monkeypatch.setenv(var, "pack")
    with pytest.raises(SettingsError) as err:
        load_extender_settings()
    assert str(err.value) == f"invalid setting {var}='pack': Input should be 'binpack' or 'spread'"


def test_the_extender_says_both_names_differ_and_exits_2(tmp_path):
    done = cli("extender", "--port", "1", "--kubeconfig", str(tmp_path / "none"),
               OMATICAYA_PLACEMENT_POLICY="spread", OMATICAYA_EXTENDER_STRATEGY="binpack")
    assert done.returncode == 2, done.stderr
    assert POLICY in done.stderr and OLD_STRATEGY in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("cls_name", ["Settings", "ExtenderSettings", "MpsSettings"])
def test_a_keyword_no_setting_has_is_refused(cls_name):
    """A caller's misspelt or renamed keyword is a TypeError naming it, never dropped silently:
    ``strategy=`` for ``placement_policy`` once left a test's extender on binpack without a word
    (issue 49)."""
    from omaticaya_py.core.config.settings import Settings
    from omaticaya_py.mps.settings import MpsSettings
    from omaticaya_py.scheduler.settings import ExtenderSettings

    cls = {"Settings": Settings, "ExtenderSettings": ExtenderSettings, "MpsSettings": MpsSettings}[cls_name]
    with pytest.raises(TypeError, match="no setting named strategy"):
        cls(_env_file=None, strategy="spread")
    assert cls(_env_file=None, placement_policy="spread").placement_policy == "spread"
