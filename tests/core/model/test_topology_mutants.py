"""``core.model.topology`` cases that mutation testing (``scripts/mutation``) found no test
pinned, each named by the rule it pins:

- ``pci_bdf``: the domain read in hex (given, or 0 when absent), the bounds of a domain
  (0xffff) and of a device number (0x1f) exactly at and just past them, the device number read
  from its own field in hex.
- ``pcie_root_of``: the root complex of a resolved sysfs path, upper case read alike, ``None``
  for a path with none.
- ``build_topology``: a GPU's UUID kept; a pair's PCIe level from either GPU's answer; its P2P
  status from either direction, ``None`` when neither was asked; its NVLink bridge links counted
  from either direction, an inactive link skipped without ending the count; bridge links and
  switch links added up; GPUs on NVSwitches of different multi-node fabrics not joined.
- ``NodeTopology``: one NVLink makes an island; a GPU with itself is no pair whatever
  ``pairs`` holds; an unknown pair scores 0.
"""

from __future__ import annotations

import pytest

from omaticaya_py.core.model.topology import (
    NVLINK_REMOTE_GPU,
    NVLINK_REMOTE_SWITCH,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    GpuLinks,
    GpuTopology,
    NodeTopology,
    NvLink,
    PairLink,
    build_topology,
    pci_bdf,
    pcie_root_of,
)

BUS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0")  # GPU 0, 1, 2's PCI addresses


# ------------------------------------------------------------------ pci_bdf ----


@pytest.mark.parametrize(
    ("bus_id", "want"),
    [
        ("3b:00.0", "0000:3b:00.0"),  # no domain: domain 0
        ("00000010:3B:00.0", "0010:3b:00.0"),  # the domain is hex: 0x10, not 10 or 17
        ("0000000a:3b:00.0", "000a:3b:00.0"),
        ("0001:3b:00.0", "0001:3b:00.0"),  # a domain given is kept, not read as 0
        ("0000ffff:3b:00.0", "ffff:3b:00.0"),  # the largest domain
        ("00010000:3b:00.0", None),  # one past it
        ("0000:3b:01.0", "0000:3b:01.0"),  # the device number is its own field, not the function's
        ("0000:3b:0a.0", "0000:3b:0a.0"),  # ... read in hex
        ("0000:3b:10.0", "0000:3b:10.0"),  # 0x10, not 17
        ("0000:3b:1f.0", "0000:3b:1f.0"),  # the largest device number
        ("0000:3b:20.0", None),  # one past it
        ("0000:3b:00.7", "0000:3b:00.7"),
    ],
)
def test_pci_bdf_reads_each_field_in_hex_within_its_bounds(bus_id, want):
    assert pci_bdf(bus_id) == want


# ------------------------------------------------------------- pcie_root_of ----


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "pci0000:3a"),
        ("/sys/devices/PCI0000:3A/0000:3A:00.0/0000:3B:00.0", "pci0000:3a"),  # read lower case
        ("/sys/devices/pci0001:b0/0001:b0:02.0/0001:b1:00.0", "pci0001:b0"),
        ("/sys/devices/virtual/misc/nvidia-uvm", None),  # no root complex: a virtual device
        ("pci0000:3a", "pci0000:3a"),
    ],
)
def test_pcie_root_of_a_sysfs_path(path, want):
    assert pcie_root_of(path) == want


# ----------------------------------------------------------- build_topology ----


def _gpu(index: int, **kw) -> GpuLinks:
    return GpuLinks(index, pci_bus_id=BUS[index], **kw)


def _bridge(*peers: int, active: bool = True) -> tuple[NvLink, ...]:
    """NVLinks to other GPUs' PCI addresses (an NVLink bridge), numbered from 0."""
    return tuple(NvLink(k, active, BUS[p], NVLINK_REMOTE_GPU) for k, p in enumerate(peers))


def _switch(n: int, first: int = 0) -> tuple[NvLink, ...]:
    """``n`` active NVLinks to NVSwitches, numbered from ``first``."""
    return tuple(NvLink(first + k, True, None, NVLINK_REMOTE_SWITCH) for k in range(n))


def test_a_gpus_facts_are_kept():
    got = build_topology([GpuLinks(0, "GPU-a", BUS[0], 1, "pci0000:17", "0-7", "c.1")]).gpus
    assert got == (GpuTopology(0, "GPU-a", BUS[0], 1, "pci0000:17", "0-7", 0, "c.1"),)


