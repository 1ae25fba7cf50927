"""Trace format version 3 (topology) and the three topology traces: the files are what the
generator makes, they load and replay, and the replayed topology is the published
`nvidia-smi topo -m` (tests/data/make_topology_traces.py keeps each matrix and cites it)."""

from __future__ import annotations

import copy
import json
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from omaticaya_py.core.model.topology import TOPOLOGY_MULTIPLE, TOPOLOGY_SINGLE, TOPOLOGY_SYSTEM
from omaticaya_py.sources.replay import TraceReader
from omaticaya_py.sources.trace import FORMAT_VERSIONS, TraceDevice, TraceError, load_trace
from omaticaya_py.sources.trace_topology import gpu_links, trace_topology
from tests.data import make_topology_traces as gen

DATA = Path(__file__).resolve().parent.parent / "data"

BOARDS = {b.file: b for b in gen.BOARDS}
LAST_SAMPLE_S = 22.95  # just after the traces' last sample (t = 22.922)


def _published(name: str) -> gen.Published:
    return gen.parse_matrix(BOARDS[name].matrix)


def _read(name: str, at_s: float = LAST_SAMPLE_S):
    return TraceReader(DATA / name, at_s=at_s, window_s=0.1).read()


# ------------------------------------------------------------------------- the files themselves


def test_the_topology_traces_are_what_the_generator_makes(tmp_path: Path) -> None:
    for path in gen.write_all(tmp_path):
        current = (DATA / path.name).read_bytes()
        assert current == path.read_bytes(), (
            f"run python tests/data/make_topology_traces.py ({path.name})"
        )


def test_format_version_3_is_read_and_4_is_refused(tmp_path: Path) -> None:
    assert FORMAT_VERSIONS == (1, 2, 3)
    doc = json.loads((DATA / "hgx-h100-topo-trace.json").read_text())
    doc["format_version"] = 4
    path = tmp_path / "v4.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        TraceError, match=r"format_version: 4 is not a version this reader replays \(1, 2, 3\)"
    ):
        load_trace(path)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_each_trace_loads_as_version_3_and_replays_every_sample_with_one_topology(
    name: str,
) -> None:
    trace = load_trace(DATA / name)
    assert trace.format_version == 3
    reader = TraceReader(DATA / name, at_s=0.0)
    first = reader.read()
    assert first.topology is not None
    for sample in trace.samples:
        reader.at_s = sample.t
        snap = reader.read()
        assert snap.error is None
        assert snap.topology is first.topology  # built once at load
        assert [g.index for g in snap.gpus] == list(range(len(_published(name).names)))


# -------------------------------------------------------------------- the published topologies


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_the_replayed_matrix_is_the_published_one(name: str) -> None:
    published = [list(row) for row in _published(name).names]
    assert _read(name).topology.matrix() == published


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_numa_nodes_and_cpu_affinity_are_the_published_ones(name: str) -> None:
    pub = _published(name)
    gpus = _read(name).topology.gpus
    assert [g.numa_node for g in gpus] == list(pub.numa_node)
    assert [g.cpu_affinity for g in gpus] == list(pub.cpu_affinity)


@pytest.mark.parametrize(
    ("name", "groups"),
    [
        ("hgx-h100-topo-trace.json", [{0, 1, 2, 3, 4, 5, 6, 7}]),
        ("pcie-nvlink-bridge-topo-trace.json", [{0, 1}, {2, 3}, {4, 5}, {6, 7}]),
        ("workstation-4gpu-topo-trace.json", [{0, 1}, {2}, {3}]),
    ],
)
def test_nvlink_islands(name: str, groups: list[set[int]]) -> None:
    islands = _read(name).topology.islands()
    found: dict[str, set[int]] = {}
    for index, island in islands.items():
        found.setdefault(island, set()).add(index)
    assert sorted(found.values(), key=min) == groups
    bus = {g.index: g.pci_bus_id for g in _read(name).topology.gpus}
    for island, members in found.items():  # named by the island's lowest PCI address
        assert island == f"nvlink-{min(bus[i] for i in members)}"


def test_the_hgx_board_reaches_every_gpu_through_18_nvswitch_links() -> None:
    topo = _read("hgx-h100-topo-trace.json").topology
    assert {g.nvswitch_links for g in topo.gpus} == {18}
    assert {topo.link(a, b).nvlinks for a, b in combinations(range(8), 2)} == {18}
    assert topo.gpu(0).pci_bus_id == "0000:18:00.0"  # published
    assert topo.gpu(1).pci_bus_id == "0000:2a:00.0"  # published


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_pcie_roots_agree_with_the_published_levels(name: str) -> None:
    topo = _read(name).topology
    for a, b in combinations(range(len(topo.gpus)), 2):
        link = topo.link(a, b)
        same_root = topo.gpu(a).pcie_root == topo.gpu(b).pcie_root
        if link.level in (TOPOLOGY_SINGLE, TOPOLOGY_MULTIPLE):
            assert same_root, (a, b)
        if link.level == TOPOLOGY_SYSTEM:
            assert not same_root, (a, b)
            assert topo.gpu(a).numa_node != topo.gpu(b).numa_node


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_pairs_joined_by_nvlink_score_above_every_pcie_pair(name: str) -> None:
    topo = _read(name).topology
    pairs = list(combinations(range(len(topo.gpus)), 2))
    bridged = [p for p in pairs if topo.link(*p).nvlinks]
    plain = [p for p in pairs if not topo.link(*p).nvlinks]
    assert bridged
    assert all(
        topo.pair_score(*p) > max((topo.pair_score(*q) for q in plain), default=0) for p in bridged
    )


