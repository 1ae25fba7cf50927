"""Topology published (issue 50 item 3): the DRA devices' standard attributes and NVLink island,
the telemetry's ``links`` and per-GPU facts, and the telemetry read back as untrusted input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from omaticaya_py.core.model.sharing import Sharing, parse_shared_gpus
from omaticaya_py.core.model.topology import GpuTopology, NodeTopology, PairLink
from omaticaya_py.core.publish.dra import inventory
from omaticaya_py.core.publish.render_telemetry import telemetry
from omaticaya_py.core.publish.slice_device import SliceDevice, slice_devices
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import attributes as A
from omaticaya_py.core.schema.nodestate import MAX_PAIR_NVLINKS, topology_of
from omaticaya_py.core.schema.telemetry import Telemetry
from omaticaya_py.sources.replay import TraceReader

DATA = Path(__file__).resolve().parents[2] / "data"
HGX = DATA / "hgx-h100-topo-trace.json"
BRIDGE = DATA / "pcie-nvlink-bridge-topo-trace.json"


def _devices(trace: Path, snapshot=None) -> list[SliceDevice]:
    snap = snapshot or TraceReader(trace, loop=False).read()
    sharing = Sharing(parse_shared_gpus(""), 1024)
    return slice_devices(inventory(snap, assess(snap), sharing, 1024, 10), snap)


def test_every_gpu_publishes_the_standard_attributes_in_their_formats():
    snap = TraceReader(BRIDGE, loop=False).read()
    assert snap.topology is not None
    for d in _devices(BRIDGE, snap):
        attrs = d.render()["attributes"]
        t = snap.topology.gpu(d.gpu_index)
        assert t is not None
        assert attrs[A.PCI_BUS_ID] == {"string": t.pci_bus_id}
        assert attrs[A.PCIE_ROOT] == {"string": t.pcie_root}
        assert attrs[A.NUMA_NODE] == {"int": t.numa_node}
        assert attrs[A.NVLINK_ISLAND] == {"string": snap.topology.islands()[d.gpu_index]}
        assert len(attrs) + len(d.render().get("capacity", {})) <= 32  # the API's bound


@pytest.mark.parametrize(("trace", "islands"), [(HGX, 1), (BRIDGE, 4)])
def test_the_nvlink_island_groups_the_gpus_nvlink_joins(trace, islands):
    values = {d.render()["attributes"][A.NVLINK_ISLAND]["string"] for d in _devices(trace)}
    assert len(values) == islands


def test_a_gpu_without_numa_node_or_topology_publishes_none_of_them():
    snap = TraceReader(BRIDGE, loop=False).read()
    assert snap.topology is not None
    gone = snap.topology.gpus[0]
    topo = replace(snap.topology, gpus=(replace(gone, numa_node=None),
                                        *snap.topology.gpus[1:]))  # fmt: skip
    first = _devices(BRIDGE, replace(snap, topology=topo))[0].render()["attributes"]
    assert A.NUMA_NODE not in first and A.PCI_BUS_ID in first
    bare = _devices(BRIDGE, replace(snap, topology=None))[0].render()["attributes"]
    assert not {A.PCI_BUS_ID, A.PCIE_ROOT, A.NUMA_NODE, A.NVLINK_ISLAND} & set(bare)


def test_a_mig_device_has_its_gpus_root_and_numa_node_but_no_pci_address():
    d = SliceDevice("gpu-a-mig-0", "mig", False, 0, mig_index=0, profile="1g.10gb",
                    pci_bus_id="0000:3b:00.0", pcie_root="pci0000:3a", numa_node=1,
                    nvlink_island="nvlink-0000:3b:00.0")  # fmt: skip
    attrs = d.render()["attributes"]
    assert A.PCI_BUS_ID not in attrs
    assert attrs[A.PCIE_ROOT] == {"string": "pci0000:3a"} and attrs[A.NUMA_NODE] == {"int": 1}


@pytest.mark.parametrize("trace", [HGX, BRIDGE])
def test_the_telemetry_carries_the_topology_and_reads_it_back(trace):
    snap = TraceReader(trace, loop=False).read()
    assert snap.topology is not None
    doc = json.loads(telemetry(snap, assess(snap)))
    n = len(snap.gpus)
    assert len(doc["links"]) == n * (n - 1) // 2
    for g in doc["gpus"]:
        t = snap.topology.gpu(g["index"])
        assert t is not None
        assert (g["pci_bus_id"], g["numa_node"], g["pcie_root"]) == (t.pci_bus_id, t.numa_node, t.pcie_root)
        assert g["nvlink_island"] == snap.topology.islands()[g["index"]]
    parsed = topology_of(Telemetry.parse(json.dumps(doc))[0])
    assert parsed is not None
    assert parsed.matrix() == snap.topology.matrix()


def test_no_topology_no_links_key():
    snap = TraceReader(DATA / "multi-gpu-trace.json", loop=False).read()
    doc = json.loads(telemetry(snap, assess(snap)))
    assert "links" not in doc and not any("pci_bus_id" in g for g in doc["gpus"])
    assert topology_of(Telemetry.parse(json.dumps(doc))[0]) is None


BAD_LINKS = [
    # (case, the link entry, what the pair (0, 1) reads as: None = left out)
    ("a good one", {"a": 0, "b": 1, "level": 10, "nvlinks": 2, "p2p": True}, PairLink(10, 2, True)),
    ("reversed indices", {"a": 1, "b": 0, "level": 10, "nvlinks": 2}, PairLink(10, 2, None)),
    ("a level NVML does not define", {"a": 0, "b": 1, "level": 7, "nvlinks": 0}, PairLink(None, 0)),
    ("negative NVLinks", {"a": 0, "b": 1, "level": 50, "nvlinks": -3}, PairLink(50, 0)),
    ("too many NVLinks", {"a": 0, "b": 1, "level": 50, "nvlinks": MAX_PAIR_NVLINKS + 1}, PairLink(50, 0)),
    ("NVLinks a string", {"a": 0, "b": 1, "nvlinks": "lots"}, PairLink(None, 0)),
    ("a GPU with itself", {"a": 0, "b": 0, "nvlinks": 4}, None),
    ("an index that is no GPU", {"a": 0, "b": 9, "nvlinks": 4}, None),
    ("no index", {"b": 1, "nvlinks": 4}, None),
    ("not an object", "0-1:NV4", None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "entry", "pair"), BAD_LINKS, ids=[c[0] for c in BAD_LINKS])
def test_links_read_as_untrusted_input(case, entry, pair):
    doc = {"schema": 2, "read_at": "2026-12-07T00:00:00Z",
           "gpus": [{"index": 0}, {"index": 1}], "links": [entry]}  # fmt: skip
    parsed, problem = Telemetry.parse(json.dumps(doc))
    assert problem is None and parsed is not None, case
    topo = topology_of(parsed)
    assert topo is not None
    assert topo.link(0, 1) == pair, case


def test_islands_are_named_by_pci_address_and_fabric():
    topo = NodeTopology(
        (GpuTopology(0, pci_bus_id="0000:18:00.0"), GpuTopology(1, pci_bus_id="0000:08:00.0"),
         GpuTopology(2), GpuTopology(3, fabric="c1.7")),
        {(0, 1): PairLink(50, 4), (0, 2): PairLink(50, 0), (0, 3): PairLink(50, 0),
         (1, 2): PairLink(50, 0), (1, 3): PairLink(50, 0), (2, 3): PairLink(50, 0)},
    )  # fmt: skip
    assert topo.islands() == {0: "nvlink-0000:08:00.0", 1: "nvlink-0000:08:00.0",
                              2: "nvlink-gpu2", 3: "fabric-c1.7"}  # fmt: skip
