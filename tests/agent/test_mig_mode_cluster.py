"""MIG mode turned on and off under a running agent (issue 48, item 4), on the dev cluster:
``omaticaya run`` **without** ``--trace`` reads two H100s through real ``pynvml`` from the NVML
test library (tests/agent/test_mig_mode.py's trace: GPU 0 in seven 1g.10gb MIG devices; GPU 1 whole,
then MIG on, then off again, moved by the sample file); the Node's labels and telemetry
annotation follow each change without a restart. The write budget is off
(``OMATICAYA_MIN_PATCH_INTERVAL_S=0``) so that each change is written at its tick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import nvmltestlib
from tests.agent.mig_mode_support import GPU1_MIG_UUIDS, OFF, ON, trace
from tests.conftest import node_metadata
from tests.devcluster import REPO_ROOT
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        nvmltestlib.testlib_unavailable_reason() is not None,
        reason=str(nvmltestlib.testlib_unavailable_reason()),
    ),
]

P = "omaticaya.io/"


def test_a_running_agent_publishes_a_mig_mode_turned_on_and_off(
    dev_cluster, admin_api, make_node, tmp_path: Path
) -> None:
    node = make_node()
    path = trace(tmp_path / "t.json", OFF, [OFF, ON, OFF])
    sample_file = tmp_path / "sample"
    sample_file.write_text("0\n")
    env = dict(dev_cluster.env(), NODE_NAME=node, PYTHONPATH=str(REPO_ROOT))
    env.update(
        {
            k: v
            for k, v in nvmltestlib.testlib_env(path, sample_file=sample_file).items()
            if k == "LD_LIBRARY_PATH" or k.startswith("NVML_TESTLIB_")
        }
    )
    env.pop("OMATICAYA_TRACE", None)
    env["OMATICAYA_MIN_PATCH_INTERVAL_S"] = "0"

    def advance(index: int) -> None:
        tmp = sample_file.with_suffix(".tmp")
        tmp.write_text(f"{index}\n")
        os.replace(tmp, sample_file)

    def state() -> tuple[dict[str, str], list[str] | None]:
        """The Node's labels under the prefix, and GPU 1's MIG devices in the telemetry."""
        labels, annotations = node_metadata(admin_api, node)
        doc = json.loads(annotations.get(P + "telemetry", "{}"))
        gpu = next((g for g in doc.get("gpus", []) if g.get("index") == 1), None)
        migs = [m["uuid"] for m in gpu.get("mig_devices", [])] if gpu is not None else None
        return {k.removeprefix(P): v for k, v in labels.items() if k.startswith(P)}, migs

    def whole() -> bool:
        labels, migs = state()
        return (
            labels.get("mig-1g.10gb.count") == "7"
            and "gpu-1.mig.enabled" not in labels
            and labels.get("gpu.healthy-count") == "8"
            and migs == []
        )

    def split() -> bool:
        labels, migs = state()
        return (
            labels.get("mig-1g.10gb.count") == "14"
            and labels.get("gpu-1.mig.enabled") == "true"
            and labels.get("gpu.healthy-count") == "14"
            and migs == GPU1_MIG_UUIDS
        )

    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omaticaya_py", "run", "--schedule", "@every 500ms",
             "--metrics-port", "0"],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for("GPU 1 published whole", whole, 30)
        advance(1)
        wait_for("GPU 1 published in seven MIG devices", split, 30)
        advance(2)
        wait_for("GPU 1 published whole again", whole, 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()
    assert "MIG mode now on (was off)" in log.read_text()
