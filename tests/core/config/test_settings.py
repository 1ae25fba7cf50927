"""Settings: defaults, environment forms, .env, CLI overrides, schedule parsing, error messages."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from omaticaya_py.core.config.settings import (
    Schedule,
    Settings,
    SettingsError,
    load_settings,
    parse_schedule,
)
from omaticaya_py.core.model.sharing import SharedGpus
from tests.helpers import H100_TRACE

REPO = Path(__file__).resolve().parents[3]
OMATICAYA = REPO / ".venv" / "bin" / "omaticaya"
MONDAY = datetime(2024, 1, 1, 0, 0, 30, tzinfo=timezone.utc)  # 2024-01-01 is a Monday


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No OMATICAYA_* / NODE_NAME from the outside, and no stray .env: run in an empty dir."""
    for name in list(os.environ):
        if name.startswith("OMATICAYA_") or name == "NODE_NAME":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    s = load_settings()
    assert s.schedule == Schedule(text="@every 10s", interval_s=10.0)
    assert {
        name: getattr(s, name) for name in Settings.model_fields if name != "schedule"
    } == {
        "node_name": None,
        "prefix": "omaticaya.io",
        "memory_step_mib": 1024,
        "utilization_step_pct": 10,
        "idle_utilization_pct": 5,
        "temperature_step_c": 5,
        "hysteresis_pct": 20,
        "per_gpu_labels": True,
        "temperature_labels": False,
        "sm_active_labels": True,
        "cleanup_on_exit": True,
        "trace": None,
        "log_json": False,
        "log_level": "INFO",
        "xid_ignore": frozenset({13, 31, 43, 45, 68, 109}),
        "xid_all_fatal": False,
        "xid_quiet_s": 600,
        "jitter_s": 0,
        "heartbeat_s": 300,
        "stuck_tick_periods": 3,
        "min_patch_interval_s": 30,
        "telemetry_free_drop_mib": 256,
        "window_s": 300.0,
        "pod_resources_socket": Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        "proc_root": None,
        "out_of_band_event_mib": 1024,
        "metrics_port": 9402,
        "metrics_address": "0.0.0.0",
        "fail_on_init_error": False,
        "kube_timeout_s": 10,
        "shutdown_timeout_s": 20,
        "device_plugin": False,
        "device_plugin_resource": "nvidia.com/gpu",
        "device_plugin_dir": Path("/var/lib/kubelet/device-plugins"),
        "shared_gpus": SharedGpus(),
        "share_unit_mib": 1024,
        "shared_resource": "omaticaya.io/gpu-memory",
        "placement_policy": "binpack",
        "settle_s": 60,
        "device_list_strategy": ("envvar", "volume-mounts"),
        "share_enforcement": "mps",
        "slice_over_limit_action": "event",
        "mps_root": Path("/run/omaticaya/mps"),
        "mps_state_dir": Path("/run/omaticaya-mps-state"),
        "mps_thread_share": False,
        "mps_stale_s": 15,
        "dra": False,
        "dra_plugin_dir": Path("/var/lib/kubelet/plugins/gpu.omaticaya.io"),
        "dra_registry_dir": Path("/var/lib/kubelet/plugins_registry"),
        "dra_cdi_dir": Path("/var/run/cdi"),
        "dra_dev_root": Path("/dev"),
        "dra_taint_effect": "NoSchedule",
        "dra_driver_files": True,
        "dra_driver_root": Path("/"),
        "dra_driver_host_root": Path("/"),
    }


# --------------------------------------------------------------------------- valid env forms

