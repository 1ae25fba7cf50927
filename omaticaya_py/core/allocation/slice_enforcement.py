"""Whether a slice over its limit is the workload's fault or the enforcement's (issues 39, 47).

A container whose processes together hold more memory on a shared GPU than its slice
(``core.allocation.slice_use.over_limit``: the container's total, not each process's) means one of three
things:

- nothing enforces the slice there (``OMATICAYA_SHARE_ENFORCEMENT=none``, or that GPU's MPS
  control daemon is not up: ``core.allocation.mps.enforced``): the workload took more than it asked for.
  The pod gets ``GpuMemoryOverLimit`` (``OVER_LIMIT``), as before MPS;
- the GPU's MPS daemon is up and every one of the container's processes there is within the
  slice, but there are several (``several_within``): MPS held each CUDA process to its limit
  (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is per client process, not per container), and a
  container that starts N CUDA processes (torchrun workers, notebook kernels) holds up to N
  slices. The enforcement worked as MPS can; the workload's shape did not fit it. The pod gets
  ``SliceOverLimitProcesses`` (``OVER_LIMIT_PROCESSES``), naming each process and the sum;
- the GPU's MPS daemon is up and one process alone holds more than the slice (or what each
  holds is not known): that process escaped its daemon, the enforcement failed (the container
  is no MPS client of that daemon: its pipe folder overridden, a process started outside
  CUDA, ...). The pod, and the Node, get ``MpsLimitNotEnforced`` (``NOT_ENFORCED``).

``judge`` makes that call from the over-limit slices and each GPU's enforcement (by UUID);
``over_counts`` is what the agent's ``omaticaya_slice_over_limit`` gauge shows;
``mps_status`` is the telemetry's per-GPU ``mps`` field. ``daemon_restarted`` says when a GPU's
MPS daemon was restarted since the agent last read its state (``MpsDaemonRestarted``, issue 47:
its clients' processes lost their server). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..model.snapshot import GpuReading
from ..schema.events import (
    GPU_MEMORY_OVER_LIMIT,
    MPS_DAEMON_RESTARTED,
    MPS_LIMIT_NOT_ENFORCED,
    SLICE_OVER_LIMIT_PROCESSES,
)
from .mps import MISSING, UP, DaemonState
from .slice_use import SliceUse

__all__ = [
    "DAEMON_RESTARTED",
    "NOT_ENFORCED",
    "OVER_LIMIT",
    "OVER_LIMIT_PROCESSES",
    "READ_SLACK_MIB",
    "DaemonGeneration",
    "OverLimit",
    "daemon_generation",
    "daemon_restarted",
    "judge",
    "mps_status",
    "over_counts",
    "over_reason",
    "several_within",
]

#: the Event reason of a container over its slice where nothing enforces it
OVER_LIMIT = GPU_MEMORY_OVER_LIMIT
#: the Event reason of a container over its slice although its GPU's MPS daemon is up: one of
#: its processes alone holds more than the slice (it escaped its daemon)
NOT_ENFORCED = MPS_LIMIT_NOT_ENFORCED
#: the Event reason of a container over its slice with its GPU's MPS daemon up and several
#: processes, each within the slice (MPS's limit is per process: the sum is over)
OVER_LIMIT_PROCESSES = SLICE_OVER_LIMIT_PROCESSES
#: the Event reason on a pod holding a slice of a GPU whose MPS daemon was restarted
DAEMON_RESTARTED = MPS_DAEMON_RESTARTED

#: MiB a process may read over the slice in NVML and still count as held to it by its MPS
#: limit: NVML lists a client at what it holds plus 516 MiB of context, while its limit counts
#: 514 MiB of that context (H200, driver 580.159.04: docs/device-plugin.md, "Sizing a slice"),
#: so a client at its limit reads about 2 MiB over; 16 leaves room for other drivers' context
#: sizes and is far less than a process that escaped its daemon holds past the slice
READ_SLACK_MIB = 16
#: at most this many processes are named in an Event's message (the rest are counted)
_NAMED_PIDS = 16


def several_within(s: SliceUse) -> bool:
    """Whether ``s``'s processes are several and each is within the slice: at least two
    (``SliceUse.processes``), each with a known MiB of at most ``limit_mib`` plus
    ``READ_SLACK_MIB``. False when what each holds is not known (no process list, a process
    NVML gave no memory for)."""
    cap = s.limit_mib + READ_SLACK_MIB
    return len(s.processes) >= 2 and all(
        mib is not None and mib <= cap for _, mib in s.processes
    )


def over_reason(s: SliceUse, enforced: bool) -> str:
    """The Event reason of slice ``s`` over its limit: ``OVER_LIMIT`` when its GPU's MPS daemon
    was not up (``enforced`` False); with it up, ``OVER_LIMIT_PROCESSES`` when its processes
    are several and each within the slice (``several_within``), else ``NOT_ENFORCED`` (one
    process over alone, or what each holds not known: as before issue 47)."""
    if not enforced:
        return OVER_LIMIT
    return OVER_LIMIT_PROCESSES if several_within(s) else NOT_ENFORCED


@dataclass(frozen=True, slots=True)
class OverLimit:
    """One container over its slice (``slice``) of shared GPU ``gpu``, judged: ``enforced``
    when that GPU's MPS control daemon was up (each process's limit should have held), else
    ``why`` it was not (a ``core.allocation.mps`` reason: ``mps-daemon-down``, ``mps-state-stale``, ...;
    ``""`` with enforcement off)."""

    gpu: GpuReading
    slice: SliceUse
    enforced: bool
    why: str = ""

    @property
    def reason(self) -> str:
        """The Event reason (``over_reason``): ``OVER_LIMIT`` when not enforced; enforced,
        ``OVER_LIMIT_PROCESSES`` (several processes, each within) or ``NOT_ENFORCED``."""
        return over_reason(self.slice, self.enforced)

    @property
    def escaped(self) -> bool:
        """The enforcement failed: enforced, and not several processes each within the slice
        (``NOT_ENFORCED``; said on the Node too)."""
        return self.reason == NOT_ENFORCED

    @property
    def key(self) -> tuple[str, str, str, str]:
        """``(namespace, pod, container, GPU UUID)``: one over-use episode's key."""
        s = self.slice
        return (s.namespace, s.pod, s.container, self.gpu.uuid or "")

    def message(self, resource: str) -> str:
        """The Event's message: the container, its GPU (index and UUID), the MiB it holds and
        its slice (MiB, and units of ``resource``), then what that means: with the GPU's MPS
        daemon up and several processes each within (``OVER_LIMIT_PROCESSES``), each pid's MiB
        and that MPS's limit is per process; with it up otherwise, that the limit should have
        held and what to check; else that nothing enforces the slice (and, under MPS, why the
        daemon does not)."""
        s, g = self.slice, self.gpu
        if self.reason == OVER_LIMIT_PROCESSES:
            return self._processes_message(resource)
        head = (
            f"container {s.container} holds {s.used_mib} MiB on GPU {g.index} ({g.uuid}), "
            f"over its slice of {s.limit_mib} MiB ({s.units} units of {resource})"
        )
        if self.enforced:
            return (
                f"{head}, though the GPU's MPS control daemon is up and should have held it to "
                f"its slice (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT): check that the container is a "
                f"client of that daemon (CUDA_MPS_PIPE_DIRECTORY as the device plugin set it, "
                f"not overridden; /dev/shm the daemons' own)"
            )
        tail = f" (its MPS daemon is not up: {self.why})" if self.why else ""
        return (
            f"{head}; nothing enforces the slice without an MPS control daemon for that "
            f"GPU{tail}"
        )


    def _processes_message(self, resource: str) -> str:
        """``OVER_LIMIT_PROCESSES``'s message: the process count, each pid's MiB (the first
        ``_NAMED_PIDS``), the sum and the slice, and why: MPS's limit is per process."""
        s, g = self.slice, self.gpu
        named = ", ".join(f"pid {pid}: {mib} MiB" for pid, mib in s.processes[:_NAMED_PIDS])
        more = len(s.processes) - _NAMED_PIDS
        if more > 0:
            named += f", and {more} more"
        return (
            f"container {s.container} holds {s.used_mib} MiB on GPU {g.index} ({g.uuid}) in "
            f"{len(s.processes)} processes ({named}), over its slice of {s.limit_mib} MiB "
            f"({s.units} units of {resource}) in sum; each process is within the slice (the "
            f"GPU's MPS daemon holds each CUDA process to it: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
            f"is per process, not per container), so a container with N CUDA processes "
            f"(torchrun workers, notebook kernels) can hold N slices: request units for the "
            f"sum, or start fewer processes"
        )


