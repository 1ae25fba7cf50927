"""Derive the topology traces (format version 3) from published `nvidia-smi topo -m` outputs.

    python tests/data/make_topology_traces.py      # rewrites the three *-topo-trace.json files

Each trace is one published matrix (kept below as `Board.matrix`, the source) made into what
NVML would answer on that node, with the load of the real H100 recording:

- `hgx-h100-topo-trace.json`: an 8-GPU HGX H100 board (Supermicro SYS-821GE-TNHR), matrix,
  CPU affinity and NUMA nodes from https://github.com/NVIDIA/nccl/issues/1264 (NV18 between
  every pair; GPUs 0-3 on NUMA node 0, CPUs 0-55,112-167; GPUs 4-7 on node 1, CPUs
  56-111,168-223). Published there too: the product "NVIDIA H100 80GB HBM3", 81559 MiB (the
  H100 recording's total) and the bus ids of GPU 0 (18:00.0) and GPU 1 (2A:00.0).
- `pcie-nvlink-bridge-topo-trace.json`: 8 H100 NVL in a two-socket PCIe server, joined in pairs
  (0-1, 2-3, 4-5, 6-7) by NVLink bridges (NV12), NODE within a socket and SYS across, from the
  `check_environment.py` output in https://github.com/willxxy/sglang-play (README.md): CPU
  affinity 0-63,128-191 (NUMA node 0) and 64-127,192-255 (node 1).
- `workstation-4gpu-topo-trace.json`: 4 A100 PCIe with one NVLink bridge (GPU 0-1 NV12), GPU 2-3
  NODE and SYS across sockets, from https://github.com/NVIDIA/k8s-device-plugin/issues/436 (CPU
  affinity 0-27,56-83 on node 0, 28-55,84-111 on node 1). The issue's text says GPUs 2-3 are
  bridged too; its matrix, which this trace follows, shows NODE. The nearest published 4-GPU
  machine with a bridged pair found; it has two sockets, which a workstation may not.

Chosen, not published (plausible values, said here so no one takes them for measured):
- every PCI bus id but GPU 0 and 1 of the HGX board; the NVSwitches' bus ids (00000000:05:00.0
  .. 08:00.0, each GPU's 18 links split 4/5/5/4 over them, links 0-3, 4-8, 9-13, 14-17, as
  NCCL's topology dump of an 8x H100 board in https://github.com/aliyun/SimAI/issues/128
  lists them);
- the PCIe root of every GPU (`pcie_root`): one root complex per GPU, the root bus just below
  the GPU's bus (no two GPUs share a root: the matrices show no PIX or PXB between GPUs);
- the PCIe common ancestor of pairs the matrix draws as NV<n> (it hides it): NODE on one NUMA
  node, SYS across;
- P2P read status: OK (0) between GPUs of one NUMA node, NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
  (1) across on the two PCIe machines, OK everywhere on the HGX board;
- the H100 NVL's total memory (95830 MiB, as nvidia-smi shows that product), the A100 80GB
  PCIe's (81920 MiB), their power limits (400 W, 300 W; the recording's power and energy are
  scaled by the limits' ratio to the H100's 700 W); no `fabric` (the HGX board's NVML
  fabric info is left out: single-node boards need none).

Samples: six of the H100 recording's, at its times (t = 0, 5.316 and 8.413: idle, then 30 GiB
allocated; 14.167: mid bf16 matmul; 17.669: small load; 22.922: released), every GPU idle as the
recording's first sample except:
- the recorded load (30 GiB allocated, then the bf16 matmul, then released) runs on
  `Board.recorded_gpu`: GPU 2 (HGX), GPU 1 (bridge server), GPU 3 (workstation);
- from t = 14.167 on a neighbour's job holds `Board.neighbour_gib` on `Board.neighbour_gpu`
  with one compute process (pid 424242) and the recording's busy reading of t = 14.167
  (utilisation 100 %, 698 W): 40 GiB on GPU 5 (HGX), 60 GiB on GPU 6 (bridge server), 50 GiB on GPU 0
  (workstation); so live free memory differs between GPUs in the later samples.

Static facts, timings, temperatures, power and driver come from `h100-trace.json` (one H100 80GB
HBM3, driver 580.159.04). Deterministic: the same input gives byte-identical output, and
tests/sources/test_topology_traces.py checks the files are current.
"""

