"""The main job on the NVML path: ``omaticaya run`` **without** ``--trace`` reads the GPUs
through real ``pynvml`` from the NVML test library (the recorded H100 trace, 4x real time) and
labels a Node on the dev cluster's real kube-apiserver; the labels follow the load; SIGTERM
removes the dynamic ones and exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from omaticaya_py.core.schema import STATIC_NAMES
from tests import nvmltestlib
from tests.conftest import node_metadata
from tests.devcluster import REPO_ROOT
from tests.helpers import H100_TRACE
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        nvmltestlib.testlib_unavailable_reason() is not None,
        reason=str(nvmltestlib.testlib_unavailable_reason()),
    ),
]

P = "omaticaya.io/"




def test_run_without_trace_labels_a_node_from_nvml(dev_cluster, admin_api, make_node, tmp_path: Path):
    node = make_node()
    env = dict(dev_cluster.env(), NODE_NAME=node, PYTHONPATH=str(REPO_ROOT))
    env.update(
        {
            k: v
            for k, v in nvmltestlib.testlib_env(H100_TRACE, speed=4.0).items()
            if k == "LD_LIBRARY_PATH" or k.startswith("NVML_TESTLIB_")
        }
    )
    env.pop("OMATICAYA_TRACE", None)
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omaticaya_py", "run", "--schedule", "@every 500ms",
             "--metrics-port", "0"],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        def labels() -> dict[str, str]:
            return {k.removeprefix(P): v for k, v in node_metadata(admin_api, node)[0].items() if k.startswith(P)}

        first = wait_for("the agent's labels", lambda: labels().get("gpu.health") == "Healthy" and labels(), 30)
        assert first["gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert first["gpu.count"] == "1"
        telemetry = node_metadata(admin_api, node)[1][P + "telemetry"]
        assert '"source":"nvml"' in telemetry
        # the load allocates 30 GiB at t=8.2 s (about 2 s of real time at 4x), then runs at 100 %
        wait_for("free memory dropping under the load", lambda: labels().get("gpu.memory.free-mib") == "49152", 30)
        wait_for("utilisation at 100", lambda: labels().get("gpu.utilization-pct") == "100", 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text()
    left = {k.removeprefix(P) for k in node_metadata(admin_api, node)[0] if k.startswith(P)}
    assert left and left <= STATIC_NAMES, left
