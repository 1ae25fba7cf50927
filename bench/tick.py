"""CPU time of one ``Agent.tick()`` without the API server, for 1, 8 and 64 GPUs.

The tick runs the production path (read -> assess -> render -> diff -> "send") against an
in-memory Node (``MemoryNode``: applies the merge patch, no HTTP), so the telemetry heartbeat
and the "no request when nothing changed" logic behave as in the daemon. Traces are the
recorded H100 replicated to N GPUs (own index and uuid each), read through ``TraceReader``
with a fake clock that advances one schedule interval per tick (so utilisation is averaged
over the interval's samples, as in the daemon):

- nothing changed: the trace's idle phase, looping; no label moves, no patch.
- everything changed: ticks alternate between the idle phase (t=2 s) and the 30 GiB busy
  phase (t=15 s): every dynamic label (free memory, utilisation, temperature, idle count, per
  GPU) changes and a patch is built and applied every tick.
- floor: ``render`` + ``diff`` alone on a fixed reading (no read, no assess), and a minimal
  hand-written render + diff of the same per-GPU labels in plain Python.

``--nvml``: the same on real NVML (whatever GPUs are present, as they are), with the share of
the tick spent inside NVML calls (``NvmlReader.call_s``). Exits with status 1 and one line
when NVML is not available here.

    .venv/bin/python bench/tick.py            # ~20 s
    .venv/bin/python bench/tick.py --quick    # ~2 s
    .venv/bin/python bench/tick.py --nvml     # on a GPU node
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    FakeClock,
    bench_settings,
    emit,
    header,
    load_raw,
    median,
    pct,
    phase_samples,
    replicate,
    table,
    write_trace,
)
from omaticaya_py.core.publish.patch import MergePatch, NodeMeta, apply_patch  # noqa: E402

TARGET_8_GPU_MS = 0.2
TARGET_8_GPU_NVML_MS = 0.5


class MemoryNode:
    """A ``NodeClient`` stand-in with no HTTP: GET returns the stored metadata, PATCH applies
    the merge patch to it (what the API server would store)."""

    def __init__(self, name: str) -> None:
        self.meta = NodeMeta(name=name, uid="bench-uid")
        self.patches = 0

    def get_node(self) -> NodeMeta:
        return self.meta

    def patch_node(self, patch: MergePatch) -> NodeMeta:
        self.patches += 1
        self.meta = apply_patch(self.meta, patch)
        return self.meta

    def create_node_event(self, **_: Any) -> None:
        pass

    def close(self) -> None:
        pass


def measure(fn: Callable[[], Any], iterations: int, budget_s: float, warmup: int) -> list[float]:
    """CPU seconds of each call of ``fn`` (``time.process_time``), after ``warmup`` calls;
    at most ``iterations`` calls or ``budget_s`` of wall time. GC is collected before and
    disabled during the loop so that one run does not pay for another's garbage."""
    for _ in range(warmup):
        fn()
    gc.collect()
    gc.disable()
    out: list[float] = []
    cpu = time.process_time
    deadline = time.perf_counter() + budget_s
    try:
        while len(out) < iterations and time.perf_counter() < deadline:
            t0 = cpu()
            fn()
            out.append(cpu() - t0)
    finally:
        gc.enable()
    return out


def replay_agent(n_gpus: int, mode: str, interval_s: float = 10.0) -> tuple[Any, Callable[[], Any]]:
    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.sources.replay import TraceReader

    raw = load_raw()
    clock = FakeClock()
    settings = bench_settings(node_name="bench-node", schedule=f"@every {interval_s:g}s")
    if mode == "nothing":
        path = write_trace(replicate(phase_samples(raw, "idle"), n_gpus), f"idle-{n_gpus}")
        reader = TraceReader(path, window_s=interval_s, clock=clock)
        steps = [interval_s]
    else:
        path = write_trace(replicate(raw, n_gpus), f"full-{n_gpus}")
        reader = TraceReader(path, window_s=interval_s, clock=clock)
        # trace time 0 (idle) <-> 15 (30 GiB allocated, 100 % busy), looping
        steps = [15.0, reader.period_s - 15.0]
    node = MemoryNode("bench-node")
    agent = Agent(settings, reader, NodeApi(node), clock=clock)  # type: ignore[arg-type]
    state = {"i": 0}

    def tick() -> Any:
        result = agent.tick()
        clock.advance(steps[state["i"] % len(steps)])
        state["i"] += 1
        return result

    return (agent, node), tick