PAIRS = [
    # (case, GPU 0's facts, GPU 1's facts, the pair (0, 1) built)
    ("the level from GPU 0's answer", {"ancestors": {1: TOPOLOGY_SINGLE}}, {},
     PairLink(TOPOLOGY_SINGLE)),
    ("the level from GPU 1's answer", {}, {"ancestors": {0: TOPOLOGY_NODE}},
     PairLink(TOPOLOGY_NODE)),
    ("GPU 0's level first", {"ancestors": {1: TOPOLOGY_SINGLE}},
     {"ancestors": {0: TOPOLOGY_SYSTEM}}, PairLink(TOPOLOGY_SINGLE)),
    ("no level asked: unknown", {}, {}, PairLink(None)),
    ("P2P asked of neither: unknown", {}, {}, PairLink(p2p=None)),
    ("P2P OK both ways", {"p2p_read": {1: True}}, {"p2p_read": {0: True}}, PairLink(p2p=True)),
    ("P2P OK one way, the other not asked", {"p2p_read": {1: True}}, {}, PairLink(p2p=True)),
    ("P2P refused by GPU 0, GPU 1 not asked", {"p2p_read": {1: False}}, {},
     PairLink(p2p=False)),
    ("P2P refused by GPU 1, GPU 0 not asked", {}, {"p2p_read": {0: False}},
     PairLink(p2p=False)),
    ("P2P refused one way of two", {"p2p_read": {1: True}}, {"p2p_read": {0: False}},
     PairLink(p2p=False)),
    ("bridge links counted from GPU 0", {"nvlinks": _bridge(1, 1)}, {}, PairLink(nvlinks=2)),
    ("bridge links counted from GPU 1", {}, {"nvlinks": _bridge(0, 0, 0)},
     PairLink(nvlinks=3)),
    ("the larger direction's count", {"nvlinks": _bridge(1)}, {"nvlinks": _bridge(0, 0)},
     PairLink(nvlinks=2)),
    ("an inactive link is skipped, the next counted",
     {"nvlinks": (NvLink(0, False, BUS[1], NVLINK_REMOTE_GPU),
                  NvLink(1, True, BUS[1], NVLINK_REMOTE_GPU))}, {}, PairLink(nvlinks=1)),
    ("bridge links and switch links add up", {"nvlinks": _bridge(1) + _switch(2, 1)},
     {"nvlinks": _switch(4)}, PairLink(nvlinks=3)),
    ("switch links: the fewer of the two", {"nvlinks": _switch(4)}, {"nvlinks": _switch(2)},
     PairLink(nvlinks=2)),
    ("switches of one multi-node fabric join", {"nvlinks": _switch(2), "fabric": "c.1"},
     {"nvlinks": _switch(2), "fabric": "c.1"}, PairLink(nvlinks=2)),
    ("switches of different multi-node fabrics do not",
     {"nvlinks": _switch(2), "fabric": "c.1"}, {"nvlinks": _switch(2), "fabric": "c.2"},
     PairLink(nvlinks=0)),
    ("only one of them on switches", {"nvlinks": _switch(2)}, {}, PairLink(nvlinks=0)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "a", "b", "want"), PAIRS, ids=[c[0] for c in PAIRS])
def test_a_pair_built_from_both_gpus_answers(case, a, b, want):
    topo = build_topology([_gpu(0, **a), _gpu(1, **b)])
    assert topo.pairs == {(0, 1): want}, case


def test_switch_links_counted_per_gpu():
    topo = build_topology([_gpu(0, nvlinks=_bridge(1) + _switch(3, 1)), _gpu(1)])
    assert [g.nvswitch_links for g in topo.gpus] == [3, 0]


# ------------------------------------------------------------- NodeTopology ----


def test_one_nvlink_makes_an_island():
    topo = NodeTopology(
        tuple(GpuTopology(k, pci_bus_id=BUS[k]) for k in range(3)),
        {(0, 1): PairLink(TOPOLOGY_SYSTEM, nvlinks=1), (1, 2): PairLink(TOPOLOGY_SYSTEM)},
    )
    assert topo.islands() == {0: f"nvlink-{BUS[0]}", 1: f"nvlink-{BUS[0]}",
                              2: f"nvlink-{BUS[2]}"}  # fmt: skip


def test_a_gpu_with_itself_is_no_pair_whatever_pairs_holds():
    """A ``NodeTopology`` parsed from a telemetry annotation may name a GPU paired with itself."""
    topo = NodeTopology((GpuTopology(0), GpuTopology(1)),
                        {(1, 1): PairLink(TOPOLOGY_SINGLE, nvlinks=4)})  # fmt: skip
    assert topo.link(1, 1) is None
    assert topo.pair_score(1, 1) == 0


@pytest.mark.parametrize(("a", "b"), [(0, 1), (1, 0), (0, 7)])
def test_an_unknown_pair_scores_0(a, b):
    topo = NodeTopology((GpuTopology(0), GpuTopology(1)), {})
    assert topo.link(a, b) is None
    assert topo.pair_score(a, b) == 0
    assert topo.set_score([a, b]) == 0
