"""On a real GPU (issue 50 item 7): the topology the NVML reader reads is what sysfs and
``nvidia-smi topo -m`` say, and the recorder's topology replays to the same. Skips, saying why,
where NVML cannot start (CI never has a GPU); run by devtools/gpu-check.sh."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from omaticaya_py.core.model.topology import pci_bdf, pcie_root_of
from omaticaya_py.sources.nvml import NvmlReader, nvml_available

pytestmark = [
    pytest.mark.nvml,
    pytest.mark.skipif(
        not nvml_available(), reason="no NVIDIA GPU/driver here: NVML cannot start (nvmlInit failed)"
    ),
]
SYS = Path("/sys")


@pytest.fixture(scope="module")
def topology():
    reader = NvmlReader(watch_xid=False)
    try:
        snap = reader.read()
    finally:
        reader.close()
    assert snap.error is None, snap.error
    assert snap.topology is not None, "the NVML reader read no topology on a real GPU"
    return snap


def test_each_gpus_address_root_and_numa_node_are_sysfs(topology):
    for g in topology.topology.gpus:
        assert g.pci_bus_id is not None and pci_bdf(g.pci_bus_id) == g.pci_bus_id, g
        dev = SYS / "bus" / "pci" / "devices" / g.pci_bus_id
        assert dev.exists(), f"GPU {g.index}: {dev} is not in sysfs"
        assert g.pcie_root == pcie_root_of(os.path.realpath(dev)), g
        numa = int((dev / "numa_node").read_text().strip()) if (dev / "numa_node").exists() else -1
        assert g.numa_node == (numa if numa >= 0 else None), (g, numa)


def _topo_m() -> list[list[str]]:
    """``nvidia-smi topo -m``'s GPU rows: for each GPUi, its cells over the GPU columns."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60,
                         check=True).stdout  # fmt: skip
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in out.splitlines()]
    header = next(line for line in lines if re.search(r"\bGPU0\b", line))
    gpus = [c for c in header.split() if re.fullmatch(r"GPU\d+", c)]
    rows = []
    for line in lines:
        cells = line.split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]):
            rows.append(cells[1 : 1 + len(gpus)])
    return rows


def test_the_pairs_are_nvidia_smi_topo_m(topology):
    assert _topo_m() == topology.topology.matrix()


def test_the_recorder_records_the_topology_the_reader_reads(topology, tmp_path):
    from omaticaya_py.sources.record.command import record
    from omaticaya_py.sources.replay import TraceReader

    out = tmp_path / "t.json"
    record(out, duration_s=0.5, interval_s=0.25)
    replayed = TraceReader(out, at_s=0).read().topology
    assert replayed is not None
    assert replayed.matrix() == topology.topology.matrix()
    assert [(g.pci_bus_id, g.numa_node, g.pcie_root, g.cpu_affinity) for g in replayed.gpus] == [
        (g.pci_bus_id, g.numa_node, g.pcie_root, g.cpu_affinity) for g in topology.topology.gpus
    ]