def floor_fns(n_gpus: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(project render + diff on a fixed reading, minimal plain-Python render + diff)."""
    from omaticaya_py.core.publish.patch import diff
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.rules.health import assess
    from omaticaya_py.sources.replay import TraceReader

    path = write_trace(replicate(phase_samples(load_raw(), "idle"), n_gpus), f"idle-{n_gpus}")
    snap = TraceReader(path, at_s=1.0).read()
    health = assess(snap)
    s = bench_settings(node_name="bench-node")
    desired = render(snap, health, s)
    current = NodeMeta(name="n", labels=dict(desired.labels), annotations=dict(desired.annotations))
    previous = desired.labels
    tkey = f"{s.prefix}/telemetry"

    def project() -> Any:
        d = render(snap, health, s, previous)
        return diff(d.labels, d.annotations, current, s.prefix, volatile=(tkey,))

    gpus = snap.gpus
    p = s.prefix
    cur = dict(current.labels)

    def plain() -> Any:
        out = {f"{p}/gpu.count": str(len(gpus))}
        free_max = 0
        for g in gpus:
            n = f"{p}/gpu-{g.index}"
            free = g.memory_free_mib // 1024 * 1024
            free_max = max(free_max, free)
            out[n + ".memory.free-mib"] = str(free)
            out[n + ".utilization-pct"] = str(int(g.utilization_pct + 5) // 10 * 10)
            out[n + ".temperature-c"] = str(int(g.temperature_c + 2.5) // 5 * 5)
            out[n + ".health"] = "Healthy"
        out[f"{p}/gpu.memory.free-mib"] = str(free_max)
        return {k: v for k, v in out.items() if cur.get(k) != v} or None

    return project, plain


def run_replay(gpu_counts: list[int], iterations: int, budget_s: float, warmup: int) -> str:
    rows = []
    results: dict[tuple[int, str], float] = {}
    for n in gpu_counts:
        for mode in ("nothing", "everything"):
            (agent, node), tick = replay_agent(n, mode)
            before = node.patches
            samples = measure(tick, iterations, budget_s, warmup)
            patches = node.patches - before - 0
            med, p90 = median(samples) * 1e3, pct(samples, 90) * 1e3
            results[(n, mode)] = med
            rows.append(
                [n, f"{mode} changed", len(samples), f"{patches}/{len(samples) + warmup}",
                 med, p90, med * 1e3 / n]
            )
        project, plain = floor_fns(n)
        for label, fn in (("floor: render+diff", project), ("floor: plain Python", plain)):
            samples = measure(fn, iterations, budget_s, warmup)
            med, p90 = median(samples) * 1e3, pct(samples, 90) * 1e3
            rows.append([n, label, len(samples), "-", med, p90, med * 1e3 / n])
    out = table(
        ["GPUs", "case", "ticks", "patches", "median ms", "p90 ms", "µs/GPU"], rows
    )
    got = results.get((8, "nothing"))
    if got is not None:
        verdict = (
            "met" if got <= TARGET_8_GPU_MS
            else f"missed: {got / TARGET_8_GPU_MS:.2f}x the target (+{got - TARGET_8_GPU_MS:.3f} ms)"
        )
        out += (
            f"\n\ntarget: 8 GPUs, nothing changed, replay: <= {TARGET_8_GPU_MS} ms CPU per tick"
            f" -> {got:.3f} ms: {verdict}"
        )
    return out


def nvml_library() -> str:
    """The ``libnvidia-ml.so.1`` this process loaded (from /proc/self/maps): the driver's, or
    the NVML test library's (tests/nvml) when LD_LIBRARY_PATH points at it."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                if "libnvidia-ml" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return "unknown"


def call_shares(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]],
                ticks: int, gpus: int, nvml_s: float) -> str:  # fmt: skip
    """The table of each NVML call over ``ticks`` ticks of ``gpus`` GPUs, costliest first:
    calls per tick, ms per tick, µs per call, ms per GPU per tick, and its share of the time
    inside NVML (``nvml_s``) - ``after`` less ``before`` (``NvmlReader.calls_by_name``)."""
    rows = []
    for name, (n, spent_s) in after.items():
        n0, s0 = before.get(name, (0, 0.0))
        calls, spent = n - n0, spent_s - s0
        if calls <= 0:
            continue
        per_tick_ms = spent / max(ticks, 1) * 1e3
        rows.append([name, calls / max(ticks, 1), per_tick_ms, spent / calls * 1e6,
                     per_tick_ms / max(gpus, 1), f"{spent / nvml_s:.0%}" if nvml_s else "-"])  # fmt: skip
    rows.sort(key=lambda r: -r[2])
    return table(["NVML call", "calls/tick", "ms/tick", "µs/call", "ms/GPU/tick", "share of NVML"],
                 rows)  # fmt: skip


