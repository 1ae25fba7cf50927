"""How this node's GPUs are wired, through NVML and sysfs, read once per ``nvmlInit``.

``read_topology(calls, devices, sysfs_root)`` asks, per GPU with a handle:

- PCI address: the device's static facts (``Device.pci_bus_id``, ``nvmlDeviceGetPciInfo_v3``);
- NUMA node: ``nvmlDeviceGetNumaNodeId``; where NVML cannot say (NotSupported, an error, -1),
  sysfs ``<sysfs_root>/bus/pci/devices/<bdf>/numa_node``; -1 there too: none;
- PCIe root complex: ``core.model.topology.pcie_root_of`` of the resolved
  ``<sysfs_root>/bus/pci/devices/<bdf>`` when that path exists (NVML has no call for it);
- CPU affinity: ``nvmlDeviceGetCpuAffinity`` for ``cpu_set_words()`` 64-bit words, as ranges
  (``core.model.topology.cpu_ranges``);
- NVLinks: for each link 0 .. ``NVML_NVLINK_MAX_LINKS`` - 1, ``nvmlDeviceGetNvLinkState``
  (NotSupported or InvalidArgument: the GPU has no such link, absent and not counted); for an
  active link, ``nvmlDeviceGetNvLinkRemotePciInfo_v2`` (the far end's address) and
  ``nvmlDeviceGetNvLinkRemoteDeviceType`` (GPU or NVSwitch); an inactive link asks nothing more;
- its NVLink fabric: ``nvmlDeviceGetGpuFabricInfoV`` (``fabric_name``), where pynvml has it;

and per pair of GPUs ``a < b`` the PCIe common ancestor (``nvmlDeviceGetTopologyCommonAncestor``,
one direction: it is symmetric), and per ordered pair the P2P read status
(``nvmlDeviceGetP2PStatus(.., NVML_P2P_CAPS_INDEX_READ)``). It returns
``core.model.topology.build_topology`` of what it gathered.

Every call goes through ``Calls`` (counted by ``(call, error name)``; NotSupported is absent and
uncounted). A failing call never fails the read: that fact is absent. A GPU lost on the way
keeps what was read of it; the library gone stops the topology read there (the GPU read that
follows sees it and starts NVML again). Cost on the 8-GPU traces: ``bench/topology_read.py``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from ...core.model.topology import (
    GpuLinks,
    NodeTopology,
    NvLink,
    build_topology,
    cpu_ranges,
    pci_bdf,
    pcie_root_of,
)
from .device import Device
from .library import LIBRARY_GONE, LOST, Calls, decode

__all__ = [
    "FABRIC_STATE_COMPLETED",
    "NVLINK_MAX_LINKS",
    "P2P_CAPS_INDEX_READ",
    "cpu_set_words",
    "fabric_name",
    "read_topology",
    "sysfs_numa_node",
    "sysfs_pcie_root",
    "uuid_text",
]

#: ``NVML_NVLINK_MAX_LINKS`` (nvml.h: 36): the link numbers asked, 0 .. this - 1
NVLINK_MAX_LINKS: int = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 36))
#: ``NVML_P2P_CAPS_INDEX_READ`` (nvml.h: 0); pynvml 13.x spells it ``0,`` (a tuple)
P2P_CAPS_INDEX_READ = 0
#: ``NVML_P2P_STATUS_OK`` (nvml.h)
_P2P_STATUS_OK = 0
#: ``NVML_GPU_FABRIC_STATE_COMPLETED`` (nvml.h)
FABRIC_STATE_COMPLETED = 3
#: ``NVML_SUCCESS``
_NVML_SUCCESS = 0
#: the fewest CPUs the affinity mask covers (NVML's own affinity calls handle up to 1024)
_MIN_CPUS = 1024


def cpu_set_words(cpus: int | None = None) -> int:
    """64-bit words asked of ``nvmlDeviceGetCpuAffinity``: enough for ``cpus`` CPUs
    (``os.cpu_count()``) and never fewer than 1024 CPUs (16 words), so that CPU numbers above
    the count (CPUs offline) and a trace recorded on a larger machine are not cut."""
    n = max(cpus if cpus is not None else (os.cpu_count() or 1), _MIN_CPUS)
    return (n + 63) // 64


def uuid_text(raw: bytes) -> str:
    """NVML's 16-byte ``clusterUuid`` in the canonical form, 8-4-4-4-12 lower-case hex digits
    (``"6f1c2d3e-..."``); other lengths as plain hex."""
    h = bytes(raw).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" if len(raw) == 16 else h


def fabric_name(cluster_uuid: bytes, clique_id: int, state: int, status: int) -> str | None:
    """A GPU's NVLink fabric as ``GpuTopology.fabric`` names it: ``"<clusterUuid>.<cliqueId>"``
    (``uuid_text`` of the 16-byte cluster UUID), when ``nvmlDeviceGetGpuFabricInfoV`` says state
    ``NVML_GPU_FABRIC_STATE_COMPLETED`` and status ``NVML_SUCCESS``; ``None`` otherwise (not
    registered, registration in progress or failed)."""
    if state != FABRIC_STATE_COMPLETED or status != _NVML_SUCCESS or len(cluster_uuid) != 16:
        return None
    return f"{uuid_text(cluster_uuid)}.{int(clique_id)}"


def _sysfs_device(sysfs_root: Path, bdf: str | None) -> Path | None:
    return sysfs_root / "bus" / "pci" / "devices" / bdf if bdf else None


def sysfs_numa_node(sysfs_root: Path, bdf: str | None) -> int | None:
    """The NUMA node sysfs gives a PCI device (``<sysfs_root>/bus/pci/devices/<bdf>/numa_node``);
    ``None`` for -1 (no NUMA), a missing or unreadable file, or no address."""
    path = _sysfs_device(sysfs_root, bdf)
    if path is None:
        return None
    try:
        node = int((path / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def sysfs_pcie_root(sysfs_root: Path, bdf: str | None) -> str | None:
    """The PCIe root complex of a PCI device: ``pcie_root_of`` of the resolved
    ``<sysfs_root>/bus/pci/devices/<bdf>`` (a symlink into ``<sysfs_root>/devices/pci...``);
    ``None`` when that path does not exist or names no root (a virtual device)."""
    path = _sysfs_device(sysfs_root, bdf)
    if path is None or not path.exists():
        return None
    return pcie_root_of(os.path.realpath(path))


def _numa(calls: Calls, handle: Any, bdf: str | None, sysfs_root: Path) -> int | None:
    node = calls.field("nvmlDeviceGetNumaNodeId", pynvml.nvmlDeviceGetNumaNodeId, handle)
    if node is not None and 0 <= int(node) < 0xFFFFFFFF:
        return int(node)
    return sysfs_numa_node(sysfs_root, bdf)


def _affinity(calls: Calls, handle: Any) -> str | None:
    words = calls.field(
        "nvmlDeviceGetCpuAffinity", pynvml.nvmlDeviceGetCpuAffinity, handle, cpu_set_words()
    )
    return cpu_ranges([int(w) for w in words]) if words is not None else None


def _nvlinks(calls: Calls, handle: Any) -> tuple[NvLink, ...]:
    links = []
    for link in range(NVLINK_MAX_LINKS):
        state = calls.field(
            "nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, handle, link,
            expected=(pynvml.NVMLError_InvalidArgument,),
        )  # fmt: skip
        if state is None:
            continue  # no such link on this GPU (or the call failed: counted)
        if state != pynvml.NVML_FEATURE_ENABLED:
            links.append(NvLink(link, False))
            continue
        pci = calls.field(
            "nvmlDeviceGetNvLinkRemotePciInfo_v2",
            pynvml.nvmlDeviceGetNvLinkRemotePciInfo,
            handle,
            link,
        )
        kind = calls.field(
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType,
            handle,
            link,
        )
        remote = pci_bdf(decode(pci.busId)) if pci is not None else None
        links.append(NvLink(link, True, remote, int(kind) if kind is not None else None))
    return tuple(links)


def _fabric(calls: Calls, handle: Any) -> str | None:
    get = getattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", None)
    struct = getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
    if get is None or struct is None:
        return None  # a pynvml without the versioned call
    info = struct()
    if calls.field("nvmlDeviceGetGpuFabricInfoV", get, handle, ctypes.byref(info)) is None:
        return None
    return fabric_name(
        bytes(info.clusterUuid), int(info.cliqueId), int(info.state), int(info.status)
    )


def _gpu(calls: Calls, device: Device, peers: Sequence[Device], sysfs_root: Path) -> GpuLinks:
    """One GPU's ``GpuLinks``; what a GPU lost on the way could not say is absent."""
    h, bdf = device.handle, device.pci_bus_id
    facts: dict[str, Any] = {
        "index": device.index,
        "uuid": device.uuid,
        "pci_bus_id": bdf,
        "pcie_root": sysfs_pcie_root(sysfs_root, bdf),
    }
    try:
        facts["numa_node"] = _numa(calls, h, bdf, sysfs_root)
        facts["cpu_affinity"] = _affinity(calls, h)
        facts["nvlinks"] = _nvlinks(calls, h)
        facts["fabric"] = _fabric(calls, h)
        ancestors: dict[int, int] = {}
        p2p: dict[int, bool] = {}
        facts["ancestors"], facts["p2p_read"] = ancestors, p2p
        for peer in peers:
            if peer is device or peer.handle is None:
                continue
            if peer.index > device.index:
                level = calls.field(
                    "nvmlDeviceGetTopologyCommonAncestor",
                    pynvml.nvmlDeviceGetTopologyCommonAncestor, h, peer.handle,
                )  # fmt: skip
                if level is not None:
                    ancestors[peer.index] = int(level)
            status = calls.field(
                "nvmlDeviceGetP2PStatus",
                pynvml.nvmlDeviceGetP2PStatus,
                h,
                peer.handle,
                P2P_CAPS_INDEX_READ,
            )
            if status is not None:
                p2p[peer.index] = int(status) == _P2P_STATUS_OK
    except LOST:
        pass  # what was read of it stays; its GPU read says it is lost
    return GpuLinks(**facts)


def read_topology(
    calls: Calls, devices: Sequence[Device], sysfs_root: Path = Path("/sys")
) -> NodeTopology:
    """The node's topology (see the module docstring) over the GPUs of ``devices`` that have a
    handle; the library gone on the way ends the read with what was gathered. Raises no NVML
    error."""
    live = [d for d in devices if d.handle is not None]
    gathered: list[GpuLinks] = []
    try:
        for device in live:
            gathered.append(_gpu(calls, device, live, sysfs_root))
    except LIBRARY_GONE:
        pass  # the GPU read that follows sees it too, and starts NVML again
    return build_topology(gathered)