from __future__ import annotations

import copy
import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
MIB = 1 << 20
GIB = 1 << 30
NEIGHBOUR_PID = 424242
#: a trace takes the recording's first sample at or after each of these times (seconds)
PICK_AT_S = (0.0, 5.207, 8.207, 14.0, 17.643, 22.689)
#: the neighbour's job runs from this time on, with the recording's reading of that time
BUSY_FROM_S = 14.0
#: `nvidia-smi topo -m` names -> NVML_TOPOLOGY_* levels
LEVELS = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
P2P_OK = 0
P2P_CHIPSET_NOT_SUPPORTED = 1
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_SWITCH = 2


@dataclass(frozen=True)
class Board:
    """One published node: its matrix (the source) and what was chosen around it."""

    file: str
    source: str
    matrix: str
    product: str
    memory_total_bytes: int
    architecture: int  # NVML_DEVICE_ARCH_*
    compute_capability: tuple[int, int]
    power_limit_mw: int
    pcie_gen: int
    bus_ids: tuple[str, ...]  # NVML busId form
    pcie_roots: tuple[str, ...]
    p2p_across_sockets: int
    recorded_gpu: int
    neighbour_gpu: int
    neighbour_gib: int
    #: NVSwitch bus ids and how many of each GPU's links go to each (NVSwitch boards only)
    switches: tuple[tuple[str, int], ...] = ()


