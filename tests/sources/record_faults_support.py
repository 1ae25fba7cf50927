"""What other test files share of test_record_faults.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omaticaya_py.sources.replay import load_trace
from tests.nvmltestlib import (
    NvmlWorker,
    nvml_worker_fixture,  # noqa: F401  (fixture)
    testlib_fixture,  # noqa: F401  (fixture)
)


def record_steps(
    worker: NvmlWorker, n: int, tmp_path: Path
) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """Step the trace through its ``n`` samples, one ``Recorder.sample`` each; the samples,
    the document after ``close`` (validated as a trace) and the readings."""
    samples = []
    for i in range(n):
        worker.advance(i)
        samples.append(worker.request({"cmd": "record", "t": float(i)})["sample"])
    closed = worker.request({"cmd": "record_close"})
    out = tmp_path / "recorded.json"
    out.write_text(json.dumps(closed["doc"]))
    load_trace(out)  # what it wrote is a trace (raises TraceError otherwise)
    return samples, closed["doc"], closed["readings"]
