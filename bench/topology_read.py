"""What reading the GPUs' topology costs, once per ``nvmlInit`` (issue 50, item 1).

``omaticaya_py.sources.nvml.topology.read_topology`` asks, per GPU, its NUMA node, CPU affinity,
fabric and each of the ``NVML_NVLINK_MAX_LINKS`` (36) NVLinks (the far end of every active one),
and per pair the PCIe common ancestor and the P2P read status; the reader does it once per
``nvmlInit`` (``NvmlReader._init``), never per tick. This runs it ``--repeat`` times over GPUs
attached as the reader attaches them (``sources.nvml.device.attach``), each time with fresh
counters, and prints per trace the NVML calls of one read, its wall time (median) and the time
inside NVML, then each call's count and µs per call (``Calls.by_call``).

By default it runs itself again, once per trace, on the NVML test library (tests/nvml) serving
each topology trace of tests/data (``*-topo-trace.json``, or ``--trace``), with a fake sysfs
tree of the trace's PCIe roots and NUMA nodes (``tests.nvmltestlib.fake_sysfs``); ``--nvml``
measures the ``libnvidia-ml.so.1`` this process loads (a GPU node, with ``/sys``). No timing
is asserted: the figures are for docs/benchmarks.md.

    .venv/bin/python bench/topology_read.py              # the NVML test library, 3 traces
    .venv/bin/python bench/topology_read.py --quick      # few repeats (CI smoke)
    .venv/bin/python bench/topology_read.py --nvml       # on a GPU node
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, emit, header, median, table  # noqa: E402

TRACES = sorted((ROOT / "tests" / "data").glob("*-topo-trace.json"))


def measure(repeat: int, sysfs_root: Path) -> dict[str, Any]:
    """One topology read ``repeat`` times over this process's NVML: ``{"gpus", "wall_ms"
    (per read), "by_call": {name: [calls, seconds]} (one read), "matrix"}``, or ``{"error"}``."""
    import pynvml

    from omaticaya_py.sources.nvml.device import Device, attach
    from omaticaya_py.sources.nvml.library import Calls
    from omaticaya_py.sources.nvml.topology import read_topology

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"error": f"NVML not available: {type(exc).__name__}"}
    try:
        setup = Calls()
        devices = [Device(i, None, {}) for i in range(pynvml.nvmlDeviceGetCount())]
        for device in devices:
            attach(setup, device)
        wall: list[float] = []
        by_call: dict[str, list[float]] = {}
        topology = None
        for _ in range(repeat):
            calls = Calls()
            start = time.perf_counter()
            topology = read_topology(calls, devices, sysfs_root)
            wall.append(time.perf_counter() - start)
            by_call = calls.by_call
        return {
            "gpus": len(devices),
            "wall_ms": [w * 1e3 for w in wall],
            "by_call": by_call,
            "errors": sum(calls.errors.values()),
            "matrix": topology.matrix() if topology is not None else [],
        }
    finally:
        pynvml.nvmlShutdown()


def report(name: str, result: dict[str, Any]) -> str:
    """The tables of one trace's measurement."""
    by_call = result["by_call"]
    calls = int(sum(n for n, _ in by_call.values()))
    inside_ms = sum(s for _, s in by_call.values()) * 1e3
    wall = result["wall_ms"]
    head = table(
        ["trace", "GPUs", "NVML calls", "reads", "wall ms (median)", "wall ms (max)",
         "inside NVML ms", "µs/call", "errors"],
        [[name, result["gpus"], calls, len(wall), median(wall), max(wall), inside_ms,
          inside_ms * 1e3 / calls if calls else "-", result["errors"]]],
    )  # fmt: skip
    rows = sorted(
        ([call, int(n), s * 1e3, s * 1e6 / n if n else "-"] for call, (n, s) in by_call.items()),
        key=lambda r: -r[2],
    )
    per = table(["NVML call", "calls", "ms", "µs/call"], rows)
    matrix = "\n".join("  ".join(f"{c:>4}" for c in row) for row in result["matrix"])
    return f"{head}\n\n{per}\n\nas read (nvidia-smi topo -m):\n{matrix}"


def run_testlib(traces: list[Path], repeat: int) -> int:
    """Each trace in a child process on the NVML test library; the tables."""
    from tests.nvmltestlib import fake_sysfs, testlib_env

    parts = [header("topology read, once per nvmlInit: the NVML test library")]
    for trace in traces:
        with tempfile.TemporaryDirectory(prefix="topo-sysfs-") as tmp:
            sysfs = fake_sysfs(Path(tmp), trace)
            cmd = [
                sys.executable,
                __file__,
                "--child",
                "--repeat",
                str(repeat),
                "--sysfs",
                str(sysfs),
            ]
            done = subprocess.run(
                cmd, env=testlib_env(trace), capture_output=True, text=True, check=False
            )
        if done.returncode != 0:
            print(f"bench/topology_read.py: {trace.name}: {done.stderr.strip()}", file=sys.stderr)
            return 1
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if "error" in result:
            print(f"bench/topology_read.py: {trace.name}: {result['error']}", file=sys.stderr)
            return 1
        parts.append(report(trace.name, result))
    emit(*parts)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvml", action="store_true", help="measure this machine's NVML (a GPU node)")
    ap.add_argument(
        "--trace",
        type=Path,
        action="append",
        help="a trace (repeatable); default: the topology traces",
    )
    ap.add_argument("--repeat", type=int, default=50, help="topology reads per trace")
    ap.add_argument("--quick", action="store_true", help="3 reads per trace (CI smoke)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sysfs", type=Path, default=Path("/sys"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    repeat = 3 if args.quick else max(1, args.repeat)
    if args.child:
        print(json.dumps(measure(repeat, args.sysfs)))
        return 0
    if args.nvml:
        result = measure(repeat, Path("/sys"))
        if "error" in result:
            print(f"bench/topology_read.py: {result['error']}", file=sys.stderr)
            return 1
        emit(
            header("topology read, once per nvmlInit: this machine's NVML"),
            report("(real GPUs)", result),
        )
        return 0
    traces = args.trace or TRACES
    if not traces:
        print("bench/topology_read.py: no *-topo-trace.json in tests/data", file=sys.stderr)
        return 1
    return run_testlib(traces, repeat)


if __name__ == "__main__":
    sys.exit(main())
