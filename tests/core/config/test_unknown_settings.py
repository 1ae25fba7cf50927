"""An ``OMATICAYA_*`` variable that no setting reads is said at start, with the closest known
name (issue 31: ``OMATICAYA_SHEDULE`` did nothing, silently); the program goes on with the
defaults. Table-driven on the pure rule, then as a user runs each command."""

from __future__ import annotations

import pytest

from omaticaya_py.core.config.settings import Settings
from omaticaya_py.core.config.settings_base import env_names
from omaticaya_py.core.config.variables import (
    NOT_SETTINGS,
    unknown_variable_lines,
    unknown_variables,
)
from omaticaya_py.scheduler.settings import ExtenderSettings
from tests.helpers import H100_TRACE, run_cli

AGENT = env_names(Settings)
EXTENDER = env_names(ExtenderSettings)


def test_env_names_are_the_variables_the_settings_read():
    assert {"OMATICAYA_SCHEDULE", "OMATICAYA_SHARED_GPUS", "OMATICAYA_PREFIX", "NODE_NAME"} <= AGENT
    assert {"OMATICAYA_EXTENDER_PORT", "OMATICAYA_EXTENDER_PREFIX"} <= EXTENDER
    # the settings both sides read (issues 38, 49): the placement section, one name per fact
    # (and the former names, still read)
    assert AGENT & EXTENDER == {
        "OMATICAYA_PLACEMENT_POLICY", "OMATICAYA_SHARE_POLICY", "OMATICAYA_EXTENDER_STRATEGY",
        "OMATICAYA_SETTLE_S", "OMATICAYA_SHARE_SETTLE_S", "OMATICAYA_EXTENDER_SETTLE_S",
        "OMATICAYA_SHARED_RESOURCE", "OMATICAYA_EXTENDER_SHARED_RESOURCE",
        "OMATICAYA_DEVICE_PLUGIN_RESOURCE", "OMATICAYA_EXTENDER_DEVICE_PLUGIN_RESOURCE",
    }
    assert not (AGENT | EXTENDER) & NOT_SETTINGS


@pytest.mark.parametrize(
    ("environ", "known", "others", "expected"),
    [
        ({"OMATICAYA_SHEDULE": "x"}, AGENT, (), [("OMATICAYA_SHEDULE", "OMATICAYA_SCHEDULE")]),
        ({"OMATICAYA_SHARED_GPU": "all"}, AGENT, (),
         [("OMATICAYA_SHARED_GPU", "OMATICAYA_SHARED_GPUS")]),
        ({"OMATICAYA_METRIC_PORT": "1"}, AGENT, (),
         [("OMATICAYA_METRIC_PORT", "OMATICAYA_METRICS_PORT")]),
        # nothing alike: said without a guess (the shared prefix does not make names alike)
        ({"OMATICAYA_FOO": "1"}, AGENT, (), [("OMATICAYA_FOO", None)]),
        # known, not ours to judge, or ours but no setting: not said
        ({"OMATICAYA_SCHEDULE": "x", "NODE_NAME": "n", "PATH": "/bin"}, AGENT, (), []),
        ({"OMATICAYA_EXTENDER_PROT": "1"}, AGENT, ("OMATICAYA_EXTENDER_",), []),
        ({"OMATICAYA_DEV_DIR": "/tmp", "OMATICAYA_GPU_MEMORY_LIMIT_MIB": "1"}, AGENT, (), []),
        # the extender knows both sets and judges its own names too
        ({"OMATICAYA_EXTENDER_PROT": "1", "OMATICAYA_SCHEDULE": "x"}, AGENT | EXTENDER, (),
         [("OMATICAYA_EXTENDER_PROT", "OMATICAYA_EXTENDER_PORT")]),
        # names are case-insensitive (pydantic-settings): a mixed-case spelling of a known
        # variable is applied, so it is said as a spelling of the known name, never as ignored
        ({"OMATICAYA_Memory_Step_MIB": "2048"}, AGENT, (),
         [("OMATICAYA_Memory_Step_MIB", "OMATICAYA_MEMORY_STEP_MIB")]),
        ({"omaticaya_schedule": "@every 5s", "Node_Name": "n"}, AGENT, (),
         [("omaticaya_schedule", "OMATICAYA_SCHEDULE")]),
        ({"omaticaya_extender_prot": "1"}, AGENT, ("OMATICAYA_EXTENDER_",), []),
        ({"omaticaya_shedule": "x"}, AGENT, (), [("omaticaya_shedule", "OMATICAYA_SCHEDULE")]),
        # sorted by name
        ({"OMATICAYA_ZZ": "1", "OMATICAYA_AA": "1"}, AGENT, (),
         [("OMATICAYA_AA", None), ("OMATICAYA_ZZ", None)]),
    ],
)  # fmt: skip
def test_unknown_variables(environ, known, others, expected):
    assert unknown_variables(environ, known, others=others) == expected


