"""MIG end to end on the real components: the MIG traces label a Node on the dev cluster's
kube-apiserver, replayed (``--trace``) and read through real ``pynvml`` from the NVML test
library (no ``--trace``: the path a GPU node takes); and ``omaticaya device-plugin`` without
``--trace`` serves the real kubelet v1.20 one resource per MIG profile, as NVIDIA's plugin does
under its ``mixed`` strategy.

`tests/data/mig-mixed-trace.json`: GPU 0 in seven 1g.10gb MIG devices (device 3 holds a 6 GiB
load; device 5 cannot be read for t in [8, 11)); GPU 1 whole; Xid 79 on GPU 0 at t=20 (a 3 s
quiet window here); the trace loops every ~26 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from omaticaya_py.core.schema import STATIC_NAMES
from tests import nvmltestlib  # (its testlib_env would be collected as a test if imported)
from tests.conftest import node_metadata
from tests.devcluster import REPO_ROOT, DevCluster
from tests.deviceplugin.mig_support import H100_MIG_AT_15
from tests.helpers import H100_MIG_TRACE as H100_MIG
from tests.helpers import MIG_MIXED_TRACE as MIG_MIXED
from tests.kubelet import (
    PLUGIN_DIR,
    default_service_account,
    kubelet_node,
    kubelet_pod,
    stop_plugin,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

P = "omaticaya.io/"
RESOURCE = "example.com/gpu"  # MIG profiles then are example.com/mig-<profile>
MIG_RESOURCE = "example.com/mig-1g.10gb"




def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omaticaya_py", *args],
        env=dict(env, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _nvml_vars(env: dict[str, str]) -> dict[str, str]:
    """The variables that point pynvml at the NVML test library."""
    return {k: v for k, v in env.items() if k == "LD_LIBRARY_PATH" or k.startswith("NVML_TESTLIB_")}


def _mig_labels(labels: dict[str, str]) -> dict[str, str]:
    """Our labels less the hardware facts and temperatures (the same with or without MIG)."""
    return {
        k.removeprefix(P): v
        for k, v in labels.items()
        if k.startswith(P)
        and k.removeprefix(P) not in STATIC_NAMES
        and not k.endswith("temperature-c")
    }


EXPECTED_H100_MIG_AT_15 = _mig_labels({f"{P}{k}": v for k, v in H100_MIG_AT_15.items()})


def test_mig_trace_labels_a_node_by_replay(dev_cluster, admin_api, make_node) -> None:
    node = make_node()
    env = dict(dev_cluster.env(), NODE_NAME=node)
    done = _cli("once", "--trace", str(H100_MIG), "--trace-at", "15", env=env)
    assert done.returncode == 0, done.stderr
    labels, annotations = node_metadata(admin_api, node)
    assert _mig_labels(labels) == EXPECTED_H100_MIG_AT_15
    assert not any("utilization" in k for k in labels if k.startswith(P))
    doc = json.loads(annotations[P + "telemetry"])
    assert [m["profile"] for m in doc["gpus"][0]["mig_devices"]] == ["3g.40gb", "2g.20gb", "2g.20gb"]


def test_mig_labels_a_node_through_real_pynvml(dev_cluster, admin_api, make_node, tmp_path) -> None:
    """No --trace: NvmlReader over the NVML test library serving the same trace, pinned at the
    sample of t=15 s; the Node gets the same labels as the replay."""
    doc = json.loads(H100_MIG.read_text())
    index = max(i for i, s in enumerate(doc["samples"]) if s["t"] <= 15.0)
    sample_file = tmp_path / "sample"
    sample_file.write_text(str(index))
    node = make_node()
    env = dict(dev_cluster.env(), NODE_NAME=node)
    env.update(_nvml_vars(nvmltestlib.testlib_env(H100_MIG, sample_file=sample_file)))
    done = _cli("once", env=env)
    assert done.returncode == 0, done.stderr
    labels, annotations = node_metadata(admin_api, node)
    assert _mig_labels(labels) == EXPECTED_H100_MIG_AT_15
    telemetry = json.loads(annotations[P + "telemetry"])
    assert telemetry["source"] == "nvml"
    assert [m["uuid"] for m in telemetry["gpus"][0]["mig_devices"]] == [
        m["uuid"] for m in doc["devices"][0]["mig_devices"]
    ]


# -- the device plugin on the real kubelet, from the NVML test library -------------------


@pytest.fixture(scope="module")
def kubelet(dev_cluster: DevCluster) -> Iterator[str]:
    nvmltestlib.build_testlib()
    yield from kubelet_node(dev_cluster)


class PluginProcess:
    """``omaticaya device-plugin`` without --trace: NVML is the test library (wall clock)."""

    def __init__(self, workdir: Path) -> None:
        self.log_path = workdir / "device-plugin.log"
        env = dict(
            nvmltestlib.testlib_env(MIG_MIXED),
            OMATICAYA_METRICS_PORT="0",
            OMATICAYA_XID_QUIET_S="3",
            OMATICAYA_LOG_LEVEL="INFO",
            PYTHONPATH=str(REPO_ROOT),
        )
        env.pop("OMATICAYA_TRACE", None)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "omaticaya_py", "device-plugin",
                    "--resource", RESOURCE, "--schedule", "@every 500ms",
                ],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return stop_plugin(self.proc)


@pytest.fixture(scope="module")
def plugin(kubelet: str) -> Iterator[PluginProcess]:
    p = PluginProcess(Path(tempfile.mkdtemp(prefix="omaticaya-mig-")))
    yield p
    p.stop()


def resources(admin_api, node: str) -> dict[str, tuple[int, int]]:
    """resource -> (capacity, allocatable) of ours on the Node."""
    status = admin_api.read_node(node).status
    cap, alloc = status.capacity or {}, status.allocatable or {}
    return {r: (int(cap.get(r, "0")), int(alloc.get(r, "0"))) for r in (RESOURCE, MIG_RESOURCE)}


def test_kubelet_gets_one_resource_per_mig_profile(admin_api, kubelet, plugin) -> None:
    got = wait_for(
        "whole GPU and seven 1g.10gb on the Node",
        lambda: resources(admin_api, kubelet)[MIG_RESOURCE][0] == 7
        and resources(admin_api, kubelet)[RESOURCE][0] == 1,
        60,
    )
    assert got, plugin.log()
    assert "device plugin registered example.com/mig-1g.10gb" in plugin.log()
    assert (PLUGIN_DIR / "omaticaya-example.com-mig-1g.10gb.sock").exists()


def test_mig_health_follows_the_parent_gpu_and_recovers(admin_api, kubelet, plugin) -> None:
    # Xid 79 on GPU 0 (t=20): every MIG device leaves allocatable, the whole GPU 1 stays
    wait_for(
        "all MIG devices unhealthy after the Xid",
        lambda: resources(admin_api, kubelet) == {RESOURCE: (1, 1), MIG_RESOURCE: (7, 0)},
        60,
    )
    # the quiet window (3 s) passes: all seven come back, without a restart
    wait_for(
        "MIG devices healthy again",
        lambda: resources(admin_api, kubelet)[MIG_RESOURCE] == (7, 7),
        30,
    )
    assert "healthy again" in plugin.log()


def test_a_pod_gets_a_mig_device(admin_api, kubelet, plugin) -> None:
    default_service_account(admin_api)
    wait_for("MIG allocatable", lambda: resources(admin_api, kubelet)[MIG_RESOURCE][1] >= 6, 30)
    out = Path(tempfile.mkdtemp(prefix="omaticaya-mig-out-"))
    name = "mig-pod"
    script = 'echo "$NVIDIA_VISIBLE_DEVICES" > /out/v; exec sleep 3600'
    body = kubelet_pod(name, kubelet, script, {MIG_RESOURCE: "1"}, out)
    admin_api.create_namespaced_pod("default", body)
    try:

        def visible() -> str | None:
            pod = admin_api.read_namespaced_pod(name, "default")
            if pod.status.phase == "Failed":  # admitted while an Xid was in the window: retry
                raise AssertionError(f"{name} failed: {pod.status.reason} {pod.status.message}")
            f = out / "v"
            return f.read_text().strip() if f.is_file() and f.read_text().strip() else None

        uuid = wait_for(f"{name} running with a MIG device", visible, 60)
        trace = json.loads(MIG_MIXED.read_text())
        assert uuid in {m["uuid"] for m in trace["devices"][0]["mig_devices"]}
    finally:
        admin_api.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_graceful_stop_removes_every_socket(plugin) -> None:
    assert plugin.stop() == 0
    assert not list(PLUGIN_DIR.glob("omaticaya-*.sock"))
