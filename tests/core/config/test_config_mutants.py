"""``core.config`` cases that mutation testing (``scripts/mutation``) found no test pinned:
``Renamed``'s names in order; a ``Renamed`` setting whose names differ, for a ``Literal``, a
number and three names (the message's expected form, or none); keywords by a validation alias
(``CommonSettings.__init__``); the stuck-reading bound (``stuck_after_s``); the warnings'
whole words for an unknown or a former variable (``variables``); crontab weekdays
(names, steps on one day, the whole week, the errors' words); the triggers' time zone and
interval; the clock-step rules (``clock_step``, ``run_after_step``) at their edges
(tests/agent/test_clock_steps.py has their tables too, but is marked slow, so that mutation
testing never runs it).

The settings classes here are the tests' own (``T_*`` variables), so that the rules are pinned
for the forms no product setting has yet (a ``Literal`` or a plain-string alias)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal

import pytest
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from omaticaya_py.core.config.schedule import clock_step, parse_schedule, run_after_step
from omaticaya_py.core.config.settings import Settings, stuck_after_s
from omaticaya_py.core.config.settings_base import CommonSettings, Renamed, SettingsError, load
from omaticaya_py.core.config.variables import deprecated_variable_lines, unknown_variable_lines


class _Pick(CommonSettings):
    """A settings class with a ``Renamed`` setting of each form, and a plain-string alias."""

    model_config = SettingsConfigDict(env_prefix="T_", populate_by_name=True)

    mode: Literal["fast", "slow"] = Field(
        default="fast", validation_alias=Renamed("T_MODE", "T_OLD_MODE")
    )
    size: int = Field(default=1, validation_alias=Renamed("T_SIZE", "T_OLD_SIZE", "T_OLDER_SIZE"))
    plain: str = Field(default="a", validation_alias="T_PLAIN")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> pytest.MonkeyPatch:
    """No ``T_*``, ``OMATICAYA_*`` or ``NODE_NAME`` from outside, no ``.env``."""
    import os

    for key in list(os.environ):
        if key.upper().startswith(("T_", "OMATICAYA_", "NODE_NAME")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_renamed_names_are_the_new_one_then_the_old_ones() -> None:
    # built here, not at import: mutmut switches a mutant on after the test modules are read
    assert Renamed("A", "B", "C").names == ("A", "B", "C")
    assert Renamed("A").names == ("A",)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"T_MODE": "fast", "T_OLD_MODE": "slow"},
         "invalid settings: T_MODE='fast' and T_OLD_MODE='slow' differ: set T_MODE alone "
         "(T_OLD_MODE is its old name), expected 'fast' or 'slow'"),
        # not a Literal or an Enum: no expected form
        ({"T_SIZE": "2", "T_OLD_SIZE": "3"},
         "invalid settings: T_SIZE='2' and T_OLD_SIZE='3' differ: set T_SIZE alone "
         "(T_OLD_SIZE is its old name)"),
        # the new name not set: the old ones differ among themselves, and both are named old
        ({"T_OLD_SIZE": "3", "T_OLDER_SIZE": "4"},
         "invalid settings: T_OLD_SIZE='3' and T_OLDER_SIZE='4' differ: set T_SIZE alone "
         "(T_OLD_SIZE, T_OLDER_SIZE are its old names)"),
        ({"T_SIZE": "2", "T_OLD_SIZE": "3", "T_OLDER_SIZE": "3"},
         "invalid settings: T_SIZE='2' and T_OLD_SIZE='3' and T_OLDER_SIZE='3' differ: set "
         "T_SIZE alone (T_OLD_SIZE, T_OLDER_SIZE are its old names)"),
    ],
    ids=["literal", "number", "old-names-only", "three-names"],
)  # fmt: skip
def test_renamed_names_that_differ_are_one_line_each(env, given, expected) -> None:
    for key, value in given.items():
        env.setenv(key, value)
    with pytest.raises(SettingsError) as err:
        load(_Pick)
    assert str(err.value) == expected


def test_renamed_names_set_alike_are_read(env) -> None:
    env.setenv("T_MODE", "slow")
    env.setenv("T_OLD_MODE", " SLOW ")  # alike without regard to case and spaces
    env.setenv("T_OLD_SIZE", "7")
    assert (load(_Pick).mode, load(_Pick).size) == ("slow", 7)


def test_keywords_by_validation_alias_are_taken(env) -> None:
    """``CommonSettings.__init__`` refuses a keyword no setting has, but takes each alias of a
    setting: a plain string, ``Renamed``'s names (old ones too), ``AliasChoices``' names."""
    s = _Pick(_env_file=None, T_PLAIN="b", T_OLD_MODE="slow", T_SIZE=3)
    assert (s.plain, s.mode, s.size) == ("b", "slow", 3)
    agent = Settings(_env_file=None, NODE_NAME="node-a", OMATICAYA_SHARE_POLICY="spread")
    assert (agent.node_name, agent.placement_policy) == ("node-a", "spread")
    with pytest.raises(TypeError, match=r"^_Pick: no setting named T_NONE, t_plain$"):
        _Pick(_env_file=None, t_plain="b", T_NONE=1)


@pytest.mark.parametrize(
    ("schedule", "periods", "jitter_s", "expected_s"),
    [
        ("@every 10s", 3, 0, 30.0),
        ("@every 10s", 3, 5, 35.0),
        ("@every 4s", 2, 1.5, 9.5),
        ("*/5 * * * * ?", 1, 2, 7.0),
    ],
)
def test_stuck_after_s_is_periods_of_the_schedule_plus_the_jitter(
    env, schedule, periods, jitter_s, expected_s
) -> None:
    s = Settings(_env_file=None, schedule=schedule, stuck_tick_periods=periods, jitter_s=jitter_s)
    assert stuck_after_s(s) == expected_s


def test_variable_warnings_are_whole_sentences() -> None:
    assert unknown_variable_lines([("OMATICAYA_FOO", None)], "omaticaya run") == [
        "OMATICAYA_FOO is not a setting of omaticaya run and is ignored "
        "(docs/commands.md lists every setting)"
    ]
    assert deprecated_variable_lines(Settings, {"omaticaya_share_settle_s": "5"}) == [
        "OMATICAYA_SHARE_SETTLE_S is deprecated: it is read as OMATICAYA_SETTLE_S, the setting's "
        "one name (for the agent and the extender alike); rename it"
    ]


# ------------------------------------------------------------------------ crontab weekdays ----

WEEKDAY_FIELDS = [
    # (weekday field, APScheduler's day_of_week)
    ("Monday-Friday", "mon,tue,wed,thu,fri"),  # day names by their first three letters
    ("SUNDAY", "sun"),
    ("1/2", "mon,wed,fri"),  # a step from one day runs to Saturday, never past it
    ("5/1", "fri,sat"),
    ("0-6", "*"),  # the whole week, however spelt
    ("0-7", "*"),
    ("1-7", "*"),
    ("*/1", "*"),
    ("7", "sun"),
    ("*/3", "sun,wed,sat"),
]


@pytest.mark.parametrize(("field", "expected"), WEEKDAY_FIELDS, ids=[f for f, _ in WEEKDAY_FIELDS])
def test_crontab_weekday_field(field, expected) -> None:
    assert dict(parse_schedule(f"0 9 * * {field}").cron or ())["day_of_week"] == expected


BAD_WEEKDAYS = [
    ("xyz", "bad weekday 'xyz'"),
    ("1-2-3", "bad weekday '2-3'"),
    ("*/0", "bad weekday step in '*/0'"),
    ("1-5/x", "bad weekday step in '1-5/x'"),
    ("5-1", "reversed weekday range '5-1'"),
    ("sat-mon", "reversed weekday range 'sat-mon'"),
]


@pytest.mark.parametrize(("field", "message"), BAD_WEEKDAYS, ids=[f for f, _ in BAD_WEEKDAYS])
def test_bad_crontab_weekday_is_named(field, message) -> None:
    with pytest.raises(ValueError) as err:
        parse_schedule(f"0 9 * * {field}")
    assert str(err.value).startswith(f"{message}; expected a 5-field crontab"), str(err.value)


def test_triggers_are_in_the_time_zone_given() -> None:
    """A crontab's hours are the trigger's time zone's (UTC unless given), whatever the
    machine's; an interval trigger runs every ``interval_s``."""
    now = datetime(2024, 1, 1, 0, 30, tzinfo=timezone.utc)
    tokyo = timezone(timedelta(hours=9))  # a fixed offset: no time zone database needed
    cron = parse_schedule("0 9 * * *").trigger(timezone=tokyo)
    assert cron.timezone == tokyo
    assert cron.get_next_fire_time(None, now) == datetime(2024, 1, 2, 0, 0, tzinfo=timezone.utc)
    utc = parse_schedule("0 9 * * *").trigger()
    assert utc.get_next_fire_time(None, now) == datetime(2024, 1, 1, 9, 0, tzinfo=timezone.utc)
    every = parse_schedule("@every 30s").trigger(timezone=tokyo)
    assert every.timezone == tokyo
    assert every.interval == timedelta(seconds=30)