VALID_ENV = [
    # (env var, value, field, expected)
    ("OMATICAYA_SCHEDULE", "*/5 * * * *", "schedule", parse_schedule("*/5 * * * *")),
    ("OMATICAYA_SCHEDULE", "@every 30s", "schedule", Schedule("@every 30s", interval_s=30.0)),
    ("NODE_NAME", "gpu-node-1", "node_name", "gpu-node-1"),
    ("OMATICAYA_NODE_NAME", "gpu-node-2.example.com", "node_name", "gpu-node-2.example.com"),
    ("OMATICAYA_PREFIX", "gpu.example.com", "prefix", "gpu.example.com"),
    ("OMATICAYA_PREFIX", "gpu.example.com/", "prefix", "gpu.example.com"),
    ("OMATICAYA_PREFIX", " omaticaya.io ", "prefix", "omaticaya.io"),
    ("OMATICAYA_MEMORY_STEP_MIB", "512", "memory_step_mib", 512),
    ("OMATICAYA_MEMORY_STEP_MIB", "1", "memory_step_mib", 1),
    ("OMATICAYA_UTILIZATION_STEP_PCT", "5", "utilization_step_pct", 5),
    ("OMATICAYA_UTILIZATION_STEP_PCT", "100", "utilization_step_pct", 100),
    ("OMATICAYA_IDLE_UTILIZATION_PCT", "2.5", "idle_utilization_pct", 2.5),
    ("OMATICAYA_TEMPERATURE_STEP_C", "1", "temperature_step_c", 1),
    ("OMATICAYA_HYSTERESIS_PCT", "0", "hysteresis_pct", 0),
    ("OMATICAYA_HYSTERESIS_PCT", "12.5", "hysteresis_pct", 12.5),
    ("OMATICAYA_IDLE_UTILIZATION_PCT", "0", "idle_utilization_pct", 0),
    ("OMATICAYA_PER_GPU_LABELS", "false", "per_gpu_labels", False),
    ("OMATICAYA_PER_GPU_LABELS", "0", "per_gpu_labels", False),
    ("OMATICAYA_PER_GPU_LABELS", "no", "per_gpu_labels", False),
    ("OMATICAYA_PER_GPU_LABELS", "off", "per_gpu_labels", False),
    ("OMATICAYA_PER_GPU_LABELS", "TRUE", "per_gpu_labels", True),
    ("OMATICAYA_PER_GPU_LABELS", "1", "per_gpu_labels", True),
    ("OMATICAYA_PER_GPU_LABELS", "yes", "per_gpu_labels", True),
    ("OMATICAYA_PER_GPU_LABELS", "on", "per_gpu_labels", True),
    ("OMATICAYA_TEMPERATURE_LABELS", "true", "temperature_labels", True),
    ("OMATICAYA_TEMPERATURE_LABELS", "false", "temperature_labels", False),
    ("OMATICAYA_SM_ACTIVE_LABELS", "true", "sm_active_labels", True),
    ("OMATICAYA_SM_ACTIVE_LABELS", "false", "sm_active_labels", False),
    ("OMATICAYA_CLEANUP_ON_EXIT", "false", "cleanup_on_exit", False),
    ("OMATICAYA_TRACE", str(H100_TRACE), "trace", H100_TRACE),
    ("OMATICAYA_TRACE", "", "trace", None),
    ("OMATICAYA_LOG_JSON", "true", "log_json", True),
    ("OMATICAYA_LOG_LEVEL", "DEBUG", "log_level", "DEBUG"),
    ("OMATICAYA_LOG_LEVEL", "WARNING", "log_level", "WARNING"),
    ("OMATICAYA_LOG_LEVEL", "debug", "log_level", "DEBUG"),
    ("OMATICAYA_XID_IGNORE", "13,31", "xid_ignore", frozenset({13, 31})),
    ("OMATICAYA_XID_IGNORE", "13 31, 43", "xid_ignore", frozenset({13, 31, 43})),
    ("OMATICAYA_XID_IGNORE", "", "xid_ignore", frozenset()),
    ("OMATICAYA_XID_ALL_FATAL", "true", "xid_all_fatal", True),
    ("OMATICAYA_XID_QUIET_S", "60.5", "xid_quiet_s", 60.5),
    ("OMATICAYA_XID_QUIET_S", "0", "xid_quiet_s", 0),
    ("OMATICAYA_HEARTBEAT_S", "30", "heartbeat_s", 30),
    ("OMATICAYA_STUCK_TICK_PERIODS", "5", "stuck_tick_periods", 5),
    ("OMATICAYA_MIN_PATCH_INTERVAL_S", "30", "min_patch_interval_s", 30),
    ("OMATICAYA_MIN_PATCH_INTERVAL_S", "0", "min_patch_interval_s", 0),
    ("OMATICAYA_TELEMETRY_FREE_DROP_MIB", "512", "telemetry_free_drop_mib", 512),
    ("OMATICAYA_TELEMETRY_FREE_DROP_MIB", "0", "telemetry_free_drop_mib", 0),
    ("OMATICAYA_WINDOW_S", "600", "window_s", 600),
    ("OMATICAYA_POD_RESOURCES_SOCKET", "/run/k/pr.sock", "pod_resources_socket", Path("/run/k/pr.sock")),
    ("OMATICAYA_POD_RESOURCES_SOCKET", "", "pod_resources_socket", None),
    ("OMATICAYA_PROC_ROOT", "/host/proc", "proc_root", Path("/host/proc")),
    ("OMATICAYA_OUT_OF_BAND_EVENT_MIB", "0", "out_of_band_event_mib", 0),
    ("OMATICAYA_WINDOW_S", "0", "window_s", 0),
    ("OMATICAYA_JITTER_S", "2.5", "jitter_s", 2.5),
    ("OMATICAYA_METRICS_PORT", "0", "metrics_port", 0),
    ("OMATICAYA_METRICS_PORT", "8080", "metrics_port", 8080),
    ("OMATICAYA_METRICS_ADDRESS", "127.0.0.1", "metrics_address", "127.0.0.1"),
    ("OMATICAYA_FAIL_ON_INIT_ERROR", "true", "fail_on_init_error", True),
    ("OMATICAYA_KUBE_TIMEOUT_S", "2.5", "kube_timeout_s", 2.5),
    ("OMATICAYA_SHUTDOWN_TIMEOUT_S", "8.5", "shutdown_timeout_s", 8.5),
    ("OMATICAYA_DEVICE_PLUGIN", "true", "device_plugin", True),
    ("OMATICAYA_DEVICE_PLUGIN_RESOURCE", "example.com/gpu", "device_plugin_resource", "example.com/gpu"),
    ("OMATICAYA_DEVICE_PLUGIN_DIR", "/tmp/dp", "device_plugin_dir", Path("/tmp/dp")),
    ("OMATICAYA_SHARED_GPUS", "all", "shared_gpus", SharedGpus(all=True)),
    ("OMATICAYA_SHARED_GPUS", "0-2", "shared_gpus", SharedGpus(indices=frozenset({0, 1, 2}))),
    ("OMATICAYA_SHARE_UNIT_MIB", "512", "share_unit_mib", 512),
    ("OMATICAYA_SHARED_RESOURCE", "example.com/vram", "shared_resource", "example.com/vram"),
    ("OMATICAYA_PLACEMENT_POLICY", "spread", "placement_policy", "spread"),
    ("OMATICAYA_SETTLE_S", "0", "settle_s", 0),
    ("OMATICAYA_DEVICE_LIST_STRATEGY", "cdi-annotations", "device_list_strategy", ("cdi-annotations",)),
    ("OMATICAYA_SHARE_ENFORCEMENT", "none", "share_enforcement", "none"),
    ("OMATICAYA_SLICE_OVER_LIMIT_ACTION", "evict", "slice_over_limit_action", "evict"),
    ("OMATICAYA_MPS_ROOT", "/var/run/mps", "mps_root", Path("/var/run/mps")),
    ("OMATICAYA_MPS_STATE_DIR", "/tmp/mps-state", "mps_state_dir", Path("/tmp/mps-state")),
    ("OMATICAYA_MPS_THREAD_SHARE", "true", "mps_thread_share", True),
    ("OMATICAYA_MPS_STALE_S", "30", "mps_stale_s", 30),
    ("OMATICAYA_DRA", "true", "dra", True),
    ("OMATICAYA_DRA_PLUGIN_DIR", "/k/plugins/gpu.omaticaya.io", "dra_plugin_dir",
     Path("/k/plugins/gpu.omaticaya.io")),
    ("OMATICAYA_DRA_REGISTRY_DIR", "/k/plugins_registry", "dra_registry_dir", Path("/k/plugins_registry")),
    ("OMATICAYA_DRA_CDI_DIR", "/etc/cdi", "dra_cdi_dir", Path("/etc/cdi")),
    ("OMATICAYA_DRA_DEV_ROOT", "/host/dev", "dra_dev_root", Path("/host/dev")),
    ("OMATICAYA_DRA_TAINT_EFFECT", "NoExecute", "dra_taint_effect", "NoExecute"),
    ("OMATICAYA_DRA_DRIVER_FILES", "false", "dra_driver_files", False),
    ("OMATICAYA_DRA_DRIVER_ROOT", "/host/driver-root", "dra_driver_root", Path("/host/driver-root")),
    ("OMATICAYA_DRA_DRIVER_HOST_ROOT", "/run/nvidia/driver", "dra_driver_host_root", Path("/run/nvidia/driver")),
]


