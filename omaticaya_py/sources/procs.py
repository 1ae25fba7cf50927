"""Which pod each process is in: reads ``/proc/<pid>/cgroup`` for a set of PIDs and hands the
text to ``core.rules.attribution.pod_from_cgroup``.

The PIDs are NVML's (the host's PID namespace), so the answers are only right where this
process sees the host's ``/proc``: on the host, or in a pod with ``hostPID``. Elsewhere most
PIDs are simply absent, and are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..core.rules.attribution import PodRef, pod_from_cgroup

__all__ = ["PROC_ROOT", "read_pod_refs"]

#: where the kernel's process table is mounted
PROC_ROOT = Path("/proc")


def read_pod_refs(pids: Iterable[int], proc_root: str | Path = PROC_ROOT) -> dict[int, PodRef | None]:
    """PID -> the ``PodRef`` of the pod it runs in, or ``None`` for a process in no pod
    (out-of-band), from ``<proc_root>/<pid>/cgroup``.

    A PID whose file cannot be read (the process has exited, is not visible from this PID
    namespace, or permission is refused) or that is not a positive integer is left out of the
    result: absent means unknown. Never raises for a PID; each distinct PID is read once.
    """
    root = Path(proc_root)
    out: dict[int, PodRef | None] = {}
    for pid in pids:
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid in out:
            continue
        try:
            text = (root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            continue
        out[pid] = pod_from_cgroup(text)
    return out