# ---------------------------------------------------------------------- clock-step rules ----


@pytest.mark.parametrize(
    ("before", "now", "step"),
    [
        (100.0, 103.0, 3.0),
        (100.0, 40.0, -60.0),
        (100.0, 100.5, 0.0),  # within STEP_TOLERANCE_S (0.5 s), its edge included: no step
        (100.0, 99.5, 0.0),
        (100.0, 100.25, 0.0),
        (100.0, 100.75, 0.75),
    ],
)
def test_clock_step_at_its_tolerance(before, now, step) -> None:
    assert clock_step(before, now) == step


#: now 1000 s, an 8 s interval and 2 s of slack: the next period ends at 1010 s (the horizon)
RUN_AFTER_STEP = [
    # (id, planned run, step, expected run)
    ("shifted by the step, within the period", 1001.0, 3.0, 1004.0),
    ("shifted to just before now (within tolerance): now", 1004.5, -5.0, 1000.0),
    ("shifted to the horizon exactly: kept", 1002.0, 8.0, 1010.0),
    ("shifted past the horizon, planned within: re-planned already", 1001.0, 20.0, 1001.0),
    ("no step, planned a moment ago (within tolerance): as planned", 999.75, 0.0, 999.75),
    ("no step, planned at the tolerance's edge", 999.5, 0.0, 999.5),
    ("no step, planned at the horizon's tolerance edge", 1010.5, 0.0, 1010.5),
    ("no step, planned too far ahead: the horizon", 1020.0, 0.0, 1010.0),
    ("neither within: shifted before now, clamped to now", 2000.0, -1500.0, 1000.0),
    ("neither within: shifted past the horizon, clamped to it", 500.0, 1000.0, 1010.0),
]


@pytest.mark.parametrize(
    ("planned", "step", "expected"),
    [c[1:] for c in RUN_AFTER_STEP],
    ids=[c[0] for c in RUN_AFTER_STEP],
)
def test_run_after_step_at_its_edges(planned, step, expected) -> None:
    assert run_after_step(planned, 1000.0, step, 8.0, 2.0) == expected


def test_run_after_step_has_no_slack_by_default() -> None:
    assert run_after_step(1020.0, 1000.0, 0.0, 8.0) == 1008.0
