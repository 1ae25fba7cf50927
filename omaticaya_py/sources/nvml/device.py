"""One GPU's NVML handle and its static facts, read once per ``nvmlInit``.

Static facts: name, UUID, architecture, compute capability, total memory, PCI address
(``nvmlDeviceGetPciInfo_v3``) and MIG mode (``nvmlDeviceGetMigMode``). A GPU lost at start has no handle; ``attach`` tries again on every
read, so a GPU back on the bus is read again without a restart. The MIG mode alone is also
asked again on every read (``mig.follow_mode``): it can be turned on or off at runtime, and
the facts are read again when it changed.
"""

from __future__ import annotations

from typing import Any

import pynvml

from ...core.model.snapshot import ARCHITECTURES
from ...core.model.topology import pci_bdf
from .library import LOST, MIB, Calls, decode

__all__ = ["Device", "attach", "read_facts", "read_mig_mode"]


class Device:
    """A GPU handle with its static facts, read once per ``nvmlInit``.

    ``facts`` is what ``read_facts`` returns (a missing key is an unknown fact: ``None``);
    ``total_mib``/``total_bytes`` are the GPU's total memory; ``pci_bus_id`` its PCI address
    in BDF form (``"0000:3b:00.0"``, ``core.model.topology.pci_bdf``); ``mig_enabled`` and
    ``mig_pending`` are ``nvmlDeviceGetMigMode``'s current and pending mode (``None``: NVML
    could not say; kept up to date by ``mig.follow_mode``); ``mig_facts`` holds each MIG
    device's static facts by MIG UUID; ``last_ts`` is the NVML timestamp (µs) of the newest
    utilisation sample seen (the cursor of ``nvmlDeviceGetSamples``). GPM (``gpm.py``):
    ``gpm_supported`` (``None`` until ``nvmlGpmQueryDeviceSupport`` is asked, once per
    ``nvmlInit``), the kept sample ``gpm_kept`` (``gpm_filled`` once ``nvmlGpmSampleGet`` filled
    it), the spare buffer ``gpm_spare`` the next read fills and ``gpm_request``, the
    ``nvmlGpmMetricsGet`` request reused by each read.
    """

    __slots__ = (
        "index",
        "handle",
        "uuid",
        "product",
        "architecture",
        "cc",
        "total_mib",
        "total_bytes",
        "pci_bus_id",
        "mig_enabled",
        "mig_pending",
        "mig_facts",
        "last_ts",
        "gpm_supported",
        "gpm_kept",
        "gpm_spare",
        "gpm_filled",
        "gpm_request",
    )

    def __init__(self, index: int, handle: Any, facts: dict[str, Any]) -> None:
        self.index = index
        self.handle = handle
        self.uuid = facts.get("uuid")
        self.product = facts.get("product")
        self.architecture = facts.get("architecture")
        self.cc = facts.get("cc")
        self.total_mib = facts.get("total_mib")
        self.total_bytes = facts.get("total_bytes")
        self.pci_bus_id: str | None = facts.get("pci_bus_id")
        self.mig_enabled: bool | None = facts.get("mig_enabled")
        self.mig_pending: bool | None = facts.get("mig_pending")
        self.mig_facts: dict[str, dict[str, Any]] = {}  # MIG UUID -> static facts
        self.last_ts = 0  # NVML sample timestamp (µs) of the newest utilisation sample seen
        self.gpm_supported: bool | None = None
        self.gpm_kept: Any = None
        self.gpm_spare: Any = None
        self.gpm_filled = False
        self.gpm_request: Any = None  # the nvmlGpmMetricsGet request, reused


def read_facts(calls: Calls, handle: Any) -> dict[str, Any]:
    """A GPU's static facts from NVML: ``product``, ``uuid``, ``architecture`` (a name from
    ``ARCHITECTURES``), ``cc`` (major, minor), ``total_mib``, ``total_bytes``, ``pci_bus_id``
    (``pci_bdf`` of ``nvmlDeviceGetPciInfo_v3``'s ``busId``), ``mig_enabled``, ``mig_pending``
    (``read_mig_mode``); a fact NVML cannot give is ``None``, and the facts stop at a GPU that is
    lost on the way (its reads will say so). Never raises an NVML error."""
    facts: dict[str, Any] = {}
    try:
        name = calls.field("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle)
        facts["product"] = decode(name)
        uuid = calls.field("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)
        facts["uuid"] = decode(uuid)
        arch = calls.field("nvmlDeviceGetArchitecture", pynvml.nvmlDeviceGetArchitecture, handle)
        facts["architecture"] = ARCHITECTURES.get(arch) if arch is not None else None
        facts["cc"] = calls.field(
            "nvmlDeviceGetCudaComputeCapability",
            pynvml.nvmlDeviceGetCudaComputeCapability,
            handle,
        )
        mem = calls.field("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
        facts["total_mib"] = mem.total // MIB if mem is not None else None
        facts["total_bytes"] = mem.total if mem is not None else None
        pci = calls.field("nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo_v3, handle)
        facts["pci_bus_id"] = pci_bdf(decode(pci.busId)) if pci is not None else None
        mode = read_mig_mode(calls, handle)
        facts["mig_enabled"], facts["mig_pending"] = mode if mode is not None else (None, None)
    except pynvml.NVMLError:
        pass  # a GPU lost at start: its reads will say so
    return facts


def read_mig_mode(calls: Calls, handle: Any) -> tuple[bool, bool] | None:
    """A GPU's MIG mode from ``nvmlDeviceGetMigMode``: ``(current, pending)``, True for
    ``NVML_DEVICE_MIG_ENABLE``. The current mode is the one in force (MIG devices exist only
    with it on); the pending one is what the next activation trigger (a GPU reset) will make
    current (nvml.h). ``None`` where NVML cannot say: NotSupported (a GPU without MIG) or
    another error of this call (counted). Raises ``LOST`` and ``LIBRARY_GONE``."""
    mode = calls.field("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle)
    if mode is None:
        return None
    return bool(mode[0]), bool(mode[1])


def attach(calls: Calls, device: Device) -> bool:
    """Get a GPU's handle and static facts into ``device``; False (handle None) while it is
    lost: one GPU off the bus is that GPU's error, never the whole node's. Retried on every
    read. Raises the NVML error of ``nvmlDeviceGetHandleByIndex`` other than GpuIsLost (a gone
    library: the whole read fails)."""
    try:
        handle = calls.call(
            "nvmlDeviceGetHandleByIndex",
            pynvml.nvmlDeviceGetHandleByIndex,
            device.index,
            expected=LOST,
        )
    except LOST:
        return False
    # (its GPM buffers, if any, were freed when it was lost: gpm.free from read_gpu)
    fresh = Device(device.index, handle, read_facts(calls, handle))
    for name in Device.__slots__:
        setattr(device, name, getattr(fresh, name))
    return True
