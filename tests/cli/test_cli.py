"""The command line without an API server: exit codes and one-line errors."""

from __future__ import annotations

import pytest

from omaticaya_py.sources.nvml import nvml_available
from tests.helpers import H100_TRACE
from tests.helpers import run_cli as cli


@pytest.mark.skipif(nvml_available(), reason="needs a machine where NVML cannot start")
def test_fail_on_init_error_exits_1_when_nvml_cannot_start():
    done = cli("run", "--node", "n1", OMATICAYA_FAIL_ON_INIT_ERROR="true", OMATICAYA_METRICS_PORT="0")
    assert done.returncode == 1
    assert "NVML failed to start" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        pytest.param(("once",), {}, 2, "NODE_NAME is not set", id="once-without-node"),
        pytest.param(("show", "--trace-at", "3"), {}, 2, "--trace-at needs --trace", id="trace-at-alone"),
        pytest.param(
            ("show", "--trace", str(H100_TRACE)), {"OMATICAYA_SCHEDULE": "every 5 minutes"}, 2,
            "invalid setting OMATICAYA_SCHEDULE='every 5 minutes'", id="bad-schedule",
        ),
        pytest.param(
            ("once", "--dry-run", "--memory-step-mib", "lots"), {}, 2,
            "invalid setting --memory-step-mib='lots': expected an integer", id="bad-flag-named",
        ),
        pytest.param(
            ("show", "--trace", str(H100_TRACE)), {"OMATICAYA_MEMORY_STEP_MIB": "lots"}, 2,
            "invalid setting OMATICAYA_MEMORY_STEP_MIB='lots'", id="bad-env-named",
        ),
        pytest.param(
            ("once", "--node", "n1", "--trace", str(H100_TRACE), "--kubeconfig", "/nonexistent"),
            {}, 1, "no Kubernetes configuration", id="no-kubeconfig",
        ),
    ],
)
def test_bad_use_is_one_line_without_traceback(args, env, code, message):
    done = cli(*args, **env)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_show_prints_the_table_and_labels():
    done = cli("show", "--trace", str(H100_TRACE), "--trace-at", "14", "--schedule", "@every 2s")
    assert done.returncode == 0, done.stderr
    assert "NVIDIA H100 80GB HBM3" in done.stdout
    assert "omaticaya.io/gpu.utilization-pct=100" in done.stdout


def test_once_dry_run_without_api_prints_the_patch():
    done = cli("once", "--dry-run", "--trace", str(H100_TRACE), "--trace-at", "3")
    assert done.returncode == 0, done.stderr
    assert '"omaticaya.io/gpu.memory.free-mib": "80896"' in done.stdout