def test_a_mixed_case_spelling_is_said_as_applied_not_ignored():
    """Issue 38: ``OMATICAYA_Memory_Step_MIB=2048`` was applied (pydantic-settings reads names
    case-insensitively) yet reported as ignored."""
    lines = unknown_variable_lines(
        unknown_variables({"OMATICAYA_Memory_Step_MIB": "2048", "OMATICAYA_SHEDULE": "x"}, AGENT),
        "omaticaya run",
    )
    assert lines == [
        "OMATICAYA_Memory_Step_MIB is read as OMATICAYA_MEMORY_STEP_MIB (names are not "
        "case-sensitive); spell it OMATICAYA_MEMORY_STEP_MIB",
        "OMATICAYA_SHEDULE is not a setting of omaticaya run and is ignored; did you mean "
        "OMATICAYA_SCHEDULE?",
    ]


def test_a_mixed_case_spelling_is_applied(monkeypatch, tmp_path):
    """What the report says is what the settings do: the mixed-case spelling is applied."""
    from omaticaya_py.core.config.settings import load_settings

    monkeypatch.chdir(tmp_path)  # no .env
    monkeypatch.setenv("OMATICAYA_Memory_Step_MIB", "2048")
    assert load_settings().memory_step_mib == 2048


def test_the_agent_says_a_misspelt_variable_and_goes_on():
    result = run_cli("show", "--trace", str(H100_TRACE), "--trace-at", "14",
                     OMATICAYA_SHEDULE="@every 5s", OMATICAYA_POD_RESOURCES_SOCKET="")
    assert result.returncode == 0, result.stderr
    assert ("OMATICAYA_SHEDULE is not a setting of omaticaya show and is ignored; did you mean "
            "OMATICAYA_SCHEDULE?") in result.stderr
    assert "gpu" in result.stdout  # the table, as without the variable


def test_the_extender_says_a_misspelt_variable(tmp_path):
    # no kubeconfig: the extender ends with exit 1 after its start-up lines
    result = run_cli("extender", "--port", "1", "--kubeconfig", str(tmp_path / "none"),
                     OMATICAYA_EXTENDER_STRATEGI="spread")
    assert ("OMATICAYA_EXTENDER_STRATEGI is not a setting of omaticaya extender and is "
            "ignored; did you mean OMATICAYA_EXTENDER_STRATEGY?") in result.stderr


# ---------------------------------------------------------------------------------------------
# former names (issue 49: one name per fact; the old ones still read, with a warning)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "environ", "expected"),
    [
        (Settings, {}, []),
        (Settings, {"OMATICAYA_SETTLE_S": "5", "OMATICAYA_PLACEMENT_POLICY": "spread"}, []),
        (Settings, {"OMATICAYA_SHARE_SETTLE_S": "5"}, ["OMATICAYA_SHARE_SETTLE_S:OMATICAYA_SETTLE_S"]),
        (ExtenderSettings, {"OMATICAYA_EXTENDER_SETTLE_S": "5", "OMATICAYA_EXTENDER_STRATEGY": "spread"},
         ["OMATICAYA_EXTENDER_SETTLE_S:OMATICAYA_SETTLE_S",
          "OMATICAYA_EXTENDER_STRATEGY:OMATICAYA_PLACEMENT_POLICY"]),
        # as pydantic-settings reads them: without regard to case (a .env's names come lowered)
        (ExtenderSettings, {"omaticaya_extender_shared_resource": "a.io/b"},
         ["OMATICAYA_EXTENDER_SHARED_RESOURCE:OMATICAYA_SHARED_RESOURCE"]),
        (ExtenderSettings, {"OMATICAYA_EXTENDER_DEVICE_PLUGIN_RESOURCE": "a.io/gpu"},
         ["OMATICAYA_EXTENDER_DEVICE_PLUGIN_RESOURCE:OMATICAYA_DEVICE_PLUGIN_RESOURCE"]),
    ],
)  # fmt: skip
def test_a_former_name_is_said_with_the_new_one(cls, environ, expected):
    from omaticaya_py.core.config.variables import deprecated_variable_lines

    lines = deprecated_variable_lines(cls, environ)
    assert len(lines) == len(expected)
    for line, pair in zip(lines, expected, strict=True):
        old, new = pair.split(":")
        assert line.startswith(f"{old} is deprecated: it is read as {new}"), line


def test_the_extender_reads_and_warns_of_its_former_names(tmp_path, monkeypatch):
    """A user upgrading with the extender's former variables: each former name is said once at
    start, naming the new one, and the values still apply."""
    old_env = {"OMATICAYA_EXTENDER_STRATEGY": "spread", "OMATICAYA_EXTENDER_SETTLE_S": "7"}
    result = run_cli("extender", "--port", "1", "--kubeconfig", str(tmp_path / "none"), **old_env)
    for old, new in (("OMATICAYA_EXTENDER_STRATEGY", "OMATICAYA_PLACEMENT_POLICY"),
                     ("OMATICAYA_EXTENDER_SETTLE_S", "OMATICAYA_SETTLE_S")):  # fmt: skip
        assert result.stderr.count(f"{old} is deprecated: it is read as {new}") == 1, result.stderr
    from omaticaya_py.scheduler.settings import load_extender_settings

    monkeypatch.chdir(tmp_path)  # no .env
    for key, value in old_env.items():
        monkeypatch.setenv(key, value)
    s = load_extender_settings()
    assert (s.placement_policy, s.settle_s) == ("spread", 7)
