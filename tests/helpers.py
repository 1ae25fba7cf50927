"""Small builders for the pure-stage tests: readings, snapshots, settings, expected label maps;
and the pieces every kind of test shares: the paths of ``tests/data``, a hand-driven ``Clock``,
``free_port``. (Waits: tests/waiting.py; the audit log: tests/audit.py; the chart: tests/chart.py.)

Defaults are a healthy, idle NVIDIA H100 80GB HBM3 as the real trace (``tests/data/h100-trace.json``)
records it: 81559 MiB total, 81079 MiB free, 40 C, 120 W, no ECC error, no remapped rows, no process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omaticaya_py.core.config.settings import Settings
from omaticaya_py.core.model.snapshot import GpuReading, NodeSnapshot, XidEvent
from omaticaya_py.core.publish.render import Desired, render
from omaticaya_py.core.rules.health import NodeHealth, XidPolicy, assess

DATA = Path(__file__).parent / "data"
H100_TRACE = DATA / "h100-trace.json"
FAULTS_TRACE = DATA / "faults-trace.json"
MULTI_TRACE = DATA / "multi-gpu-trace.json"
H100_MIG_TRACE = DATA / "h100-mig-trace.json"
MIG_MIXED_TRACE = DATA / "mig-mixed-trace.json"

H100 = "NVIDIA H100 80GB HBM3"
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
H100_TOTAL_MIB = 81559
H100_IDLE_FREE_MIB = 81079
READ_AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
PREFIX = "omaticaya.io"


def gpu(
    index: int = 0,
    memory_free_mib: int | None = H100_IDLE_FREE_MIB,
    utilization_pct: float | None = 0.0,
    **kw: Any,
) -> GpuReading:
    """A reading of one H100; any field can be overridden (``None``: NotSupported)."""
    fields: dict[str, Any] = {
        "uuid": f"GPU-{index:08d}-7fda-b7ae-a94e-630097a14ca4",
        "product": H100,
        "architecture": "hopper",
        "compute_major": 9,
        "compute_minor": 0,
        "memory_total_mib": H100_TOTAL_MIB,
        "memory_used_mib": None
        if memory_free_mib is None
        else H100_TOTAL_MIB - memory_free_mib,
        "memory_free_mib": memory_free_mib,
        "utilization_pct": utilization_pct,
        "memory_utilization_pct": 0.0,
        "temperature_c": 40,
        "power_w": 120.0,
        "performance_state": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_corrected_volatile": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "process_count": 0,
    }
    fields.update(kw)
    return GpuReading(index=index, **fields)


def lost(index: int, error: str = "NVMLError_GpuIsLost", **kw: Any) -> GpuReading:
    """A GPU whose read failed: only the index and the static facts are known."""
    fields: dict[str, Any] = {
        "uuid": f"GPU-{index:08d}-7fda-b7ae-a94e-630097a14ca4",
        "product": H100,
        "architecture": "hopper",
        "compute_major": 9,
        "compute_minor": 0,
    }
    fields.update(kw)
    return GpuReading(index=index, error=error, **fields)


def snapshot(
    *gpus: GpuReading,
    error: str | None = None,
    xid_events: Iterable[XidEvent] = (),
    clock_s: float = 100.0,
    cuda: tuple[int, int] | None = (13, 0),
    driver: str | None = "580.159.04",
    read_at: datetime = READ_AT,
) -> NodeSnapshot:
    """A node snapshot; with ``error`` (library failure) the GPUs are dropped, as readers do."""
    return NodeSnapshot(
        read_at=read_at,
        clock_s=clock_s,
        gpus=() if error else tuple(gpus),
        driver_version=None if error else driver,
        cuda_driver_version=None if error else cuda,
        error=error,
        xid_events=tuple(xid_events),
        source="test",
    )


def xid(index: int, code: int, at_s: float = 90.0) -> XidEvent:
    return XidEvent(index=index, xid=code, at_s=at_s)


def settings(**overrides: Any) -> Settings:
    """Settings from defaults plus ``overrides`` (no ``.env`` file read)."""
    return Settings(_env_file=None, **overrides)  # type: ignore[call-arg]


def policy_of(s: Settings) -> XidPolicy:
    """The Xid policy the agent derives from settings."""
    return XidPolicy(ignore=s.xid_ignore, all_fatal=s.xid_all_fatal, quiet_s=s.xid_quiet_s)


def evaluate(
    snap: NodeSnapshot,
    s: Settings | None = None,
    recent: Iterable[XidEvent] | None = None,
) -> tuple[NodeHealth, Desired]:
    """assess + render, the pure part of one tick. ``recent`` defaults to the snapshot's events."""
    s = s or settings()
    health = assess(snap, snap.xid_events if recent is None else recent, policy_of(s))
    return health, render(snap, health, s)


