"""Whether a slice over its limit is the workload's fault or the enforcement's (issue 39).

A container whose processes hold more memory on a shared GPU than its slice
(``core.slice_use.over_limit``) means one of two things:

- nothing enforces the slice there (``OMATICAYA_SHARE_ENFORCEMENT=none``, or that GPU's MPS
  control daemon is not up: ``core.mps.enforced``): the workload took more than it asked for.
  The pod gets ``GpuMemoryOverLimit`` (``OVER_LIMIT``), as before MPS;
- the GPU's MPS daemon is up, so the container's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its
  slice, ``core.mps.client_spec``) should have held it: the enforcement failed (the container
  is no MPS client of that daemon: its pipe folder overridden, a process started outside
  CUDA, ...). The pod, and the Node, get ``MpsLimitNotEnforced`` (``NOT_ENFORCED``).

``judge`` makes that call from the over-limit slices and each GPU's enforcement (by UUID);
``over_counts`` is what the agent's ``omaticaya_slice_over_limit`` gauge shows;
``mps_status`` is the telemetry's per-GPU ``mps`` field. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .mps import MISSING, UP
from .slice_use import SliceUse
from .snapshot import GpuReading

__all__ = [
    "NOT_ENFORCED",
    "OVER_LIMIT",
    "OverLimit",
    "judge",
    "mps_status",
    "over_counts",
]

#: the Event reason of a container over its slice where nothing enforces it
OVER_LIMIT = "GpuMemoryOverLimit"
#: the Event reason of a container over its slice although its GPU's MPS daemon is up
NOT_ENFORCED = "MpsLimitNotEnforced"


@dataclass(frozen=True, slots=True)
class OverLimit:
    """One container over its slice (``slice``) of shared GPU ``gpu``, judged: ``enforced``
    when that GPU's MPS control daemon was up (the limit should have held), else ``why`` it
    was not (a ``core.mps`` reason: ``mps-daemon-down``, ``mps-state-stale``, ...; ``""``
    with enforcement off)."""

    gpu: GpuReading
    slice: SliceUse
    enforced: bool
    why: str = ""

    @property
    def reason(self) -> str:
        """The Event reason: ``NOT_ENFORCED`` when enforced, else ``OVER_LIMIT``."""
        return NOT_ENFORCED if self.enforced else OVER_LIMIT

    @property
    def key(self) -> tuple[str, str, str, str]:
        """``(namespace, pod, container, GPU UUID)``: one over-use episode's key."""
        s = self.slice
        return (s.namespace, s.pod, s.container, self.gpu.uuid or "")

    def message(self, resource: str) -> str:
        """The Event's message: the container, its GPU (index and UUID), the MiB it holds and
        its slice (MiB, and units of ``resource``), then what that means: with the GPU's MPS
        daemon up, that the limit should have held and what to check; else that nothing
        enforces the slice (and, under MPS, why the daemon does not)."""
        s, g = self.slice, self.gpu
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


def judge(
    over: Iterable[tuple[GpuReading, SliceUse]],
    enforcement: Mapping[str, str] | None,
) -> list[OverLimit]:
    """Each over-limit slice (``core.slice_use.over_limit``: ``(GPU, slice)``, GPU order) with
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


def over_counts(judged: Iterable[OverLimit]) -> dict[tuple[str, str, str], int]:
    """Containers over their slice now, by ``(GPU index, GPU UUID, "true"|"false")`` (whether
    its MPS daemon was up): the labels and value of ``omaticaya_slice_over_limit``."""
    out: dict[tuple[str, str, str], int] = {}
    for o in judged:
        key = (str(o.gpu.index), o.gpu.uuid or "", "true" if o.enforced else "false")
        out[key] = out.get(key, 0) + 1
    return out


def mps_status(g: GpuReading, shared: bool, enforcement: Mapping[str, str] | None) -> str | None:
    """The telemetry's ``mps`` field of GPU ``g``: for a GPU served as memory units
    (``shared``) with a UUID, ``"up"`` or the reason it is not enforced (``enforcement[uuid]``;
    absent from the map: ``mps-state-missing``); ``None`` (the field absent) for a GPU not
    shared, and with enforcement off (``enforcement`` ``None``)."""
    if enforcement is None or not shared or not g.uuid:
        return None
    return enforcement.get(g.uuid) or MISSING