# ------------------------------------------------------------------------ live memory differs


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_later_samples_load_the_recorded_and_the_neighbour_gpu(name: str) -> None:
    board = BOARDS[name]
    early = {g.index: g for g in _read(name, at_s=0.0).gpus}
    late = {g.index: g for g in _read(name, at_s=14.2).gpus}
    assert len({g.memory_free_mib for g in early.values()}) == 1  # all idle at first
    idle_free = early[0].memory_free_mib
    neighbour = late[board.neighbour_gpu]
    assert idle_free - neighbour.memory_free_mib == board.neighbour_gib * 1024
    assert [p.pid for p in neighbour.processes] == [gen.NEIGHBOUR_PID]
    assert idle_free - late[board.recorded_gpu].memory_free_mib > 30 * 1024  # the 30 GiB load
    others = [g for i, g in late.items() if i not in (board.neighbour_gpu, board.recorded_gpu)]
    assert {g.memory_free_mib for g in others} == {idle_free}
    assert all(g.memory_total_mib == board.memory_total_bytes >> 20 for g in late.values())


# ------------------------------------------------------------------------- older traces, none


@pytest.mark.parametrize("name", ["h100-trace.json", "h100-mig-trace.json", "multi-gpu-trace.json"])
def test_a_trace_without_topology_replays_with_none(name: str) -> None:
    assert TraceReader(DATA / name, at_s=1.0).read().topology is None


def test_a_version_3_trace_without_topology_keys_replays_with_none(tmp_path: Path) -> None:
    doc = json.loads((DATA / "h100-mig-trace.json").read_text())
    doc["format_version"] = 3
    path = tmp_path / "v3-plain.json"
    path.write_text(json.dumps(doc))
    assert TraceReader(path, at_s=1.0).read().topology is None


def test_a_sample_where_nvml_failed_has_no_topology(tmp_path: Path) -> None:
    doc = json.loads((DATA / "workstation-4gpu-topo-trace.json").read_text())
    doc["samples"][2] = {"t": doc["samples"][2]["t"], "nvml_error": "NVMLError_DriverNotLoaded"}
    path = tmp_path / "driver-gone.json"
    path.write_text(json.dumps(doc))
    reader = TraceReader(path, at_s=doc["samples"][2]["t"])
    snap = reader.read()
    assert snap.error == "NVMLError_DriverNotLoaded"
    assert snap.topology is None
    reader.at_s = doc["samples"][3]["t"]
    assert reader.read().topology is reader.topology is not None


# ----------------------------------------------------------------- the trace -> GpuLinks step


def _device(**keys: Any) -> TraceDevice:
    return TraceDevice.model_validate(
        {"index": 1, "uuid": "GPU-b", "pci_bus_id": "00000000:3B:00.0", **keys}
    )


@pytest.mark.parametrize(
    ("keys", "field", "expected"),
    [
        ({}, "pci_bus_id", "0000:3b:00.0"),
        ({"pci_bus_id": "not-a-bus"}, "pci_bus_id", None),
        ({"numa_node": -1}, "numa_node", None),
        ({"numa_node": 3}, "numa_node", 3),
        ({"cpu_affinity": [0xF0, 1]}, "cpu_affinity", "4-7,64"),
        ({"cpu_affinity": [0]}, "cpu_affinity", None),
        ({"cpu_affinity": []}, "cpu_affinity", None),
        ({"pcie_root": "pci0000:3a"}, "pcie_root", "pci0000:3a"),
        (
            {"fabric": {"cluster_uuid": "c1", "clique_id": 7, "state": 3, "status": 0}},
            "fabric",
            "c1.7",
        ),
        (
            {"fabric": {"cluster_uuid": "c1", "clique_id": 7, "state": 2, "status": 0}},
            "fabric",
            None,
        ),
        (
            {"fabric": {"cluster_uuid": "c1", "clique_id": 7, "state": 3, "status": 3}},
            "fabric",
            None,
        ),
        ({"topology": {"0": 10, "2": 50}}, "ancestors", {0: 10, 2: 50}),
        ({"p2p_read": {"0": 0, "2": 5}}, "p2p_read", {0: True, 2: False}),
    ],
)
def test_gpu_links_from_a_device_entry(keys: dict, field: str, expected: object) -> None:
    assert getattr(gpu_links(_device(**keys)), field) == expected


