"""How the GPUs of one node are wired to each other: PCIe, NVLink, NUMA (pure).

Read once per ``nvmlInit`` by the NVML reader (``sources.nvml.topology``; topology does not
change while the driver is loaded), carried by every ``NodeSnapshot`` of that session, published
in the telemetry annotation (``links``, and per GPU ``pci_bus_id``, ``numa_node``,
``pcie_root``, ``nvlink_island``) and as the DRA driver's standard attributes, and scored here
for placement (``core.allocation.placement.first_whole``).

- ``GpuTopology``: one GPU's place: its PCI address, NUMA node, PCIe root complex, CPU
  affinity, and the NVLink fabric it belongs to.
- ``PairLink``: what joins two GPUs: the PCIe common ancestor (``NVML_TOPOLOGY_*``), how many
  NVLinks, whether P2P reads work.
- ``NodeTopology``: all of them, with the pair score (``pair_score``: NVIDIA's scale, below),
  the score of a set of GPUs (``set_score``) and the NVLink islands (``islands``).

The pair score is the scale NVIDIA's ``go-gpuallocator`` states for its best-effort policy, so
that our choices and NVIDIA's are compared on one scale (``bench/topology.py``): the PCIe
common ancestor scores 60 (same board), 50 (one switch), 40 (several switches), 30 (host
bridge), 20 (same NUMA node) or 10 (across the CPUs' interconnect), and each NVLink joining the
two adds 100. Unlike that allocator, GPUs on one NVSwitch fabric count the NVLinks they reach
each other by (the fewer of the two GPUs' links to the switches), not 0.

Pure data and arithmetic: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from types import MappingProxyType

__all__ = [
    "LEVEL_NAMES",
    "LEVEL_SCORE",
    "NVLINK_SCORE",
    "TOPOLOGY_HOSTBRIDGE",
    "TOPOLOGY_INTERNAL",
    "TOPOLOGY_MULTIPLE",
    "TOPOLOGY_NODE",
    "TOPOLOGY_SINGLE",
    "TOPOLOGY_SYSTEM",
    "NVLINK_REMOTE_GPU",
    "NVLINK_REMOTE_SWITCH",
    "GpuLinks",
    "GpuTopology",
    "NodeTopology",
    "NvLink",
    "PairLink",
    "build_topology",
    "cpu_ranges",
    "pci_bdf",
    "pcie_root_of",
]

#: ``nvmlGpuTopologyLevel_t`` (nvml.h): the common ancestor of two GPUs, closest first
TOPOLOGY_INTERNAL = 0  # same board (a dual-GPU card)
TOPOLOGY_SINGLE = 10  # one PCIe switch
TOPOLOGY_MULTIPLE = 20  # several PCIe switches, no host bridge
TOPOLOGY_HOSTBRIDGE = 30  # one host bridge
TOPOLOGY_NODE = 40  # one NUMA node (NVML_TOPOLOGY_CPU before)
TOPOLOGY_SYSTEM = 50  # across NUMA nodes (the CPUs' interconnect)

#: the PCIe part of a pair's score, by common ancestor (go-gpuallocator's best-effort scale)
LEVEL_SCORE: Mapping[int, int] = {
    TOPOLOGY_INTERNAL: 60,
    TOPOLOGY_SINGLE: 50,
    TOPOLOGY_MULTIPLE: 40,
    TOPOLOGY_HOSTBRIDGE: 30,
    TOPOLOGY_NODE: 20,
    TOPOLOGY_SYSTEM: 10,
}
#: what each NVLink joining two GPUs adds to their pair score
NVLINK_SCORE = 100
#: ``nvidia-smi topo -m``'s name of each common ancestor
LEVEL_NAMES: Mapping[int, str] = {
    TOPOLOGY_INTERNAL: "SAME",
    TOPOLOGY_SINGLE: "PIX",
    TOPOLOGY_MULTIPLE: "PXB",
    TOPOLOGY_HOSTBRIDGE: "PHB",
    TOPOLOGY_NODE: "NODE",
    TOPOLOGY_SYSTEM: "SYS",
}

_NVML_BUS_ID = re.compile(
    r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$"
)


def pci_bdf(bus_id: str | None) -> str | None:
    """A PCI address in the extended BDF form sysfs and Kubernetes' ``pciBusID`` attribute use
    (``domain:bus:device.function``, 4 + 2 + 2 + 1 lower-case hex digits): NVML's
    ``nvmlPciInfo_t.busId`` ``"00000000:3B:00.0"`` -> ``"0000:3b:00.0"``; a legacy
    ``busIdLegacy`` (``"0000:3B:00.0"``) or one without a domain (``"3b:00.0"``, domain 0) read
    alike. ``None`` for ``None`` or a value not of that form, or a domain over 0xffff."""
    if not isinstance(bus_id, str):
        return None
    m = _NVML_BUS_ID.match(bus_id.strip())
    if m is None:
        return None
    domain = int(m.group(1) or "0", 16)
    if domain > 0xFFFF:
        return None
    bus, dev, fn = int(m.group(2), 16), int(m.group(3), 16), int(m.group(4))
    if dev > 0x1F:
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


_SYSFS_ROOT = re.compile(r"^pci([0-9a-f]{4}):([0-9a-f]{2})$")


def pcie_root_of(sysfs_path: str) -> str | None:
    """The PCIe root complex of a device from its resolved sysfs path (the target of
    ``/sys/bus/pci/devices/<bdf>``): ``/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0`` ->
    ``"pci0000:3a"``, the form of Kubernetes' ``resource.kubernetes.io/pcieRoot``
    (``pci<domain>:<bus>``). ``None`` when no component of the path is of that form (a
    virtual device, a path not under ``/sys/devices``)."""
    for part in sysfs_path.lower().split("/"):
        if _SYSFS_ROOT.match(part):
            return part
    return None


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """One GPU's place on the node.

    - ``index``, ``uuid``: the GPU (``nvmlDeviceGetIndex``, ``nvmlDeviceGetUUID``).
    - ``pci_bus_id``: its PCI address in BDF form (``pci_bdf`` of ``nvmlDeviceGetPciInfo_v3``'s
      ``busId``).
    - ``numa_node``: the NUMA node it hangs off (``nvmlDeviceGetNumaNodeId``, else sysfs
      ``numa_node``); ``None``: none (a one-node machine says -1) or unknown.
    - ``pcie_root``: its PCIe root complex (``pcie_root_of`` of its sysfs path); ``None``:
      unknown.
    - ``cpu_affinity``: the CPUs closest to it (``nvmlDeviceGetCpuAffinity``), as ranges
      ``"0-55,112-167"``; ``None``: unknown.
    - ``nvswitch_links``: its active NVLinks whose far end is an NVSwitch
      (``nvmlDeviceGetNvLinkRemoteDeviceType``); 0 on a board without NVSwitch.
    - ``fabric``: the multi-node NVLink domain it is registered in, ``"<clusterUuid>.<cliqueId>"``
      (``nvmlDeviceGetGpuFabricInfoV``, state completed); ``None``: none.
    """

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    pcie_root: str | None = None
    cpu_affinity: str | None = None
    nvswitch_links: int = 0
    fabric: str | None = None


@dataclass(frozen=True, slots=True)
class PairLink:
    """What joins two GPUs.

    - ``level``: their PCIe common ancestor (``nvmlDeviceGetTopologyCommonAncestor``,
      ``TOPOLOGY_*``); ``None``: unknown.
    - ``nvlinks``: NVLinks joining them: the active links of one whose far end is the other's
      PCI address (``nvmlDeviceGetNvLinkState``, ``nvmlDeviceGetNvLinkRemotePciInfo_v2``:
      an NVLink bridge), or, both on NVSwitches of one fabric, the fewer of their switch links.
    - ``p2p``: ``nvmlDeviceGetP2PStatus`` (read) said OK; ``None``: not asked or failed.
    """

    level: int | None = None
    nvlinks: int = 0
    p2p: bool | None = None

    @property
    def score(self) -> int:
        """The pair's score on go-gpuallocator's scale: ``LEVEL_SCORE[level]`` (0 when unknown)
        plus ``NVLINK_SCORE`` per NVLink."""
        pcie = LEVEL_SCORE.get(self.level, 0) if self.level is not None else 0
        return pcie + NVLINK_SCORE * max(0, self.nvlinks)

    @property
    def name(self) -> str:
        """The pair as ``nvidia-smi topo -m`` prints it: ``NV<n>`` when NVLinks join them, else
        the common ancestor's name (``PIX``, ``SYS``, ...), ``X`` when unknown."""
        if self.nvlinks > 0:
            return f"NV{self.nvlinks}"
        return LEVEL_NAMES.get(self.level, "X") if self.level is not None else "X"