def judge(
    over: Iterable[tuple[GpuReading, SliceUse]],
    enforcement: Mapping[str, str] | None,
) -> list[OverLimit]:
    """Each over-limit slice (``core.allocation.slice_use.over_limit``: ``(GPU, slice)``, GPU order) with
    whether its GPU was enforced: ``enforcement`` maps a shared GPU's UUID to ``"up"`` (its
    MPS daemon answers, its heartbeat fresh) or the reason it is not; ``None``: enforcement
    off (``OMATICAYA_SHARE_ENFORCEMENT=none``), nothing is enforced. A GPU missing from the
    map, or without a UUID, is not enforced (fail closed: it is no fault of MPS)."""
    out = []
    for g, s in over:
        state = enforcement.get(g.uuid or "") if enforcement is not None and g.uuid else None
        if state == UP:
            out.append(OverLimit(g, s, True))
        else:
            why = (state or MISSING) if enforcement is not None else ""
            out.append(OverLimit(g, s, False, why))
    return out


def over_counts(judged: Iterable[OverLimit]) -> dict[tuple[str, str, str, str], int]:
    """Containers over their slice now, by ``(GPU index, GPU UUID, enforced, reason)``: the
    labels and value of ``omaticaya_slice_over_limit``. ``enforced`` is ``"true"`` when the
    slice's limit should have held and did not (``NOT_ENFORCED``: a process escaped its
    daemon), else ``"false"`` (nothing enforced it, or several processes each held to it);
    ``reason`` is the Event reason (``over_reason``), which tells the three apart."""
    out: dict[tuple[str, str, str, str], int] = {}
    for o in judged:
        key = (str(o.gpu.index), o.gpu.uuid or "", "true" if o.escaped else "false", o.reason)
        out[key] = out.get(key, 0) + 1
    return out