@pytest.mark.parametrize(
    ("var", "value", "field", "expected"),
    VALID_ENV,
    ids=[f"{v}={val!r}" for v, val, _, _ in VALID_ENV],
)
def test_env_valid_forms(monkeypatch, var, value, field, expected) -> None:
    monkeypatch.setenv(var, value)
    assert getattr(load_settings(), field) == expected


def test_every_setting_has_a_valid_env_case() -> None:
    assert {field for _, _, field, _ in VALID_ENV} == set(Settings.model_fields)


def test_node_name_prefers_downward_api_name(monkeypatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    monkeypatch.setenv("OMATICAYA_NODE_NAME", "from-prefixed")
    assert load_settings().node_name == "from-downward-api"


def test_dotenv_file(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "OMATICAYA_SCHEDULE=@every 1m\nOMATICAYA_MEMORY_STEP_MIB=256\nNODE_NAME=node-a\n"
        "OMATICAYA_SOMETHING_ELSE=ignored\n",
        encoding="utf-8",
    )
    s = load_settings()
    assert (s.schedule.interval_s, s.memory_step_mib, s.node_name) == (60.0, 256, "node-a")


def test_env_wins_over_dotenv(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / ".env").write_text("OMATICAYA_MEMORY_STEP_MIB=256\n", encoding="utf-8")
    monkeypatch.setenv("OMATICAYA_MEMORY_STEP_MIB", "2048")
    assert load_settings().memory_step_mib == 2048


def test_cli_overrides_win_over_env_and_dotenv(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / ".env").write_text("OMATICAYA_SCHEDULE=@every 1m\nNODE_NAME=node-a\n")
    monkeypatch.setenv("OMATICAYA_SCHEDULE", "@every 20s")
    monkeypatch.setenv("OMATICAYA_PREFIX", "env.example.com")
    s = load_settings(schedule="*/5 * * * *", node_name="node-b", prefix=None)
    assert s.schedule == parse_schedule("*/5 * * * *")
    assert s.node_name == "node-b"
    assert s.prefix == "env.example.com"  # None override = flag not given: env stays


# --------------------------------------------------------------------------- schedules

SCHEDULES = [
    # (text, interval_s, cron fields or None)
    ("*/5 * * * *", None, {"second": "0", "minute": "*/5", "hour": "*", "day": "*", "month": "*", "day_of_week": "*"}),
    ("*/5 * * * * ?", None, {"second": "*/5", "minute": "*", "hour": "*", "day": "*", "month": "*", "day_of_week": "*"}),
    ("0 */2 * * * ?", None, {"second": "0", "minute": "*/2", "hour": "*", "day": "*", "month": "*", "day_of_week": "*"}),
    ("0 9 ? * 1-5", None, {"second": "0", "minute": "0", "hour": "9", "day": "*", "month": "*", "day_of_week": "mon,tue,wed,thu,fri"}),
    ("@hourly", None, {"second": "0", "minute": "0", "hour": "*", "day": "*", "month": "*", "day_of_week": "*"}),
    ("@daily", None, {"second": "0", "minute": "0", "hour": "0", "day": "*", "month": "*", "day_of_week": "*"}),
    ("@every 30s", 30.0, None),
    ("@every 1m30s", 90.0, None),
    ("@every 500ms", 0.5, None),
    ("@every 1h", 3600.0, None),
    ("@every 1.5s", 1.5, None),
    ("  @every 10s  ", 10.0, None),
]


@pytest.mark.parametrize(("text", "interval_s", "cron"), SCHEDULES, ids=[s[0].strip() for s in SCHEDULES])
def test_parse_schedule(text, interval_s, cron) -> None:
    sched = parse_schedule(text)
    assert sched.text == text.strip()
    assert sched.interval_s == interval_s
    assert (dict(sched.cron) if sched.cron else None) == cron
    assert isinstance(sched.trigger(), IntervalTrigger if interval_s else CronTrigger)


def _fire_times(spec: str, n: int, start: datetime = MONDAY) -> list[datetime]:
    trigger = parse_schedule(spec).trigger()
    out: list[datetime] = []
    prev, now = None, start
    for _ in range(n):
        nxt = trigger.get_next_fire_time(prev, now)
        out.append(nxt)
        prev, now = nxt, nxt + timedelta(microseconds=1)
    return out


FIRES = [
    ("*/5 * * * *", ["00:05:00", "00:10:00", "00:15:00"]),
    ("*/5 * * * * ?", ["00:00:30", "00:00:35", "00:00:40"]),
    ("15 * * * * ?", ["00:01:15", "00:02:15", "00:03:15"]),
    ("@hourly", ["01:00:00", "02:00:00", "03:00:00"]),
]


@pytest.mark.parametrize(("spec", "times"), FIRES, ids=[f[0] for f in FIRES])
def test_cron_fire_times(spec, times) -> None:
    assert [t.strftime("%H:%M:%S") for t in _fire_times(spec, 3)] == times


WEEKDAYS = [
    ("0 9 * * 0", ["Sun"] * 3),
    ("0 9 * * 7", ["Sun"] * 3),
    ("0 9 * * 1", ["Mon"] * 3),
    ("0 9 * * 6", ["Sat"] * 3),
    ("0 9 * * 1-5", ["Mon", "Tue", "Wed", "Thu", "Fri", "Mon", "Tue"]),
    ("0 9 * * 0-6", ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Mon"]),
    ("0 9 * * 0-7", ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "Mon"]),
    ("0 9 * * 5-7", ["Fri", "Sat", "Sun", "Fri"]),
    ("0 9 * * 0-2", ["Mon", "Tue", "Sun", "Mon"]),
    ("0 9 * * 6,0", ["Sat", "Sun", "Sat", "Sun"]),
    ("0 9 * * sun", ["Sun"] * 2),
    ("0 9 * * mon-fri", ["Mon", "Tue", "Wed", "Thu", "Fri", "Mon"]),
    ("0 0 9 * * 0", ["Sun"] * 2),  # 6 fields, seconds first
    pytest.param(
        "0 9 * * */2", ["Tue", "Thu", "Sat", "Sun", "Tue"],
        id="0 9 * * */2",
    ),
    pytest.param(
        "0 9 * * 1-5/2", ["Mon", "Wed", "Fri", "Mon"],
        id="0 9 * * 1-5/2",
    ),
    pytest.param(
        "0 9 * * 0-6/2", ["Tue", "Thu", "Sat", "Sun", "Tue"],
        id="0 9 * * 0-6/2",
    ),
]


@pytest.mark.parametrize(
    ("spec", "days"),
    WEEKDAYS,
    ids=[w[0] if isinstance(w, tuple) else None for w in WEEKDAYS],
)
def test_crontab_weekday_numbers_fire_on_the_right_day(spec, days) -> None:
    fires = _fire_times(spec, len(days))
    assert [t.strftime("%a") for t in fires] == days
    assert all(t.strftime("%H:%M:%S") == fires[0].strftime("%H:%M:%S") for t in fires)


PERIODS = [
    ("@every 30s", 30.0),
    ("@every 1m30s", 90.0),
    ("@every 500ms", 0.5),
    ("*/5 * * * *", 300.0),
    ("*/5 * * * * ?", 5.0),
    ("* * * * *", 60.0),
    ("@hourly", 3600.0),
    ("0 9 * * *", 86400.0),
]


@pytest.mark.parametrize(("spec", "period"), PERIODS, ids=[p[0] for p in PERIODS])
def test_period_s(spec, period) -> None:
    assert parse_schedule(spec).period_s() == period


BAD_SCHEDULES = [
    ("every 5 minutes", "crontab"),
    ("* * * *", "crontab"),
    ("* * * * * * *", "crontab"),
    ("@every", "crontab"),
    ("@every 5", "crontab"),
    ("@every 5x", "crontab"),
    ("@every 1m 30s", "crontab"),
    ("@every 50ms", "100ms"),
    ("@every 0s", "100ms"),
    ("61 * * * *", "crontab"),
    ("0 9 * * 8", "weekday out of range"),
    ("0 9 * * 1-9", "weekday out of range"),
    ("@fortnightly", "crontab"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_SCHEDULES, ids=[b[0] for b in BAD_SCHEDULES])
def test_parse_schedule_rejects(text, expected) -> None:
    with pytest.raises(ValueError, match=expected):
        parse_schedule(text)


# --------------------------------------------------------------------------- error messages

BAD_ENV = [
    # (env var, bad value, expected substring)
    ("OMATICAYA_SCHEDULE", "every 5 minutes", "crontab"),
    ("OMATICAYA_SCHEDULE", "@every 10ms", "at least 100ms"),
    ("OMATICAYA_SCHEDULE", "0 9 * * 8", "crontab"),
    ("NODE_NAME", "GPU_Node", "Node name"),
    ("OMATICAYA_NODE_NAME", "node name", "Node name"),
    ("OMATICAYA_PREFIX", "Omaticaya.IO", "DNS subdomain"),
    ("OMATICAYA_PREFIX", "a..b", "DNS subdomain"),
    ("OMATICAYA_PREFIX", "x" * 254, "DNS subdomain"),
    ("OMATICAYA_MEMORY_STEP_MIB", "lots", "expected an integer"),
    ("OMATICAYA_MEMORY_STEP_MIB", "0", "greater than or equal to 1"),
    ("OMATICAYA_UTILIZATION_STEP_PCT", "ten", "expected an integer"),
    ("OMATICAYA_UTILIZATION_STEP_PCT", "101", "less than or equal to 100"),
    ("OMATICAYA_UTILIZATION_STEP_PCT", "0", "greater than or equal to 1"),
    ("OMATICAYA_IDLE_UTILIZATION_PCT", "low", "expected a number"),
    ("OMATICAYA_IDLE_UTILIZATION_PCT", "-1", "greater than or equal to 0"),
    ("OMATICAYA_TEMPERATURE_STEP_C", "0", "greater than or equal to 1"),
    ("OMATICAYA_TEMPERATURE_STEP_C", "warm", "expected an integer"),
    ("OMATICAYA_HYSTERESIS_PCT", "60", "less than or equal to 50"),
    ("OMATICAYA_HYSTERESIS_PCT", "some", "expected a number"),
    ("OMATICAYA_TRACE", "/no/such/trace.json", "expected an existing trace file"),
    ("OMATICAYA_METRICS_ADDRESS", "everywhere", "expected an IP address"),
    ("OMATICAYA_PER_GPU_LABELS", "maybe", "expected true or false"),
    ("OMATICAYA_TEMPERATURE_LABELS", "warm", "expected true or false"),
    ("OMATICAYA_SM_ACTIVE_LABELS", "busy", "expected true or false"),
    ("OMATICAYA_CLEANUP_ON_EXIT", "sure", "expected true or false"),
    ("OMATICAYA_LOG_JSON", "yes please", "expected true or false"),
    ("OMATICAYA_LOG_LEVEL", "LOUD", "'DEBUG'"),
    ("OMATICAYA_XID_IGNORE", "13,abc", "comma-separated list of Xid numbers"),
    ("OMATICAYA_XID_IGNORE", "-1", "comma-separated list of Xid numbers"),
    ("OMATICAYA_XID_ALL_FATAL", "perhaps", "expected true or false"),
    ("OMATICAYA_XID_QUIET_S", "ten minutes", "expected a number"),
    ("OMATICAYA_XID_QUIET_S", "-5", "greater than or equal to 0"),
    ("OMATICAYA_HEARTBEAT_S", "0", "greater than 0"),
    ("OMATICAYA_STUCK_TICK_PERIODS", "0.5", "greater than or equal to 1"),
    ("OMATICAYA_JITTER_S", "-1", "greater than or equal to 0"),
    ("OMATICAYA_JITTER_S", "some", "expected a number"),
    ("OMATICAYA_HEARTBEAT_S", "often", "expected a number"),
    ("OMATICAYA_MIN_PATCH_INTERVAL_S", "-1", "greater than or equal to 0"),
    ("OMATICAYA_MIN_PATCH_INTERVAL_S", "soon", "expected a number"),
    ("OMATICAYA_TELEMETRY_FREE_DROP_MIB", "-1", "greater than or equal to 0"),
    ("OMATICAYA_TELEMETRY_FREE_DROP_MIB", "0.5Gi", "expected an integer"),
    ("OMATICAYA_WINDOW_S", "-5", "greater than or equal to 0"),
    ("OMATICAYA_OUT_OF_BAND_EVENT_MIB", "-1", "greater than or equal to 0"),
    ("OMATICAYA_OUT_OF_BAND_EVENT_MIB", "1GiB", "expected an integer"),
    ("OMATICAYA_PROC_ROOT", "proc", "expected an absolute path"),
    ("OMATICAYA_POD_RESOURCES_SOCKET", "kubelet.sock", "expected an absolute path"),
    ("OMATICAYA_WINDOW_S", "5m", "expected a number"),
    ("OMATICAYA_METRICS_PORT", "http", "expected an integer"),
    ("OMATICAYA_METRICS_PORT", "70000", "less than or equal to 65535"),
    ("OMATICAYA_FAIL_ON_INIT_ERROR", "nah", "expected true or false"),
    ("OMATICAYA_KUBE_TIMEOUT_S", "0", "greater than 0"),
    ("OMATICAYA_KUBE_TIMEOUT_S", "soon", "expected a number"),
    ("OMATICAYA_SHUTDOWN_TIMEOUT_S", "0", "greater than 0"),
    ("OMATICAYA_SHUTDOWN_TIMEOUT_S", "later", "expected a number"),
    ("OMATICAYA_DEVICE_PLUGIN", "maybe", "expected true or false"),
    ("OMATICAYA_DEVICE_PLUGIN_RESOURCE", "gpu", "extended resource name"),
    ("OMATICAYA_DEVICE_PLUGIN_RESOURCE", "kubernetes.io/gpu", "outside kubernetes.io"),
    ("OMATICAYA_DEVICE_PLUGIN_DIR", "device-plugins", "absolute folder path"),
    ("OMATICAYA_SHARED_GPUS", "gpu0", "GPU UUIDs like 'GPU-4a1b2c3d-...'"),
    ("OMATICAYA_SHARE_UNIT_MIB", "0", "greater than or equal to 1"),
    ("OMATICAYA_SHARED_RESOURCE", "vram", "extended resource name"),
    ("OMATICAYA_PLACEMENT_POLICY", "pack", "binpack"),
    ("OMATICAYA_SETTLE_S", "-1", "greater than or equal to 0"),
    ("OMATICAYA_DEVICE_LIST_STRATEGY", "volumes", "expected one or more of envvar"),
    ("OMATICAYA_SHARE_ENFORCEMENT", "hami", "'mps' or 'none'"),
    ("OMATICAYA_SLICE_OVER_LIMIT_ACTION", "delete", "'event' or 'evict'"),
    ("OMATICAYA_MPS_ROOT", "run/mps", "absolute folder path"),
    ("OMATICAYA_MPS_ROOT", "/var/lib/kubelet/plugins/omaticaya.io/mps/root", "at most 42 bytes"),
    ("OMATICAYA_MPS_STATE_DIR", "/run/../etc", "without '..'"),
    ("OMATICAYA_MPS_THREAD_SHARE", "maybe", "expected true or false"),
    ("OMATICAYA_MPS_STALE_S", "0", "greater than 0"),
    ("OMATICAYA_DRA", "maybe", "expected true or false"),
    ("OMATICAYA_DRA_PLUGIN_DIR", "plugins/gpu", "absolute folder path"),
    ("OMATICAYA_DRA_REGISTRY_DIR", "/var/lib/kubelet/../x", "without '..'"),
    ("OMATICAYA_DRA_CDI_DIR", "cdi", "absolute folder path"),
    ("OMATICAYA_DRA_DEV_ROOT", "dev", "absolute folder path"),
    ("OMATICAYA_DRA_TAINT_EFFECT", "PreferNoSchedule", "NoSchedule"),
    ("OMATICAYA_DRA_DRIVER_FILES", "maybe", "expected true or false"),
    ("OMATICAYA_DRA_DRIVER_ROOT", "run/nvidia/driver", "absolute folder path"),
    ("OMATICAYA_DRA_DRIVER_HOST_ROOT", "/run/../driver", "without '..'"),
]

#: Settings that accept any value, so no bad one exists.
NO_BAD_VALUE: set[str] = set()


@pytest.mark.parametrize(("var", "value", "expected"), BAD_ENV, ids=[f"{v}={x[:20]!r}" for v, x, _ in BAD_ENV])
def test_env_error_is_one_line_naming_the_variable(monkeypatch, var, value, expected) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    text = str(info.value)
    assert "\n" not in text
    shown = "NODE_NAME" if var == "OMATICAYA_NODE_NAME" else var
    assert text.startswith(f"invalid setting {shown}=")
    assert repr(value) in text
    assert expected in text


def test_every_setting_has_an_error_case() -> None:
    named = {v.removeprefix("OMATICAYA_").lower() for v, _, _ in BAD_ENV}
    assert named | NO_BAD_VALUE == set(Settings.model_fields)


def test_cli_override_error_names_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^invalid setting OMATICAYA_SCHEDULE='nope': .*crontab"):
        load_settings(schedule="nope")


def test_several_bad_settings_give_one_line_each(monkeypatch) -> None:
    monkeypatch.setenv("OMATICAYA_MEMORY_STEP_MIB", "0")
    monkeypatch.setenv("OMATICAYA_LOG_JSON", "maybe")
    monkeypatch.setenv("OMATICAYA_SCHEDULE", "never")
    with pytest.raises(SettingsError) as info:
        load_settings()
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert sorted(line.split("=")[0] for line in lines) == [
        "invalid setting OMATICAYA_LOG_JSON",
        "invalid setting OMATICAYA_MEMORY_STEP_MIB",
        "invalid setting OMATICAYA_SCHEDULE",
    ]


def test_bad_value_in_dotenv_is_reported(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("OMATICAYA_HEARTBEAT_S=-1\n")
    with pytest.raises(SettingsError, match="^invalid setting OMATICAYA_HEARTBEAT_S='-1': .*greater than 0$"):
        load_settings()


# --------------------------------------------------------------------------- the CLI


def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("OMATICAYA_") or k == "NODE_NAME")}
    env.update(extra)
    return env


CLI_BAD_ENV = [
    ("OMATICAYA_SCHEDULE", "every 5 minutes", "crontab"),
    ("OMATICAYA_MEMORY_STEP_MIB", "lots", "expected an integer"),
    ("OMATICAYA_PER_GPU_LABELS", "maybe", "expected true or false"),
    ("NODE_NAME", "Not A Node", "Node name"),
]


@pytest.mark.parametrize(("var", "value", "expected"), CLI_BAD_ENV, ids=[c[0] for c in CLI_BAD_ENV])
def test_cli_bad_env_exits_2_with_one_line(tmp_path: Path, var, value, expected) -> None:
    exe = [str(OMATICAYA)] if OMATICAYA.exists() else [sys.executable, "-m", "omaticaya_py"]
    proc = subprocess.run(
        [*exe, "show", "--trace", str(H100_TRACE)],
        cwd=tmp_path,
        env=_cli_env(**{var: value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"omaticaya: invalid setting {var}=")
    assert expected in lines[0]
    assert proc.stdout == ""


@pytest.mark.parametrize("text", ["@every 10s", "*/5 * * * * ?"])
def test_trigger_jitter(text: str) -> None:
    assert parse_schedule(text).trigger(jitter_s=2.5).jitter == 2.5
    assert parse_schedule(text).trigger().jitter is None


def test_dra_and_the_device_plugin_together_are_refused(monkeypatch) -> None:
    """A GPU is served by one of the two on a node: both on is a clear error naming both."""
    monkeypatch.setenv("OMATICAYA_DRA", "true")
    monkeypatch.setenv("OMATICAYA_DEVICE_PLUGIN", "true")
    with pytest.raises(SettingsError, match="OMATICAYA_DRA and OMATICAYA_DEVICE_PLUGIN"):
        load_settings()
    monkeypatch.setenv("OMATICAYA_DEVICE_PLUGIN", "false")
    assert load_settings().dra is True