def test_nvlinks_from_a_device_entry_in_link_order() -> None:
    links = gpu_links(
        _device(
            nvlinks=[
                {
                    "link": 3,
                    "state": 0,
                    "remote_pci_bus_id": "00000000:07:00.0",
                    "remote_device_type": 0,
                },
                {
                    "link": 1,
                    "state": 1,
                    "remote_pci_bus_id": "00000000:07:00.0",
                    "remote_device_type": 0,
                },
                {"link": 2, "state": 1},
            ]
        )
    ).nvlinks
    assert [(n.link, n.active, n.remote_bus_id, n.remote_type) for n in links] == [
        (1, True, "0000:07:00.0", 0),
        (2, True, None, None),
        (3, False, "0000:07:00.0", 0),
    ]


def test_gpus_of_one_completed_fabric_form_its_island() -> None:
    fabric = {"cluster_uuid": "c1", "clique_id": 7, "state": 3, "status": 0}
    switch = [
        {"link": k, "state": 1, "remote_pci_bus_id": "00000000:05:00.0", "remote_device_type": 2}
        for k in range(2)
    ]
    devices = [
        TraceDevice.model_validate(
            {
                "index": i,
                "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
                "fabric": fabric,
                "nvlinks": switch,
            }
        )
        for i in range(2)
    ]
    topo = trace_topology(devices)
    assert topo.islands() == {0: "fabric-c1.7", 1: "fabric-c1.7"}
    assert topo.link(0, 1).nvlinks == 2


def test_no_topology_key_gives_no_topology() -> None:
    assert trace_topology([_device(), _device(index=0)]) is None
    assert trace_topology([_device(numa_node=0)]) is not None


# ---------------------------------------------------------------------- malformed version 3


def _mutated(tmp_path: Path, name: str, mutate) -> Path:
    doc = json.loads((DATA / "workstation-4gpu-topo-trace.json").read_text())
    mutate(doc["devices"][1])
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _set(key: str, value: object):
    return lambda d: d.__setitem__(key, value)


def _link(key: str, value: object):
    return lambda d: d["nvlinks"][0].__setitem__(key, value)


BAD = [
    (
        "topology-key",
        _set("topology", {"zero": 40}),
        "devices[1].topology: key 'zero' is not a GPU index",
    ),
    (
        "topology-level",
        _set("topology", {"0": 35}),
        "devices[1].topology: 0: 35 is not an NVML_TOPOLOGY_* level",
    ),
    (
        "topology-not-a-map",
        _set("topology", [40, 50]),
        "devices[1].topology: Input should be a valid dictionary",
    ),
    (
        "numa-below-none",
        _set("numa_node", -2),
        "devices[1].numa_node: Input should be greater than or equal to -1",
    ),
    (
        "numa-a-string",
        _set("numa_node", "0"),
        "devices[1].numa_node: Input should be a valid integer",
    ),
    (
        "cpu-word-negative",
        _set("cpu_affinity", [1, -1]),
        "devices[1].cpu_affinity: word 1: -1 is not a 64-bit CPU mask word",
    ),
    ("cpu-word-too-wide", _set("cpu_affinity", [1 << 64]), "devices[1].cpu_affinity: word 0:"),
    (
        "pcie-root-form",
        _set("pcie_root", "0000:3a"),
        "devices[1].pcie_root: String should match pattern",
    ),
    (
        "nvlink-state",
        _link("state", 2),
        "devices[1].nvlinks[0].state: Input should be less than or equal to 1",
    ),
    (
        "nvlink-number",
        _link("link", 18),
        "devices[1].nvlinks[0].link: Input should be less than 18",
    ),
    (
        "nvlink-remote",
        _link("remote_pci_bus_id", "GPU-1"),
        "devices[1].nvlinks[0].remote_pci_bus_id: 'GPU-1' is not a PCI bus id",
    ),
    (
        "nvlink-remote-type",
        _link("remote_device_type", 7),
        "devices[1].nvlinks[0].remote_device_type: 7 is not an nvmlIntNvLinkDeviceType_t",
    ),
    (
        "nvlink-twice",
        lambda d: d["nvlinks"].append(copy.deepcopy(d["nvlinks"][0])),
        "devices[1].nvlinks: nvlinks[12]: link 0 appears twice",
    ),
    (
        "nvlink-no-state",
        lambda d: d["nvlinks"][0].pop("state"),
        "devices[1].nvlinks[0].state: Field required",
    ),
    (
        "p2p-status",
        _set("p2p_read", {"0": 9}),
        "devices[1].p2p_read: 0: 9 is not an nvmlGpuP2PStatus_t",
    ),
    (
        "fabric-no-cluster",
        _set("fabric", {"clique_id": 1, "state": 3, "status": 0}),
        "devices[1].fabric.cluster_uuid: Field required",
    ),
    (
        "fabric-state",
        _set("fabric", {"cluster_uuid": "c", "clique_id": 1, "state": 4, "status": 0}),
        "devices[1].fabric.state: Input should be less than or equal to 3",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "expected"), BAD, ids=[b[0] for b in BAD])
def test_a_malformed_version_3_key_names_file_and_key(
    tmp_path: Path, name: str, mutate, expected: str
) -> None:
    path = _mutated(tmp_path, name, mutate)
    with pytest.raises(TraceError) as info:
        TraceReader(path)
    lines = str(info.value).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert any(expected in line for line in lines), lines