def rendered_labels(snap: NodeSnapshot, s: Settings | None = None, **kw: Any) -> dict[str, str]:
    return evaluate(snap, s, **kw)[1].labels


def prefixed(names: Mapping[str, str], prefix: str = PREFIX) -> dict[str, str]:
    """Short label names -> full keys under ``prefix``."""
    return {f"{prefix}/{k}": v for k, v in names.items()}


#: the driver and CUDA version labels (short names) of driver 580.159.04 with CUDA 13.0, what
#: ``snapshot()`` and the recorded traces give, under GPU Feature Discovery's current names
VERSIONS = {
    "cuda.driver-version.major": "580",
    "cuda.driver-version.minor": "159",
    "cuda.driver-version.revision": "04",
    "cuda.driver-version.full": "580.159.04",
    "cuda.runtime-version.major": "13",
    "cuda.runtime-version.minor": "0",
    "cuda.runtime-version.full": "13.0",
}


def h100_static(count: int, *, product: str = H100_LABEL, total: int = H100_TOTAL_MIB) -> dict[str, str]:
    """The hardware-fact labels of ``count`` H100s on driver 580.159.04, CUDA 13.0 (short names)."""
    return {
        "gpu.count": str(count),
        "gpu.product": product,
        "gpu.family": "hopper",
        "gpu.compute.major": "9",
        "gpu.compute.minor": "0",
        **VERSIONS,
        "gpu.memory.total-mib": str(total),
    }


class Clock:
    """A hand-driven monotonic clock: ``clock.t`` is what it says (seconds). Set ``t`` to move
    it, or pass ``clock.sleep`` as the code's sleep: it records each nap (``sleeps``, seconds)
    and moves the clock by it, so a wait that polls takes no real time."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS's pick; a server started
    soon after gets it unless another process races for it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """``python -m omaticaya_py ARGS`` as a user runs it, at most 60 s, exit status not checked.
    Its environment: ``env`` when given, else this process's without ``OMATICAYA_*`` and
    ``NODE_NAME`` (no setting leaks in from the test run); then ``extra`` on top."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_") and k != "NODE_NAME"}
    return subprocess.run(
        [sys.executable, "-m", "omaticaya_py", *args],
        env={**env, **extra}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def agent_pod_doc(name: str, node: str, service_account: str) -> dict[str, Any]:
    """A v1.Pod document standing for the agent's pod on ``node`` (``spec.nodeName`` set, no
    kubelet needed: it only has to exist, so that a token bound to it carries its Node), with
    ``service_account`` and no mounted token."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def token_kubeconfig(cluster: Any, token: str, path: Path) -> Path:
    """Write at ``path`` a kubeconfig that reaches ``cluster`` (its ``server`` and ``ca_file``,
    as ``DevCluster`` has them) with nothing but the bearer ``token`` (a ServiceAccount's);
    returns ``path``."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "dev", "cluster": {
            "server": cluster.server, "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": "sa"}}],
    }))  # fmt: skip
    return path
