"""The MIG mode of every GPU and the MIG devices of one GPU with MIG on, read on every read.

``follow_mode``: every read asks ``nvmlDeviceGetMigMode`` again (one call per GPU), so a GPU
whose MIG mode is turned on or off at runtime is read as such from the first read after NVML
reports the change (a bound of one tick); its static facts are then read again (nvml.h: a MIG
mode change may reset the GPU, and callers are to query its attributes again), its MIG facts
and GPM buffers dropped. The pending mode (in force after the next GPU reset) changes nothing
read; it is logged once.

Every read enumerates the GPU's MIG devices (``nvmlDeviceGetMaxMigDeviceCount``,
``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot is NotFound, not an error) and reads each
one's memory and processes on its own handle. A MIG device's static facts (UUID, GPU/compute
instance IDs, ``nvmlDeviceGetAttributes_v2`` -> profile name) are read the first time its UUID is
seen. NVML has no utilisation with MIG on (NotSupported: absent).
"""

from __future__ import annotations

from typing import Any

import pynvml
from loguru import logger

from ...core.model.snapshot import MigReading, mig_profile_name
from .device import Device, attach, read_mig_mode
from .gpm import free
from .library import LIBRARY_GONE, MIB, Calls, decode, error_name, processes

__all__ = ["follow_mode", "read_migs"]


def _word(mode: bool | None) -> str:
    return {True: "on", False: "off", None: "unknown"}[mode]


def follow_mode(calls: Calls, device: Device) -> bool:
    """Ask a GPU (with a handle) its MIG mode again (``read_mig_mode``); True when the current
    mode differs from ``device.mig_enabled``, in which case the GPU's GPM buffers are freed and
    its handle and static facts read again (``attach``; a GPU lost meanwhile keeps its facts,
    and the next read asks again). A mode NVML cannot give now (``None``) keeps the one
    known. A new pending mode is logged once. Raises ``LOST`` and ``LIBRARY_GONE``, and the
    NVML error of ``nvmlDeviceGetHandleByIndex`` (``attach``) on a change."""
    mode = read_mig_mode(calls, device.handle)
    if mode is None:
        return False
    current, pending = mode
    if current == device.mig_enabled:
        if pending != device.mig_pending:
            device.mig_pending = pending
            if pending != current:
                logger.info(
                    "NVML: GPU {} MIG mode {} pending (after its next reset); read as {} until then",
                    device.index, _word(pending), _word(current),
                )  # fmt: skip
        return False
    logger.info(
        "NVML: GPU {} MIG mode now {} (was {}): its facts read again",
        device.index, _word(current), _word(device.mig_enabled),
    )  # fmt: skip
    free(calls, device)  # its GPM state was of the other mode (none is read with MIG on)
    attach(calls, device)
    return True


def _static(calls: Calls, device: Device, uuid: str, handle: Any) -> dict[str, Any]:
    """A MIG device's static facts, read once per UUID (cached in ``device.mig_facts``)."""
    facts = device.mig_facts.get(uuid)
    if facts is not None:
        return facts
    facts = {"uuid": uuid}
    facts["gpu_instance_id"] = calls.field(
        "nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, handle
    )
    facts["compute_instance_id"] = calls.field(
        "nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, handle
    )
    attrs = calls.field("nvmlDeviceGetAttributes_v2", pynvml.nvmlDeviceGetAttributes_v2, handle)
    facts["profile"] = None
    if attrs is not None and device.total_bytes:
        try:
            facts["profile"] = mig_profile_name(
                attrs.gpuInstanceSliceCount,
                attrs.computeInstanceSliceCount,
                attrs.memorySizeMB,
                device.total_bytes,
            )
        except ValueError:
            pass  # a zero slice count: no profile name rather than a wrong one
    device.mig_facts[uuid] = facts
    return facts


def _read_one(calls: Calls, device: Device, slot: int, handle: Any) -> MigReading:
    """One MIG device; an NVML error of its own is its ``MigReading.error``."""
    try:
        uuid = decode(calls.call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
        static = _static(calls, device, uuid, handle) if uuid else {}
        mem = calls.call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
        procs = calls.field(
            "nvmlDeviceGetComputeRunningProcesses",
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            handle,
        )
    except LIBRARY_GONE:
        raise
    except pynvml.NVMLError as exc:
        return MigReading(index=slot, error=error_name(exc))
    return MigReading(
        index=slot,
        memory_total_mib=mem.total // MIB if mem is not None else None,
        memory_used_mib=mem.used // MIB if mem is not None else None,
        memory_free_mib=mem.free // MIB if mem is not None else None,
        process_count=len(procs) if procs is not None else None,
        processes=processes(procs),
        **static,
    )


def read_migs(calls: Calls, device: Device) -> tuple[MigReading, ...]:
    """Every MIG device of a GPU with MIG on, by slot (see the module docstring). Raises the
    NVML error of ``nvmlDeviceGetMaxMigDeviceCount`` or of a slot's handle (the whole GPU's
    error), and ``LIBRARY_GONE``; a MIG device's own error is its reading's ``error``."""
    h = device.handle
    slots = calls.call("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
    out = []
    for slot in range(slots or 0):
        try:
            handle = calls.call(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
                h,
                slot,
                expected=(pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument),
            )
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue  # an empty slot
        if handle is not None:
            out.append(_read_one(calls, device, slot, handle))
    return tuple(out)
