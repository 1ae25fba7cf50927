"""One GPU's place on the node as trace format version 3 records it (``docs/trace-format.md``):
the optional ``devices[]`` keys, each NVML's raw answer (sysfs for ``pcie_root``).

| key | source |
| --- | --- |
| ``pci_bus_id`` | ``nvmlDeviceGetPciInfo_v3`` ``busId`` (``"00000000:3B:00.0"``; a version 1 key) |
| ``topology`` | ``{"<peer index>": nvmlDeviceGetTopologyCommonAncestor}`` |
| ``numa_node`` | ``nvmlDeviceGetNumaNodeId`` (-1: none) |
| ``cpu_affinity`` | ``nvmlDeviceGetCpuAffinity`` 64-bit words, trailing zero words left out |
| ``pcie_root`` | ``pcie_root_of`` the resolved ``<sysfs>/bus/pci/devices/<bdf>`` (``null``: none) |
| ``nvlinks`` | per link NVML answers: ``{"link", "state"}`` (``nvmlDeviceGetNvLinkState``), and for an active link ``remote_pci_bus_id`` (``nvmlDeviceGetNvLinkRemotePciInfo_v2``) and ``remote_device_type`` (``nvmlDeviceGetNvLinkRemoteDeviceType``) |
| ``p2p_read`` | ``{"<peer index>": nvmlDeviceGetP2PStatus(.., NVML_P2P_CAPS_INDEX_READ)}`` |
| ``fabric`` | ``nvmlDeviceGetGpuFabricInfoV``: ``{"cluster_uuid", "clique_id", "state", "status"}`` |

A key NVML cannot answer (NotSupported, or any other error of that call: these keys have the
shapes above and no error objects) is left out, and so is a link or a peer; a lost GPU or a
gone library is raised (the sample records it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from ...core.model.topology import pci_bdf
from ..nvml import LIBRARY_GONE, decode
from ..nvml.topology import (
    NVLINK_MAX_LINKS,
    P2P_CAPS_INDEX_READ,
    cpu_set_words,
    sysfs_pcie_root,
    uuid_text,
)
from ..trace_topology import TOPOLOGY_KEYS

__all__ = ["TOPOLOGY_KEYS", "pci_bus_id", "topology_facts"]



def _answer(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; ``None`` for an NVML error of that call (NotSupported included); a lost
    GPU or a gone library is raised."""
    try:
        return fn(*args)
    except (pynvml.NVMLError_GpuIsLost, *LIBRARY_GONE):
        raise
    except pynvml.NVMLError:
        return None


def pci_bus_id(h: Any) -> str | None:
    """``nvmlDeviceGetPciInfo_v3``'s ``busId`` as NVML writes it (``"00000000:3B:00.0"``);
    ``None`` when NVML cannot say. Raises a lost GPU or a gone library."""
    pci = _answer(pynvml.nvmlDeviceGetPciInfo, h)
    return decode(pci.busId) if pci is not None else None


def _affinity(h: Any) -> list[int] | None:
    words = _answer(pynvml.nvmlDeviceGetCpuAffinity, h, cpu_set_words())
    if words is None:
        return None
    out = [int(w) for w in words]
    while len(out) > 1 and out[-1] == 0:
        out.pop()
    return out


def _nvlinks(h: Any) -> list[dict[str, Any]]:
    links: list[dict[str, Any]] = []
    for link in range(NVLINK_MAX_LINKS):
        state = _answer(pynvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            continue  # no such link on this GPU
        entry: dict[str, Any] = {"link": link, "state": 1 if state else 0}
        if state:
            pci = _answer(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            kind = _answer(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if pci is not None:
                entry["remote_pci_bus_id"] = decode(pci.busId)
            if kind is not None:
                entry["remote_device_type"] = int(kind)
        links.append(entry)
    return links


def _fabric(h: Any) -> dict[str, Any] | None:
    get = getattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", None)
    struct = getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
    if get is None or struct is None:
        return None
    info = struct()
    if _answer(get, h, ctypes.byref(info)) is None:
        return None
    return {
        "cluster_uuid": uuid_text(bytes(info.clusterUuid)),
        "clique_id": int(info.cliqueId),
        "state": int(info.state),
        "status": int(info.status),
    }


def topology_facts(
    index: int, h: Any, peers: dict[int, Any], bus_id: str | None, sysfs_root: Path
) -> dict[str, Any]:
    """GPU ``index``'s version 3 keys (module docstring): ``peers`` the other GPUs' handles by
    index (those NVML gave this session), ``bus_id`` its ``pci_bus_id``. Raises a lost GPU or a
    gone library."""
    out: dict[str, Any] = {}
    levels, p2p = {}, {}
    for peer, ph in sorted(peers.items()):
        if peer == index or ph is None:
            continue
        level = _answer(pynvml.nvmlDeviceGetTopologyCommonAncestor, h, ph)
        if level is not None:
            levels[str(peer)] = int(level)
        status = _answer(pynvml.nvmlDeviceGetP2PStatus, h, ph, P2P_CAPS_INDEX_READ)
        if status is not None:
            p2p[str(peer)] = int(status)
    if levels:
        out["topology"] = levels
    numa = _answer(pynvml.nvmlDeviceGetNumaNodeId, h)
    if numa is not None:
        out["numa_node"] = int(numa)
    affinity = _affinity(h)
    if affinity is not None:
        out["cpu_affinity"] = affinity
    bdf = pci_bdf(bus_id)
    if bdf is not None:
        out["pcie_root"] = sysfs_pcie_root(sysfs_root, bdf)
    links = _nvlinks(h)
    if links:
        out["nvlinks"] = links
    if p2p:
        out["p2p_read"] = p2p
    fabric = _fabric(h)
    if fabric is not None:
        out["fabric"] = fabric
    return out