HGX_H100 = Board(
    file="hgx-h100-topo-trace.json",
    source="https://github.com/NVIDIA/nccl/issues/1264",
    matrix="""
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    NIC0    NIC1    NIC2    NIC3    NIC4    NIC5    NIC6    NIC7    NIC8    NIC9    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV18    NV18    NV18    NV18    NV18    NV18    NV18    PIX     SYS     SYS     SYS     SYS     SYS     SYS     SYS     SYS     SYS     0-55,112-167    0               N/A
GPU1    NV18     X      NV18    NV18    NV18    NV18    NV18    NV18    SYS     PIX     SYS     SYS     SYS     SYS     SYS     SYS     SYS     SYS     0-55,112-167    0               N/A
GPU2    NV18    NV18     X      NV18    NV18    NV18    NV18    NV18    SYS     SYS     PIX     SYS     SYS     SYS     SYS     SYS     SYS     SYS     0-55,112-167    0               N/A
GPU3    NV18    NV18    NV18     X      NV18    NV18    NV18    NV18    SYS     SYS     SYS     SYS     SYS     PIX     SYS     SYS     SYS     SYS     0-55,112-167    0               N/A
GPU4    NV18    NV18    NV18    NV18     X      NV18    NV18    NV18    SYS     SYS     SYS     SYS     SYS     SYS     PIX     SYS     SYS     SYS     56-111,168-223  1               N/A
GPU5    NV18    NV18    NV18    NV18    NV18     X      NV18    NV18    SYS     SYS     SYS     SYS     SYS     SYS     SYS     PIX     SYS     SYS     56-111,168-223  1               N/A
GPU6    NV18    NV18    NV18    NV18    NV18    NV18     X      NV18    SYS     SYS     SYS     SYS     SYS     SYS     SYS     SYS     PIX     SYS     56-111,168-223  1               N/A
GPU7    NV18    NV18    NV18    NV18    NV18    NV18    NV18     X      SYS     SYS     SYS     SYS     SYS     SYS     SYS     SYS     SYS     PIX     56-111,168-223  1               N/A
""",
    product="NVIDIA H100 80GB HBM3",
    memory_total_bytes=85520809984,  # 81559 MiB, as published and as the recording's
    architecture=9,
    compute_capability=(9, 0),
    power_limit_mw=700000,
    pcie_gen=5,
    bus_ids=tuple(f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")),
    pcie_roots=tuple(f"pci0000:{r}" for r in ("15", "26", "37", "59", "97", "a7", "b7", "d7")),
    p2p_across_sockets=P2P_OK,
    recorded_gpu=2,
    neighbour_gpu=5,
    neighbour_gib=40,
    switches=(
        ("00000000:05:00.0", 4),
        ("00000000:06:00.0", 5),
        ("00000000:07:00.0", 5),
        ("00000000:08:00.0", 4),
    ),
)

PCIE_NVLINK_BRIDGE = Board(
    file="pcie-nvlink-bridge-topo-trace.json",
    source="https://github.com/willxxy/sglang-play (README.md, check_environment.py output)",
    matrix="""
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    NIC0    NIC1    CPU Affinity     NUMA Affinity   GPU NUMA ID
GPU0     X      NV12    NODE    NODE    SYS     SYS     SYS     SYS     NODE    NODE    0-63,128-191     0               N/A
GPU1    NV12     X      NODE    NODE    SYS     SYS     SYS     SYS     PHB     PHB     0-63,128-191     0               N/A
GPU2    NODE    NODE     X      NV12    SYS     SYS     SYS     SYS     NODE    NODE    0-63,128-191     0               N/A
GPU3    NODE    NODE    NV12     X      SYS     SYS     SYS     SYS     NODE    NODE    0-63,128-191     0               N/A
GPU4    SYS     SYS     SYS     SYS      X      NV12    NODE    NODE    SYS     SYS     64-127,192-255   1               N/A
GPU5    SYS     SYS     SYS     SYS     NV12     X      NODE    NODE    SYS     SYS     64-127,192-255   1               N/A
GPU6    SYS     SYS     SYS     SYS     NODE    NODE     X      NV12    SYS     SYS     64-127,192-255   1               N/A
GPU7    SYS     SYS     SYS     SYS     NODE    NODE    NV12     X      SYS     SYS     64-127,192-255   1               N/A
""",
    product="NVIDIA H100 NVL",
    memory_total_bytes=95830 * MIB,
    architecture=9,
    compute_capability=(9, 0),
    power_limit_mw=400000,
    pcie_gen=5,
    bus_ids=tuple(f"00000000:{b}:00.0" for b in ("01", "21", "41", "61", "81", "A1", "C1", "E1")),
    pcie_roots=tuple(f"pci0000:{r}" for r in ("00", "20", "40", "60", "80", "a0", "c0", "e0")),
    p2p_across_sockets=P2P_CHIPSET_NOT_SUPPORTED,
    recorded_gpu=1,
    neighbour_gpu=6,
    neighbour_gib=60,
)

WORKSTATION_4GPU = Board(
    file="workstation-4gpu-topo-trace.json",
    source="https://github.com/NVIDIA/k8s-device-plugin/issues/436",
    matrix="""
        GPU0    GPU1    GPU2    GPU3    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity
GPU0     X      NV12    SYS     SYS     NODE    NODE    0-27,56-83      0
GPU1    NV12     X      SYS     SYS     NODE    NODE    0-27,56-83      0
GPU2    SYS     SYS      X      NODE    SYS     SYS     28-55,84-111    1
GPU3    SYS     SYS     NODE     X      SYS     SYS     28-55,84-111    1
""",
    product="NVIDIA A100 80GB PCIe",
    memory_total_bytes=81920 * MIB,
    architecture=7,
    compute_capability=(8, 0),
    power_limit_mw=300000,
    pcie_gen=4,
    bus_ids=tuple(f"00000000:{b}:00.0" for b in ("17", "31", "B1", "CA")),
    pcie_roots=tuple(f"pci0000:{r}" for r in ("16", "30", "b0", "c9")),
    p2p_across_sockets=P2P_CHIPSET_NOT_SUPPORTED,
    recorded_gpu=3,
    neighbour_gpu=0,
    neighbour_gib=50,
)

BOARDS = (HGX_H100, PCIE_NVLINK_BRIDGE, WORKSTATION_4GPU)


@dataclass(frozen=True)
class Published:
    """What a matrix states: per GPU its row of pair names (``X`` on the diagonal), CPU
    affinity (Linux ranges) and NUMA node."""

    names: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str, ...]
    numa_node: tuple[int, ...]


