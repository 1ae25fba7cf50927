"""A trace's topology (format version 3, ``docs/trace-format.md``) as the pure model's input.

``gpu_links`` turns one ``devices[]`` entry into the ``GpuLinks`` the NVML reader would have
gathered on that node; ``trace_topology`` makes the node's ``NodeTopology`` from all of them
(``core.model.topology.build_topology``), or ``None`` for a trace that carries no topology
(versions 1 and 2, or a version 3 trace recorded without it). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.model.topology import (
    GpuLinks,
    NodeTopology,
    NvLink,
    build_topology,
    cpu_ranges,
    pci_bdf,
)
from .trace import TraceDevice

__all__ = [
    "FABRIC_COMPLETED",
    "P2P_STATUS_OK",
    "TOPOLOGY_KEYS",
    "gpu_links",
    "has_topology",
    "trace_topology",
]

#: the ``devices[]`` keys of format version 3 that describe a GPU's place on the node
TOPOLOGY_KEYS = (
    "topology",
    "numa_node",
    "cpu_affinity",
    "pcie_root",
    "nvlinks",
    "p2p_read",
    "fabric",
)
#: ``NVML_GPU_FABRIC_STATE_COMPLETED``: the GPU is registered in its NVLink fabric
FABRIC_COMPLETED = 3
#: ``NVML_P2P_STATUS_OK``
P2P_STATUS_OK = 0


def has_topology(device: TraceDevice) -> bool:
    """Whether the ``devices[]`` entry carries any of ``TOPOLOGY_KEYS`` (not ``null``)."""
    return any(getattr(device, key) is not None for key in TOPOLOGY_KEYS)


def gpu_links(device: TraceDevice) -> GpuLinks:
    """One ``devices[]`` entry as ``GpuLinks``; every value from the trace, nothing guessed:

    - ``pci_bus_id``: ``pci_bdf`` of the entry's ``pci_bus_id`` (``nvmlDeviceGetPciInfo_v3``
      ``busId``); ``None`` when absent or not a PCI address.
    - ``numa_node``: ``numa_node`` (``nvmlDeviceGetNumaNodeId``), -1 -> ``None``.
    - ``cpu_affinity``: ``cpu_ranges`` of ``cpu_affinity`` (``nvmlDeviceGetCpuAffinity``'s 64-bit
      words), ``"0-55,112-167"``; ``None`` when absent or empty.
    - ``pcie_root``: ``pcie_root`` (``pci<domain>:<bus>``, from sysfs at record time).
    - ``fabric``: ``"<cluster_uuid>.<clique_id>"`` of ``fabric`` (``nvmlDeviceGetGpuFabricInfoV``)
      only when its ``state`` is completed (3) and its ``status`` success (0), else ``None``.
    - ``nvlinks``: one ``NvLink`` per listed link (``active``: ``state`` 1; ``remote_bus_id``:
      ``pci_bdf`` of ``remote_pci_bus_id``; ``remote_type``: ``remote_device_type``).
    - ``ancestors``: ``topology`` with int keys (``nvmlDeviceGetTopologyCommonAncestor``).
    - ``p2p_read``: ``p2p_read`` with int keys, ``True`` for ``NVML_P2P_STATUS_OK`` (0).
    """
    fabric = device.fabric
    fabric_id = None
    if fabric is not None and fabric.state == FABRIC_COMPLETED and fabric.status == 0:
        fabric_id = f"{fabric.cluster_uuid}.{fabric.clique_id}"
    numa = device.numa_node
    return GpuLinks(
        index=device.index,
        uuid=device.uuid,
        pci_bus_id=pci_bdf(device.pci_bus_id),
        numa_node=numa if numa is not None and numa >= 0 else None,
        pcie_root=device.pcie_root,
        cpu_affinity=cpu_ranges(device.cpu_affinity) if device.cpu_affinity else None,
        fabric=fabric_id,
        nvlinks=tuple(
            NvLink(
                link=link.link,
                active=link.state == 1,
                remote_bus_id=pci_bdf(link.remote_pci_bus_id),
                remote_type=link.remote_device_type,
            )
            for link in sorted(device.nvlinks or (), key=lambda link: link.link)
        ),
        ancestors={int(peer): level for peer, level in (device.topology or {}).items()},
        p2p_read={
            int(peer): status == P2P_STATUS_OK for peer, status in (device.p2p_read or {}).items()
        },
    )


def trace_topology(devices: Sequence[TraceDevice]) -> NodeTopology | None:
    """The node's topology from a trace's ``devices[]`` (``build_topology`` of ``gpu_links`` of
    each, in index order); ``None`` when no entry carries any of ``TOPOLOGY_KEYS``."""
    if not any(has_topology(d) for d in devices):
        return None
    return build_topology([gpu_links(d) for d in sorted(devices, key=lambda d: d.index)])