def _key(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class NodeTopology:
    """The GPUs of one node and what joins each pair, by NVML index.

    ``gpus``: one ``GpuTopology`` per GPU read; ``pairs``: ``(lower index, higher index)`` ->
    ``PairLink``; a pair absent is unknown (score 0). Built by the NVML reader
    (``sources.nvml.topology.read_topology``), by a trace's replay, or by the telemetry's
    parser (``core.schema.nodestate``)."""

    gpus: tuple[GpuTopology, ...] = ()
    pairs: Mapping[tuple[int, int], PairLink] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuTopology | None:
        """The GPU at NVML index ``index``; ``None`` when not read."""
        for g in self.gpus:
            if g.index == index:
                return g
        return None

    def link(self, a: int, b: int) -> PairLink | None:
        """What joins the GPUs at indices ``a`` and ``b`` (either order); ``None`` when unknown
        or ``a == b``."""
        return None if a == b else self.pairs.get(_key(a, b))

    def pair_score(self, a: int, b: int) -> int:
        """The pair's score (``PairLink.score``); 0 for one GPU with itself or an unknown
        pair."""
        link = self.link(a, b)
        return link.score if link is not None else 0

    def set_score(self, indices: Iterable[int]) -> int:
        """The score of a set of GPUs: the sum of its pairs' scores (go-gpuallocator's
        ``calculateGPUSetScore``); 0 for fewer than two."""
        return sum(self.pair_score(a, b) for a, b in combinations(sorted(set(indices)), 2))

    def islands(self) -> dict[int, str]:
        """Each GPU's NVLink island, by index: the GPUs NVLink reaches from it, directly or
        through others (connected components over pairs with ``nvlinks`` > 0), named
        ``"nvlink-<BDF>"`` by the island's lowest PCI address (``"nvlink-gpu<index>"`` when no
        address is known), or, for a GPU registered in a multi-node NVLink fabric, that fabric's
        ``"fabric-<clusterUuid>.<cliqueId>"``. A GPU no NVLink reaches is an island of its own.
        The names are stable across a reboot that renumbers GPUs (PCI addresses do not move).
        Worked out once per topology (it does not change while the driver is loaded, and every
        tick's telemetry and ResourceSlice ask for it); a copy each call."""
        return dict(self._islands)

    @cached_property
    def _islands(self) -> Mapping[int, str]:
        """``islands``' answer, kept on the (frozen) object after its first use."""
        parent = {g.index: g.index for g in self.gpus}

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for (a, b), link in sorted(self.pairs.items()):
            if link.nvlinks > 0 and a in parent and b in parent:
                ra, rb = root(a), root(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
        members: dict[int, list[GpuTopology]] = {}
        for g in self.gpus:
            members.setdefault(root(g.index), []).append(g)
        names: dict[int, str] = {}
        for group in members.values():
            buses = sorted(g.pci_bus_id for g in group if g.pci_bus_id)
            local = (f"nvlink-{buses[0]}" if buses
                     else f"nvlink-gpu{min(g.index for g in group)}")  # fmt: skip
            for g in group:
                names[g.index] = f"fabric-{g.fabric}" if g.fabric else local
        return MappingProxyType(names)

    def matrix(self) -> list[list[str]]:
        """The pairs as ``nvidia-smi topo -m`` draws them, rows and columns in index order
        (``X`` on the diagonal): for docs, ``omaticaya`` views and test messages."""
        order = sorted(g.index for g in self.gpus)
        rows = []
        for a in order:
            row = []
            for b in order:
                link = self.link(a, b)
                row.append("X" if link is None else link.name)
            rows.append(row)
        return rows


# ------------------------------------------------------------ from what NVML answers ----

#: ``nvmlIntNvLinkDeviceType_t``: the far end of an NVLink
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_SWITCH = 2


@dataclass(frozen=True, slots=True)
class NvLink:
    """One NVLink of a GPU as NVML answers it: ``link`` its number (0 ..
    ``NVML_NVLINK_MAX_LINKS`` - 1), ``active`` (``nvmlDeviceGetNvLinkState`` said
    ``NVML_FEATURE_ENABLED``), ``remote_bus_id`` the far end's PCI address in BDF form
    (``nvmlDeviceGetNvLinkRemotePciInfo_v2``; ``None``: not read), ``remote_type``
    (``nvmlDeviceGetNvLinkRemoteDeviceType``: ``NVLINK_REMOTE_GPU``, 1 an IBM NPU,
    ``NVLINK_REMOTE_SWITCH``, 255 unknown; ``None``: not read)."""

    link: int
    active: bool
    remote_bus_id: str | None = None
    remote_type: int | None = None


@dataclass(frozen=True, slots=True)
class GpuLinks:
    """What NVML (and sysfs) answer about one GPU's place, before it is made a
    ``NodeTopology`` (``build_topology``): the NVML reader gathers it on a real node, a trace's
    replay from the trace's ``devices[]`` (docs/trace-format.md, version 3).

    ``ancestors``: peer index -> ``nvmlDeviceGetTopologyCommonAncestor`` level;
    ``p2p_read``: peer index -> ``nvmlDeviceGetP2PStatus(..., NVML_P2P_CAPS_INDEX_READ)`` was
    ``NVML_P2P_STATUS_OK``; the other fields as in ``GpuTopology`` (``numa_node`` ``None``
    for NVML's or sysfs' -1)."""

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    pcie_root: str | None = None
    cpu_affinity: str | None = None
    fabric: str | None = None
    nvlinks: tuple[NvLink, ...] = ()
    ancestors: Mapping[int, int] = field(default_factory=dict)
    p2p_read: Mapping[int, bool] = field(default_factory=dict)


def cpu_ranges(words: Sequence[int], word_bits: int = 64) -> str | None:
    """A CPU mask as NVML's ``nvmlDeviceGetCpuAffinity`` fills it (``words[k]`` holds CPUs
    ``k * word_bits`` .. ``(k + 1) * word_bits - 1``, lowest bit first) as the ranges Linux
    prints (``"0-55,112-167"``); ``None`` for an empty mask."""
    cpus = [k * word_bits + bit for k, word in enumerate(words)
            for bit in range(word_bits) if (int(word) >> bit) & 1]  # fmt: skip
    if not cpus:
        return None
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and spans[-1][1] == cpu - 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def build_topology(gpus: Sequence[GpuLinks]) -> NodeTopology:
    """The node's topology from each GPU's answers.

    - A GPU: its facts as given; ``nvswitch_links`` counts its active links whose far end is an
      NVSwitch.
    - A pair ``(a, b)``: ``level`` from ``a``'s ancestors (else ``b``'s); ``p2p`` True only when
      both directions that were asked said OK; ``nvlinks``: the active links of ``a`` whose far
      end is ``b``'s PCI address (an NVLink bridge; the larger of the two directions' counts,
      which agree on a healthy board), plus, when both have links to NVSwitches, the fewer of
      their switch links (on one board the NVSwitches join every GPU; GPUs registered in
      different multi-node fabrics are not joined).
    """
    by_bus = {g.pci_bus_id: g.index for g in gpus if g.pci_bus_id}
    tops = []
    switch: dict[int, int] = {}
    direct: dict[tuple[int, int], int] = {}
    for g in gpus:
        n_switch = 0
        for link in g.nvlinks:
            if not link.active:
                continue
            if link.remote_type == NVLINK_REMOTE_SWITCH:
                n_switch += 1
                continue
            peer = by_bus.get(link.remote_bus_id) if link.remote_bus_id else None
            if peer is not None and peer != g.index:
                key = (g.index, peer)
                direct[key] = direct.get(key, 0) + 1
        switch[g.index] = n_switch
        tops.append(GpuTopology(g.index, g.uuid, g.pci_bus_id, g.numa_node, g.pcie_root,
                                g.cpu_affinity, n_switch, g.fabric))  # fmt: skip
    facts = {g.index: g for g in gpus}
    pairs: dict[tuple[int, int], PairLink] = {}
    for a, b in combinations(sorted(facts), 2):
        fa, fb = facts[a], facts[b]
        level = fa.ancestors.get(b, fb.ancestors.get(a))
        asked = [v for v in (fa.p2p_read.get(b), fb.p2p_read.get(a)) if v is not None]
        nvlinks = max(direct.get((a, b), 0), direct.get((b, a), 0))
        if switch[a] and switch[b] and fa.fabric == fb.fabric:
            nvlinks += min(switch[a], switch[b])
        pairs[(a, b)] = PairLink(level, nvlinks, all(asked) if asked else None)
    return NodeTopology(tuple(tops), pairs)
