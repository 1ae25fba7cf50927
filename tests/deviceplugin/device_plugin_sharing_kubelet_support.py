"""What other test files share of test_device_plugin_sharing_kubelet.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import nvmltestlib
from tests.devcluster import REPO_ROOT, DevCluster
from tests.deviceplugin.device_plugin_sharing_support import UUID, write_sharing_trace
from tests.kubelet import (
    default_service_account,
    delete_pods,
    kubelet_node,
    kubelet_pod,
    stop_plugin,
)
from tests.waiting import wait_for

GPU = "nvidia.com/gpu"


MEM = "omaticaya.io/gpu-memory"


ENVS = ("NVIDIA_VISIBLE_DEVICES", "OMATICAYA_GPU_MEMORY_LIMIT_MIB", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


class Plugin:
    """The plugin process on NVML (the test library) and the sample it serves."""

    def __init__(self, workdir: Path) -> None:
        self.sample_file = workdir / "sample"
        self.serve(0)
        trace = write_sharing_trace(workdir / "sharing-trace.json")
        self.log_path = workdir / "device-plugin.log"
        env = dict(
            nvmltestlib.testlib_env(trace, sample_file=self.sample_file),
            OMATICAYA_METRICS_PORT="0",
            OMATICAYA_LOG_LEVEL="INFO",
            OMATICAYA_SHARED_GPUS="0-3",
            # no MPS daemon here (tests/mps/test_mps_cluster.py runs one): the units served as before
            OMATICAYA_SHARE_ENFORCEMENT="none",
            OMATICAYA_SETTLE_S="3600",
            PYTHONPATH=str(REPO_ROOT),
        )
        env.pop("OMATICAYA_TRACE", None)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "omaticaya_py", "device-plugin", "--schedule", "@every 500ms"],
                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )

    def serve(self, index: int) -> None:
        """Serve trace sample ``index`` from now on."""
        tmp = self.sample_file.with_suffix(".tmp")
        tmp.write_text(f"{index}\n")
        os.replace(tmp, self.sample_file)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return stop_plugin(self.proc)


@pytest.fixture(scope="module")
def kubelet(dev_cluster: DevCluster) -> Iterator[str]:
    nvmltestlib.build_testlib()
    yield from kubelet_node(dev_cluster)


@pytest.fixture(scope="module")
def plugin(kubelet: str) -> Iterator[Plugin]:
    p = Plugin(Path(tempfile.mkdtemp(prefix="omaticaya-share-")))
    yield p
    p.stop()


@pytest.fixture(scope="module")
def pods(admin_api, kubelet: str) -> Iterator[Callable[..., Path]]:
    """``make(name, resource, count) -> host file`` of a pod on the kubelet's Node whose
    container writes its GPU variables there; pods are deleted afterwards."""
    default_service_account(admin_api)
    out_root = Path(tempfile.mkdtemp(prefix="omaticaya-share-out-"))
    created: list[str] = []

    def make(name: str, resource: str, count: int) -> Path:
        out = out_root / name
        pattern = "|".join(ENVS)
        script = (
            f"env | grep -E '^({pattern})=' > /out/env.tmp; mv /out/env.tmp /out/env; "
            "exec sleep 3600"
        )
        body = kubelet_pod(name, kubelet, script, {resource: str(count)}, out,
                           labels={"app": "omaticaya-sharing-test"})  # fmt: skip
        admin_api.create_namespaced_pod("default", body)
        created.append(name)
        return out / "env"

    yield make
    delete_pods(admin_api, created)


def resources(admin_api, node: str) -> dict[str, tuple[int, int]]:
    """resource -> (capacity, allocatable) on the Node."""
    status = admin_api.read_node(node).status
    cap, alloc = status.capacity or {}, status.allocatable or {}
    return {r: (int(cap.get(r, "0")), int(alloc.get(r, "0"))) for r in (GPU, MEM)}


def running_env(admin_api, name: str, out: Path) -> dict[str, str] | None:
    pod = admin_api.read_namespaced_pod(name, "default")
    if pod.status.phase == "Failed":
        raise AssertionError(f"pod {name} failed: {pod.status.reason} {pod.status.message}")
    if pod.status.phase == "Running" and out.is_file():
        return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return None


def run(admin_api, pods, name: str, resource: str, count: int) -> dict[str, str]:
    out = pods(name, resource, count)
    try:
        return wait_for(f"{name} running", lambda: running_env(admin_api, name, out), 120)
    except AssertionError as exc:  # say where the pod stood: phase, conditions, containers
        pod = admin_api.read_namespaced_pod(name, "default")
        raise AssertionError(
            f"{exc}; phase {pod.status.phase}, conditions {pod.status.conditions}, containers "
            f"{pod.status.container_statuses}, output file there: {out.is_file()}"
        ) from None


def slice_of(env: dict[str, str]) -> tuple[int, int]:
    """(GPU index, MiB) a slice pod was given."""
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={env['OMATICAYA_GPU_MEMORY_LIMIT_MIB']}M"
    return UUID.index(env["NVIDIA_VISIBLE_DEVICES"]), int(env["OMATICAYA_GPU_MEMORY_LIMIT_MIB"])
