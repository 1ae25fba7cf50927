"""Issue 39: slices enforced by CUDA MPS, end to end on the chart's DaemonSet, on the full dev
cluster (real kubelet v1.37.2 + containerd 2, ``scripts/dev-cluster up --full``) and the image
of ``scripts/build-image``.

``helm install`` with the device plugin on, ``multi-gpu-trace.json`` (8 H100s, no GPU: the
image's stand-in ``nvidia-cuda-mps-control``), GPUs 0 and 1 shared (79 + 79 units of 1 GiB)
and ``sharing.enforcement: mps`` (the default): the DaemonSet's container ``mps`` runs one
control daemon per shared GPU under ``/run/omaticaya/mps`` on the host and goes Ready; then

- a busybox pod of 8 units runs as its GPU's MPS client: ``CUDA_MPS_PIPE_DIRECTORY`` is
  ``/run/omaticaya/mps/<its GPU's UUID>/pipe``, mounted at that path (it lists the daemon's
  ``control`` socket), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M``,
  ``OMATICAYA_GPU_MEMORY_LIMIT_MIB=8192``, and its ``/dev/shm`` is the host's
  ``/run/omaticaya/mps/shm`` tmpfs (a file it writes there is read on the host);
- the daemon of that GPU killed on the host (by its pid, found by its pipe folder): its 79
  units leave the Node's allocatable (fail closed) and come back once the supervisor has
  restarted it (a new pid), the pod still running;
- ``helm uninstall`` leaves neither ``/run/omaticaya/mps`` nor ``/run/omaticaya``, no tmpfs
  and no stand-in process.

Every wait is on a condition with a deadline; the figures printed are how long each took.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubelet import IMAGE
from tests.test_helm_install import (  # noqa: F401 - cluster and tools are fixtures
    CHART,
    NAMESPACE,
    RELEASE,
    Kube,
    cluster,
    tools,
    values_file,
    wait_for,
)
from tests.test_product_install import DEV_TAINT, running, uuid

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRACE = "multi-gpu-trace.json"
UNITS = "omaticaya.io/gpu-memory"
#: the chart's default root, and the parent the supervisor creates with it
ROOT = Path("/run/omaticaya/mps")
#: GPUs 0 and 1 of the trace: 81,559 MiB each, 79 units of 1 GiB
SHARED = (0, 1)
PER_GPU = 79
WORK = "mps-work"
MARK = "omaticaya-mps-test"


def allocatable(kube: Kube, node: str) -> int | None:
    got = (kube.json("get", "node", node)["status"].get("allocatable") or {}).get(UNITS)
    return None if got is None else int(got)


def standins(pipe: Path | None = None) -> dict[int, str]:
    """Host pid -> pipe folder of every stand-in control daemon running (of ``pipe`` only, if
    given), read from /proc: its command line names the stand-in, its environment the pipe."""
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(b"standin/nvidia-cuda-mps-control") for a in cmdline):
                continue
            env = dict(
                kv.split(b"=", 1)
                for kv in (proc / "environ").read_bytes().split(b"\0")
                if b"=" in kv
            )
        except OSError:  # gone meanwhile
            continue
        where = env.get(b"CUDA_MPS_PIPE_DIRECTORY", b"").decode()
        if pipe is None or where == str(pipe):
            out[int(proc.name)] = where
    return out


def tmpfs_mounts(under: Path) -> list[str]:
    """Mount points at or under ``under`` in this (the host's) mount namespace."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == str(under) or p.startswith(f"{under}/")]


def slice_pod(units: int) -> dict[str, Any]:
    """A busybox pod of ``units`` that prints what makes it an MPS client and writes a file to
    its /dev/shm."""
    script = (
        "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; echo MPS_LIMIT=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; "
        "echo LIMIT=$OMATICAYA_GPU_MEMORY_LIMIT_MIB; "
        "echo \"LS=$(ls $CUDA_MPS_PIPE_DIRECTORY | tr '\\n' ' ')\"; "
        f"echo from-the-pod > /dev/shm/{MARK} && echo WROTE=yes; sleep 3600"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "slice", "namespace": WORK},
        "spec": {
            "tolerations": [DEV_TAINT],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                            "resources": {"limits": {UNITS: str(units)}}}],
        },
    }  # fmt: skip


