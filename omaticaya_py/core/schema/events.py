"""The Event table: every Kubernetes Event reason the product posts, one row each.

Each ``EventReason`` says the Event's ``reason`` (the field ``kubectl get events`` shows), its
``type`` (``Warning`` or ``Normal``), the objects it is posted on (``Node``, ``pod``), the
program that posts it and where its rows are documented. Posters import the reason's constant
from here, never a string literal (tests/core/schema/test_event_table.py fails on a literal elsewhere in
``omaticaya_py`` and on a row the docs lack); the agent counts its Events by reason in
``omaticaya_events_total{reason}``.

Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EVENTS",
    "GPU_MEMORY_OVER_LIMIT",
    "GPU_OUT_OF_BAND_MEMORY",
    "GPU_PREEMPTION",
    "GPU_RECOVERED",
    "GPU_UNHEALTHY",
    "MPS_DAEMON_RESTARTED",
    "MPS_LIMIT_NOT_ENFORCED",
    "PREEMPTED_FOR_GPU_MEMORY",
    "SHARED_GPU_INDEX_MOVED",
    "SLICE_OVER_LIMIT_PROCESSES",
    "EventReason",
]

#: a GPU became Unhealthy (the message lists its reasons)
GPU_UNHEALTHY = "GpuUnhealthy"
#: that GPU is healthy again
GPU_RECOVERED = "GpuRecovered"
#: processes in no pod hold OMATICAYA_OUT_OF_BAND_EVENT_MIB or more on one GPU or MIG device
GPU_OUT_OF_BAND_MEMORY = "GpuOutOfBandMemory"
#: a container holds more than its slice, and nothing enforced the slice
GPU_MEMORY_OVER_LIMIT = "GpuMemoryOverLimit"
#: a container holds more than its slice although the GPU's MPS daemon was up
MPS_LIMIT_NOT_ENFORCED = "MpsLimitNotEnforced"
#: a container's processes, each within its slice, together hold more than it
SLICE_OVER_LIMIT_PROCESSES = "SliceOverLimitProcesses"
#: the MPS daemon of the pod's slice was restarted
MPS_DAEMON_RESTARTED = "MpsDaemonRestarted"
#: a shared GPU's index names another GPU than at the last start
SHARED_GPU_INDEX_MOVED = "SharedGpuIndexMoved"
#: the extender evicted pods for this pod, where kube-scheduler did not ask (preemptUnasked)
GPU_PREEMPTION = "GpuPreemption"
#: this pod was evicted for a pod of higher priority that needs its GPU memory
PREEMPTED_FOR_GPU_MEMORY = "PreemptedForGpuMemory"

Poster = Literal["agent", "device plugin", "DRA plugin", "extender"]


@dataclass(frozen=True, slots=True)
class EventReason:
    """One Event reason: ``reason``; ``type`` (``Warning`` or ``Normal``); ``on``, the objects
    it is posted on; ``by``, the programs that post it; ``docs``, the page (under docs/) whose
    Events table has its row."""

    reason: str
    type: Literal["Warning", "Normal"]
    on: tuple[Literal["Node", "pod"], ...]
    by: tuple[Poster, ...]
    docs: str


#: every Event reason, in the order the docs list them
EVENTS: tuple[EventReason, ...] = (
    EventReason(GPU_UNHEALTHY, "Warning", ("Node",), ("agent",), "agent.md"),
    EventReason(GPU_RECOVERED, "Normal", ("Node",), ("agent",), "agent.md"),
    EventReason(GPU_OUT_OF_BAND_MEMORY, "Warning", ("Node",), ("agent",), "agent.md"),
    EventReason(GPU_MEMORY_OVER_LIMIT, "Warning", ("pod",), ("agent",), "agent.md"),
    EventReason(MPS_LIMIT_NOT_ENFORCED, "Warning", ("pod", "Node"), ("agent",), "agent.md"),
    EventReason(SLICE_OVER_LIMIT_PROCESSES, "Warning", ("pod",), ("agent",), "agent.md"),
    EventReason(MPS_DAEMON_RESTARTED, "Warning", ("pod",), ("agent",), "agent.md"),
    EventReason(SHARED_GPU_INDEX_MOVED, "Warning", ("Node",), ("device plugin", "DRA plugin"),
                "agent.md"),  # fmt: skip
    EventReason(GPU_PREEMPTION, "Normal", ("pod",), ("extender",), "agent.md"),
    EventReason(PREEMPTED_FOR_GPU_MEMORY, "Normal", ("pod",), ("extender",), "agent.md"),
)
