"""What other test files share of test_attribution_publish.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.helpers import MULTI_TRACE

MIB = 1024 * 1024


POD_UID = "0b3a4f6e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


CONTAINER_ID = "a" * 64


IN_POD_PID, OUT_OF_BAND_PID, GONE_PID = 4242, 4343, 4444


IN_POD_MIB, OUT_OF_BAND_MIB = 10240, 6144


def trace_with_processes(tmp_path: Path) -> tuple[Path, list[str]]:
    """The multi-GPU trace's first sample, held still, GPU 0 running three processes (in a pod,
    in no pod, gone before its cgroup was read); the GPUs' UUIDs."""
    doc = json.loads(MULTI_TRACE.read_text())
    first = copy.deepcopy(doc["samples"][0])
    gpu0 = first["gpus"][0]
    gpu0["compute_processes"] = [
        {"pid": IN_POD_PID, "usedGpuMemory": IN_POD_MIB * MIB},
        {"pid": OUT_OF_BAND_PID, "usedGpuMemory": OUT_OF_BAND_MIB * MIB},
    ]
    total = gpu0["memory_bytes"]["total"]
    used = (IN_POD_MIB + OUT_OF_BAND_MIB + 512) * MIB
    gpu0["memory_bytes"] = {"total": total, "used": used, "free": total - used}
    gpu0.pop("memory_v2_bytes", None)
    samples = []
    for t in range(4):
        s = copy.deepcopy(first)
        s["t"] = float(t)
        samples.append(s)
    doc.update(samples=samples, phases=[])
    path = tmp_path / "processes.json"
    path.write_text(json.dumps(doc))
    return path, [d["uuid"] for d in doc["devices"]]


def host_proc(tmp_path: Path) -> Path:
    """A /proc with the cgroup files of the two live processes, as a cgroup v2 host with the
    systemd driver and containerd writes them."""
    root = tmp_path / "proc"
    pod_slice = "kubepods-burstable-pod" + POD_UID.replace("-", "_") + ".slice"
    cgroups = {
        IN_POD_PID: f"0::/kubepods.slice/kubepods-burstable.slice/{pod_slice}/"
        f"cri-containerd-{CONTAINER_ID}.scope\n",
        OUT_OF_BAND_PID: "0::/user.slice/user-1000.slice/session-3.scope\n",
    }
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root
