"""What following the MIG mode at runtime costs a tick (issue 48, item 4).

The reader asks every GPU's MIG mode on every read (``nvmlDeviceGetMigMode``,
``sources/nvml/mig.py`` ``follow_mode``), so that a mode turned on or off at runtime is
published at the next tick. This times ``Agent.tick()`` (dry run, in-memory Node, as
``bench/tick.py --nvml``) over ``NvmlReader`` both ways in one process, in alternating blocks
of ticks so that both see the same machine: **after** (the reader as it is) and **before**
(``follow_mode`` replaced by a no-op: the mode read once per ``nvmlInit``, the reader as it was
at 7078aa3). It prints CPU and wall time per tick side by side, the ratio after / before, and
``nvmlDeviceGetMigMode``'s calls and µs per call (``NvmlReader.calls_by_name``).

It runs on the ``libnvidia-ml.so.1`` this process loads: the driver's on a GPU node, as is
(never changing a GPU's MIG mode); ``--testlib`` runs itself again on the NVML test library
(tests/nvml) serving ``--trace`` (default ``tests/data/multi-gpu-trace.json``, 8 GPUs).

    .venv/bin/python bench/mig_mode.py --testlib          # no GPU: the NVML test library
    .venv/bin/python bench/mig_mode.py                    # on a GPU node
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_settings, emit, header, median, pct, table  # noqa: E402
from bench.tick import MemoryNode, nvml_library  # noqa: E402

MULTI_TRACE = ROOT / "tests" / "data" / "multi-gpu-trace.json"
CALL = "nvmlDeviceGetMigMode"


def measure(blocks: int, per_block: int, warmup: int) -> tuple[str, int]:
    """The table: ``blocks`` alternating blocks of ``per_block`` ticks each way."""
    try:
        import omaticaya_py.sources.nvml.gpu as gpu_module
        from omaticaya_py.sources.nvml import NvmlReader, nvml_available
    except Exception as exc:  # noqa: BLE001 - pynvml missing or broken
        return f"NVML not available: cannot import the NVML reader ({exc})", 1
    if not nvml_available():
        return "NVML not available here (no NVIDIA driver/GPU; --testlib: the test library)", 1
    from omaticaya_py.agent import Agent, NodeApi

    follow = gpu_module.follow_mode

    def skip(_calls: Any, _device: Any) -> bool:
        return False

    reader = NvmlReader(watch_xid=False)
    first = reader.read()
    if first.error is not None:
        return f"NVML not available: {first.error}", 1
    n = len(first.gpus)
    node = MemoryNode("bench-node")
    agent = Agent(bench_settings(node_name="bench-node"), reader, NodeApi(node))  # type: ignore[arg-type]
    cases: dict[str, dict[str, Any]] = {
        name: {"cpu": [], "wall": [], "nvml_s": 0.0, "calls": 0, "call_s": 0.0}
        for name in ("before", "after")
    }
    for _ in range(warmup):
        agent.tick()
    gc.collect()
    for block in range(2 * blocks):
        name = ("before", "after")[block % 2]
        gpu_module.follow_mode = follow if name == "after" else skip  # type: ignore[assignment]
        case = cases[name]
        nvml0, by_call0 = reader.call_s, reader.calls_by_name().get(CALL, (0, 0.0))
        for _ in range(per_block):
            c0, w0 = time.process_time(), time.perf_counter()
            agent.tick()
            case["cpu"].append(time.process_time() - c0)
            case["wall"].append(time.perf_counter() - w0)
        by_call = reader.calls_by_name().get(CALL, (0, 0.0))
        case["nvml_s"] += reader.call_s - nvml0
        case["calls"] += by_call[0] - by_call0[0]
        case["call_s"] += by_call[1] - by_call0[1]
    gpu_module.follow_mode = follow
    reader.close()
    library = nvml_library()
    where = "NVML test library" if "nvml-testlib" in library else "real GPUs, as they are"
    rows, medians = [], {}
    for name in ("before", "after"):
        case = cases[name]
        ticks = len(case["cpu"])
        medians[name] = (median(case["cpu"]) * 1e3, median(case["wall"]) * 1e3)
        rows.append([
            n, name, ticks, medians[name][0], pct(case["cpu"], 90) * 1e3, medians[name][1],
            case["nvml_s"] / ticks * 1e3, case["calls"] / ticks,
            case["call_s"] / case["calls"] * 1e6 if case["calls"] else "-",
        ])  # fmt: skip
    out = table(
        ["GPUs", "case", "ticks", "CPU median ms", "CPU p90 ms", "wall median ms", "NVML ms/tick",
         f"{CALL}/tick", "µs/call"],
        rows,
    )  # fmt: skip
    (cpu_b, wall_b), (cpu_a, wall_a) = medians["before"], medians["after"]
    after = cases["after"]
    added_us = after["call_s"] / len(after["cpu"]) * 1e6  # inside nvmlDeviceGetMigMode a tick
    out += (
        f"\n\nratio after / before: CPU {cpu_a / cpu_b:.3f}x, wall {wall_a / wall_b:.3f}x"
        f" (median per tick: {(cpu_a - cpu_b) * 1e3:+.1f} µs CPU, {n} GPUs, {where})"
        f"\ninside {CALL}: {added_us:.1f} µs a tick, {added_us / (cpu_a * 1e3):.1%} of the"
        f" after tick's median CPU (the cost the medians' noise hides)"
        f"\nlibnvidia-ml.so.1: {library}"
    )
    return out, 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--testlib", action="store_true", help="run on the NVML test library")
    ap.add_argument("--trace", type=Path, default=MULTI_TRACE, help="the trace --testlib serves")
    ap.add_argument("--blocks", type=int, default=20, help="blocks of ticks each way")
    ap.add_argument("--per-block", type=int, default=100, help="ticks per block")
    ap.add_argument("--quick", action="store_true", help="few ticks (CI smoke)")
    args = ap.parse_args(argv)
    if args.quick:
        args.blocks, args.per_block = 2, 10
    if args.testlib:
        from tests.nvmltestlib import testlib_env

        cmd = [sys.executable, __file__, "--blocks", str(args.blocks),
               "--per-block", str(args.per_block)] + (["--quick"] if args.quick else [])  # fmt: skip
        return subprocess.run(cmd, env=testlib_env(args.trace), check=False).returncode
    from loguru import logger

    logger.remove()  # the bench measures the tick, not the log sink
    out, rc = measure(args.blocks, args.per_block, warmup=2 if args.quick else 50)
    if rc:
        print(f"bench/mig_mode.py: {out}", file=sys.stderr)
        return rc
    emit(header("what following the MIG mode costs a tick (dry run, in-memory Node)"), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
