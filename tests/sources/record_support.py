"""What other test files share of test_record.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import nvmltestlib


def record(
    tmp_path: Path,
    trace: Path | None,
    *args: str,
    speed: float | None = 1.0,
    sample_file: Path | None = None,
    faults: dict[str, str] | None = None,
):
    """``omaticaya record -o <tmp_path>/recorded.json ARGS`` over ``trace`` through the NVML
    test library (``nvmltestlib.testlib_env``); the finished process and the output path."""
    out = tmp_path / "recorded.json"
    done = subprocess.run(
        [sys.executable, "-m", "omaticaya_py", "record", "-o", str(out), *args],
        env=nvmltestlib.testlib_env(trace, sample_file, speed=speed, faults=faults),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, out