def parse_matrix(text: str) -> Published:
    """The GPU rows of an `nvidia-smi topo -m` matrix: GPU-to-GPU names, CPU and NUMA affinity."""
    lines = [line for line in text.strip("\n").splitlines() if line.strip()]
    header = lines[0].split()
    columns = header[: header.index("CPU")]
    gpus = [c for c in columns if c.startswith("GPU")]
    names, cpus, numa = [], [], []
    for line in lines[1:]:
        cells = line.split()
        if not cells[0].startswith("GPU"):
            continue
        row = cells[1 : 1 + len(columns)]
        names.append(tuple(row[: len(gpus)]))
        cpus.append(cells[1 + len(columns)])
        numa.append(int(cells[2 + len(columns)]))
    return Published(tuple(names), tuple(cpus), tuple(numa))


def cpu_words(ranges: str) -> list[int]:
    """Linux CPU ranges (``"0-55,112-167"``) as nvmlDeviceGetCpuAffinity's 64-bit words."""
    cpus: set[int] = set()
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    words = [0] * (max(cpus) // 64 + 1)
    for cpu in cpus:
        words[cpu // 64] |= 1 << (cpu % 64)
    return words


def _links(board: Board, pub: Published, i: int) -> list[dict]:
    """GPU ``i``'s NVLinks: to the NVSwitches on a switch board, else to each bridged peer."""
    out: list[dict] = []
    if board.switches:
        for bus, count in board.switches:
            for _ in range(count):
                out.append(
                    {
                        "link": len(out),
                        "state": 1,
                        "remote_pci_bus_id": bus,
                        "remote_device_type": NVLINK_REMOTE_SWITCH,
                    }  # fmt: skip
                )
        return out
    for j, name in enumerate(pub.names[i]):
        if name.startswith("NV"):
            for _ in range(int(name[2:])):
                out.append(
                    {
                        "link": len(out),
                        "state": 1,
                        "remote_pci_bus_id": board.bus_ids[j],
                        "remote_device_type": NVLINK_REMOTE_GPU,
                    }  # fmt: skip
                )
    return out


def _device(src_device: dict, board: Board, pub: Published, i: int) -> dict:
    same = board.product == src_device["name"]
    device = copy.deepcopy(src_device) if same else {
        k: src_device[k] for k in ("brand", "persistence_mode", "ecc_mode", "compute_mode")
    }  # fmt: skip
    device.update(
        index=i,
        name=board.product,
        uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{board.file}/{i}")),
        pci_bus_id=board.bus_ids[i],
        architecture=board.architecture,
        cuda_compute_capability=list(board.compute_capability),
        mig_mode=[0, 0],
        power_limit_mw=board.power_limit_mw,
        max_pcie_link_gen=board.pcie_gen,
        max_pcie_link_width=16,
    )
    if same:
        device["serial"] = str(int(src_device["serial"]) + i)
    else:
        device.pop("serial", None)
    n = len(pub.names)
    topology, p2p = {}, {}
    for j in range(n):
        if j == i:
            continue
        name = pub.names[i][j]
        one_node = pub.numa_node[i] == pub.numa_node[j]
        level = LEVELS.get(name, LEVELS["NODE"] if one_node else LEVELS["SYS"])
        topology[str(j)] = level
        p2p[str(j)] = P2P_OK if one_node else board.p2p_across_sockets
    device.update(
        topology=topology,
        numa_node=pub.numa_node[i],
        cpu_affinity=cpu_words(pub.cpu_affinity[i]),
        pcie_root=board.pcie_roots[i],
        nvlinks=_links(board, pub, i),
        p2p_read=p2p,
    )
    return device


def _memory(reading: dict, total: int, extra_bytes: int = 0) -> None:
    """Rescale a reading's memory to ``total`` bytes, ``extra_bytes`` more in use."""
    mem = reading["memory_bytes"]
    used = mem["used"] + extra_bytes
    reading["memory_bytes"] = {"total": total, "used": used, "free": total - used}
    v2 = reading.get("memory_v2_bytes")
    if isinstance(v2, dict) and "nvml_error" not in v2:
        v2_used = v2["used"] + extra_bytes
        v2.update(total=total, used=v2_used, free=total - v2["reserved"] - v2_used)


def _power(reading: dict, scale: float) -> None:
    """Scale a reading's power and energy to another product's power limit."""
    for key in ("power_mw", "total_energy_mj"):
        if isinstance(reading.get(key), int) and scale != 1.0:
            reading[key] = round(reading[key] * scale)


def _samples(src: dict, board: Board) -> list[dict]:
    recorded = src["samples"]
    idle = recorded[0]["gpus"][0]
    busy = next(s for s in recorded if s["t"] >= BUSY_FROM_S)["gpus"][0]
    picked = [next(s for s in recorded if s["t"] >= start) for start in PICK_AT_S]
    out = []
    for s in picked:
        gpus = []
        for i in range(len(board.bus_ids)):
            if i == board.recorded_gpu:
                reading = copy.deepcopy(s["gpus"][0])
                _memory(reading, board.memory_total_bytes)
            elif i == board.neighbour_gpu and s["t"] >= BUSY_FROM_S:
                reading = copy.deepcopy(busy)
                load = board.neighbour_gib * GIB
                reading["memory_bytes"] = copy.deepcopy(idle["memory_bytes"])
                reading["memory_v2_bytes"] = copy.deepcopy(idle["memory_v2_bytes"])
                _memory(reading, board.memory_total_bytes, load)
                reading["compute_processes"] = [{"pid": NEIGHBOUR_PID, "usedGpuMemory": load}]
            else:
                reading = copy.deepcopy(idle)
                _memory(reading, board.memory_total_bytes)
            _power(reading, board.power_limit_mw / src["devices"][0]["power_limit_mw"])
            reading["index"] = i
            gpus.append(reading)
        out.append({"t": s["t"], "gpus": gpus})
    return out


def make(src: dict, board: Board) -> dict:
    """The version 3 trace of ``board`` (see the module docstring)."""
    pub = parse_matrix(board.matrix)
    devices = [_device(src["devices"][0], board, pub, i) for i in range(len(pub.names))]
    return {
        "format_version": 3,
        "source": f"derived from h100-trace.json and the nvidia-smi topo -m of {board.source}",
        "driver_version": src["driver_version"],
        "nvml_version": src["nvml_version"],
        "cuda_driver_version": src["cuda_driver_version"],
        "device_count": len(devices),
        "devices": devices,
        "interval_s": src["interval_s"],
        "phases": src["phases"],
        "samples": _samples(src, board),
    }


def render_all() -> dict[str, str]:
    """file name -> the JSON text it must hold."""
    src = json.loads((HERE / "h100-trace.json").read_text())
    return {b.file: json.dumps(make(src, b), indent=1) + "\n" for b in BOARDS}


def write_all(out_dir: Path) -> list[Path]:
    """Write every trace into ``out_dir``; the paths written."""
    paths = []
    for name, text in render_all().items():
        path = out_dir / name
        path.write_text(text)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for path in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