def printed(kube: Kube) -> dict[str, str]:
    out = kube.kubectl("-n", WORK, "logs", "slice", check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture
def mps_stack(cluster, tools, tmp_path) -> Iterator[tuple[Kube, str, dict[str, float]]]:  # noqa: F811
    helm, kubectl = tools
    node = cluster.start_full()
    assert not ROOT.parent.exists(), (
        f"{ROOT.parent} exists before the install (a run that did not clean up?): "
        "the test checks that the supervisor makes and removes it"
    )
    secrets_before = Path("/run/secrets").exists()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    dev = values_file(tmp_path, cluster, node, trace=TRACE, devicePlugin=True,
                      podResourcesSocket="off", sharing={"gpus": "0-1"})  # fmt: skip
    times: dict[str, float] = {}
    start = time.monotonic()
    kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
              "-f", str(dev), "--wait", "--timeout", "180s")  # fmt: skip
    times["install --wait (both containers Ready)"] = time.monotonic() - start
    try:
        yield kube, node, times
    finally:
        kube.kubectl("delete", "namespace", WORK, "--wait=true", "--timeout=60s", check=False)
        start = time.monotonic()
        kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s",
                  check=False)  # fmt: skip
        wait_for("the agent pods gone", lambda: not kube.pods(), timeout=90)
        times["uninstall until the pod is gone"] = time.monotonic() - start
        # the supervisor's SIGTERM cleanup: daemons stopped, tmpfs unmounted, folders removed
        assert standins() == {}, standins()
        assert tmpfs_mounts(ROOT.parent) == [], tmpfs_mounts(ROOT.parent)
        assert not ROOT.exists() and not ROOT.parent.exists(), sorted(
            str(p) for p in ROOT.parent.rglob("*")
        )
        # the ServiceAccount token of the mps container (/var/run is /run in the image) stayed
        # in the pod: nothing under the host's /run
        assert Path("/run/secrets").exists() == secrets_before
        print("[mps] " + "; ".join(f"{k}: {v:.1f} s" for k, v in times.items()))


def test_a_slice_is_its_gpus_mps_client_and_units_follow_the_daemon(mps_stack):
    kube, node, times = mps_stack
    (pod,) = kube.pods()
    ready = {c["name"]: c["ready"] for c in pod["status"]["containerStatuses"]}
    assert ready == {"agent": True, "mps": True}, ready
    pipes = {i: ROOT / uuid(i) / "pipe" for i in SHARED}
    # one daemon per shared GPU, under the host's root; the tmpfs reached the host
    assert {p for p in pipes.values() if (p / "control").is_socket()} == set(pipes.values())
    assert sorted(standins().values()) == sorted(map(str, pipes.values()))
    assert tmpfs_mounts(ROOT) == [str(ROOT / "shm")], tmpfs_mounts(ROOT)
    start = time.monotonic()
    wait_for("every unit allocatable", lambda: allocatable(kube, node) == PER_GPU * len(SHARED),
             timeout=60)  # fmt: skip
    times["units allocatable after Ready"] = time.monotonic() - start

    # --- a slice of 8 units: its GPU's MPS client
    kube.kubectl("create", "namespace", WORK)
    manifest = kube.cluster.state_dir / "mps-slice.json"
    manifest.write_text(json.dumps(slice_pod(8)))
    start = time.monotonic()
    kube.kubectl("apply", "-f", str(manifest))
    got = wait_for("the slice pod printed", lambda: (
        running(kube.json("-n", WORK, "get", "pod", "slice")) and "WROTE" in printed(kube)
        and printed(kube)), timeout=90)  # fmt: skip
    times["slice pod running and printed"] = time.monotonic() - start
    pipe = Path(got["PIPE"])
    (index,) = [i for i, p in pipes.items() if p == pipe]
    assert got["MPS_LIMIT"] == "0=8192M" and got["LIMIT"] == "8192", got
    assert "control" in got["LS"].split(), got
    # its /dev/shm is the host's <root>/shm
    assert (ROOT / "shm" / MARK).read_text() == "from-the-pod\n"

    # --- its daemon killed on the host: its GPU's units leave allocatable, then come back
    (pid,) = standins(pipe)
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    wait_for(f"GPU {index}'s units out of allocatable",
             lambda: allocatable(kube, node) == PER_GPU, timeout=60)  # fmt: skip
    times["units out after the kill"] = time.monotonic() - start
    start = time.monotonic()
    wait_for(f"GPU {index}'s daemon restarted", lambda: (
        [p for p in standins(pipe) if p != pid] and (pipe / "control").is_socket()),
        timeout=90)  # fmt: skip
    wait_for("its units back", lambda: allocatable(kube, node) == PER_GPU * len(SHARED),
             timeout=60)  # fmt: skip
    times["units back after that"] = time.monotonic() - start
    # the slice's pod never noticed (the stand-in serves no server it would have used)
    assert running(kube.json("-n", WORK, "get", "pod", "slice"))