#: what tells one start of a daemon from the next: its ``(pid, starts)`` (``DaemonState``)
DaemonGeneration = tuple[int, int]


def daemon_generation(state: DaemonState | None) -> DaemonGeneration | None:
    """``(pid, starts)`` of a daemon that was started (a pid, ``starts`` at least 1), else
    ``None`` (no state read, or none started yet: nothing a client could have reached)."""
    if state is None or state.pid is None or state.starts < 1:
        return None
    return (state.pid, state.starts)


def daemon_restarted(seen: DaemonGeneration | None, now: DaemonGeneration | None) -> bool:
    """Whether a GPU's MPS daemon was restarted between two reads of its state
    (``daemon_generation``): both started, and another pid or another ``starts`` now. Each
    start has a new pid and one more start (``omaticaya mps``); a lower ``starts`` is a new
    supervisor, whose daemons are new too. Not when either is ``None``: the first state the
    agent reads (after its own start it cannot tell), and a state not read (the last one read
    is kept: the caller compares the next read with it)."""
    return seen is not None and now is not None and seen != now


def mps_status(g: GpuReading, shared: bool, enforcement: Mapping[str, str] | None) -> str | None:
    """The telemetry's ``mps`` field of GPU ``g``: for a GPU served as memory units
    (``shared``) with a UUID, ``"up"`` or the reason it is not enforced (``enforcement[uuid]``;
    absent from the map: ``mps-state-missing``); ``None`` (the field absent) for a GPU not
    shared, and with enforcement off (``enforcement`` ``None``)."""
    if enforcement is None or not shared or not g.uuid:
        return None
    return enforcement.get(g.uuid) or MISSING