def run_nvml(iterations: int, budget_s: float, warmup: int) -> tuple[str, int]:
    try:
        from omaticaya_py.sources.nvml import NvmlReader, nvml_available
    except Exception as exc:  # noqa: BLE001 - pynvml missing or broken
        return f"NVML not available: cannot import the NVML reader ({exc})", 1
    if not nvml_available():
        return "NVML not available on this machine (no NVIDIA driver/GPU): nothing measured", 1
    from omaticaya_py.agent import Agent, NodeApi

    reader = NvmlReader(watch_xid=False)
    first = reader.read()
    if first.error is not None:
        return f"NVML not available: {first.error}", 1
    n = len(first.gpus)
    settings = bench_settings(node_name="bench-node")
    node = MemoryNode("bench-node")
    agent = Agent(settings, reader, NodeApi(node))  # type: ignore[arg-type]
    nvml_before, samples = reader.call_s, []
    cpu_total = [0.0]

    def tick() -> Any:
        return agent.tick()

    for _ in range(warmup):
        tick()
    nvml_before = reader.call_s
    by_call_before = reader.calls_by_name()
    wall: list[float] = []
    gc.collect()
    deadline = time.perf_counter() + budget_s
    while len(samples) < iterations and time.perf_counter() < deadline:
        c0, w0 = time.process_time(), time.perf_counter()
        tick()
        samples.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        cpu_total[0] += samples[-1]
    nvml_s = reader.call_s - nvml_before
    share = nvml_s / sum(wall) if wall else float("nan")
    per_call = call_shares(by_call_before, reader.calls_by_name(), len(wall), n, nvml_s)
    reader.close()
    med, p90 = median(samples) * 1e3, pct(samples, 90) * 1e3
    wmed = median(wall) * 1e3
    library = nvml_library()
    case = "NVML test library" if "nvml-testlib" in library else "as is (real GPUs)"
    rows = [[n, case, len(samples), node.patches, med, p90, wmed,
             nvml_s / max(len(wall), 1) * 1e3, f"{share:.0%}", med * 1e3 / max(n, 1)]]
    out = table(
        ["GPUs", "case", "ticks", "patches", "CPU median ms", "CPU p90 ms", "wall median ms",
         "NVML ms/tick", "NVML share", "µs/GPU"],
        rows,
    )
    verdict = "\n\neach NVML call of the measured ticks, costliest first:\n" + per_call
    verdict += f"\n\nlibnvidia-ml.so.1: {library}"
    if n == 8:
        verdict += (
            f"\ntarget: 8 GPUs on NVML <= {TARGET_8_GPU_NVML_MS} ms -> {wmed:.3f} ms: "
            + ("met" if wmed <= TARGET_8_GPU_NVML_MS else f"missed: {wmed / 0.5:.2f}x the target")
        )
    return out + verdict, 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few iterations (CI smoke)")
    ap.add_argument("--nvml", action="store_true", help="measure on real NVML")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--iterations", type=int, default=2000, help="ticks per case at most")
    ap.add_argument("--budget-s", type=float, default=3.0, help="wall seconds per case at most")
    args = ap.parse_args(argv)
    if args.quick:
        args.iterations, args.budget_s = 40, 0.3
    warmup = 5 if args.quick else 50
    from loguru import logger

    logger.remove()  # the bench measures the tick, not the log sink
    if args.nvml:
        out, rc = run_nvml(args.iterations, args.budget_s, warmup)
        if rc:
            print(f"bench/tick.py --nvml: {out}", file=sys.stderr)
            return rc
        emit(header("tick CPU time on real NVML (dry run, in-memory Node)"), out)
        return 0
    emit(
        header("tick CPU time on replay (in-memory Node, fake clock, 10 s interval)"),
        run_replay(args.gpus, args.iterations, args.budget_s, warmup),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
