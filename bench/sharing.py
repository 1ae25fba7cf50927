"""GPU sharing by memory in the device plugin (issue 25, "Measure"): what the kubelet's calls
cost at 8 GPUs x 80 units, and how slices pack by our rule versus a requested-only count.

1. Latency over gRPC (a real unix socket, the generated stubs, as the kubelet calls them) of
   ``GetPreferredAllocation`` (all 640 units available, a slice of 20) and ``Allocate`` (that
   slice), and the size of the ``ListAndWatch`` message of 640 units. The plugins serve the
   8-GPU trace (tests/data/multi-gpu-trace.json, H100 80GB: 81,559 MiB) with every GPU shared in
   1,019 MiB units, which makes 80 units a GPU.
2. Packing: the same 8 GPUs as the trace reads them (memory held out of band on several:
   GPU 1 30 GiB, GPU 3 72 GiB, GPU 5 45 GiB, GPU 7 77 GiB...), 1,024 MiB units (79 a GPU), and a
   seeded mix of 4, 10, 20 and 40 GiB pods arriving at once (a burst: every slice is placed
   before any shows in a reading), placed by
   - ``ours``: the device plugin's rule (``slicer.Slicer``: units available and live free
     memory minus the slices handed out and not yet shown; binpack);
   - ``live, no book``: live free memory and units, forgetting the slices handed out (what a
     rule that reads NVML but keeps no book does within one reading period);
   - ``requested-only``: the units alone, binpack by units left (HAMi, gpushare: the sum of
     what was requested, never the GPU).
   Then every pod uses its slice. A pod *would OOM* when, on its GPU, the live free memory at the
   start less the slices placed there before it cannot hold its slice. GPUs used is compared
   with the ideal: the fewest of these GPUs (most free first, first-fit decreasing) that hold
   the same pods by their live free memory.

Prints tables; asserts nothing. ``--quick`` runs a few calls and one mix (the smoke test).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, bench_settings, emit, header, pct, table

MULTI = ROOT / "tests" / "data" / "multi-gpu-trace.json"
MIX_GIB = (4, 10, 20, 40)
MIX_WEIGHTS = (4, 3, 2, 1)


# -- 1. the kubelet's calls over gRPC --------------------------------------------------------


def latency(calls: int) -> list[list[object]]:
    import grpc

    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.deviceplugin import DevicePluginSet
    from omaticaya_py.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
    from omaticaya_py.sources.replay import TraceReader

    folder = Path(tempfile.mkdtemp(prefix="dp-bench-", dir="/tmp"))
    s = bench_settings(trace=str(MULTI), device_plugin_dir=str(folder), shared_gpus="all",
                       share_unit_mib=1019)
    agent = Agent(s, TraceReader(MULTI, at_s=0.0), NodeApi(None, dry_run=True))
    agent.tick()
    plugins = DevicePluginSet.from_settings(agent, s)
    shared = plugins.shared_plugin
    assert shared is not None
    shared.registration._serve()  # the gRPC server alone: no kubelet to register with here
    channel = grpc.insecure_channel(f"unix://{shared.socket_path}")
    stub = api_pb2_grpc.DevicePluginStub(channel)
    units = [d.id for d in shared.devices()]
    first = next(stub.ListAndWatch(api_pb2.Empty(), timeout=10))
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=units, allocation_size=20)
    ])
    pref_ms, alloc_ms = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        resp = stub.GetPreferredAllocation(request, timeout=10)
        pref_ms.append((time.perf_counter() - t0) * 1000)
        ids = list(resp.container_responses[0].deviceIDs)
        alloc = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=ids)])
        t0 = time.perf_counter()
        stub.Allocate(alloc, timeout=10)  # the same units each time: the book replaces the slice
        alloc_ms.append((time.perf_counter() - t0) * 1000)
    channel.close()
    shared.registration._stop_server(0)
    rows: list[list[object]] = [
        ["GetPreferredAllocation (640 available, 20)", calls, statistics.median(pref_ms),
         pct(pref_ms, 90), pct(pref_ms, 99), max(pref_ms)],
        ["Allocate (20 units)", calls, statistics.median(alloc_ms), pct(alloc_ms, 90),
         pct(alloc_ms, 99), max(alloc_ms)],
    ]
    return rows + [["ListAndWatch message", len(first.devices), first.ByteSize(), "bytes", "", ""]]


# -- 2. packing ------------------------------------------------------------------------------


def gpus_of_trace() -> list[tuple[str, int, int, int]]:
    """(uuid, index, total MiB, live free MiB) of the trace's 8 GPUs at t=0."""
    from omaticaya_py.sources.replay import TraceReader

    snap = TraceReader(MULTI, at_s=0.0).read()
    return [(g.uuid, g.index, g.memory_total_mib, g.memory_free_mib) for g in snap.gpus]


def mix(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choices(MIX_GIB, MIX_WEIGHTS)[0] for _ in range(n)]


def place(pods_gib: list[int], rule: str, unit_mib: int = 1024) -> dict[str, object]:
    from omaticaya_py.core.model.sharing import unit_count, unit_ids
    from omaticaya_py.deviceplugin.allocation import DeviceState
    from omaticaya_py.deviceplugin.slicer import Slicer, SliceRefused

    gpus = gpus_of_trace()
    states = [DeviceState(u, i, True, free_mib=free) for u, i, _, free in gpus]
    free_at_start = {u: free for u, _, _, free in gpus}
    available = [d for u, _, total, _ in gpus for d in unit_ids(u, unit_count(total, unit_mib))]
    slicer = Slicer(unit_mib, settle_s=3600, clock=lambda: 0.0)
    placed: list[tuple[str, int]] = []  # (GPU, MiB) in order
    refused = 0
    for gib in pods_gib:
        size = gib * 1024 // unit_mib
        if rule == "requested-only":
            # HAMi / gpushare: the units left on each GPU, never the GPU itself
            left: dict[str, list[str]] = {}
            for d in available:
                left.setdefault(d.split("::")[0], []).append(d)
            fit = [(len(v), k) for k, v in left.items() if len(v) >= size]
            ids = left[min(fit)[1]][:size] if fit else []
        else:
            if rule == "live, no book":
                slicer.slices.clear()
            ids = slicer.preferred(states, available, [], size)
            if ids:
                try:
                    slicer.allocate(ids, states)
                except SliceRefused:
                    ids = []
        if not ids:
            refused += 1
            continue
        taken = set(ids)
        available = [d for d in available if d not in taken]
        placed.append((ids[0].split("::")[0], size * unit_mib))
    used: dict[str, int] = {}
    ooms = 0
    for gpu, mib in placed:
        used[gpu] = used.get(gpu, 0) + mib
        if used[gpu] > free_at_start[gpu]:
            ooms += 1
    ideal = ideal_gpus([mib for _, mib in placed], sorted(free_at_start.values(), reverse=True))
    idle = max(free_at_start.values())  # a GPU nothing runs on: only the driver's reservation
    idle_left = sum(1 for u, free in free_at_start.items() if free == idle and u not in used)
    return {"placed": len(placed), "refused": refused, "ooms": ooms,
            "gpus": len(used), "ideal": ideal, "idle_left": idle_left}


def ideal_gpus(slices_mib: list[int], frees_mib: list[int]) -> int | str:
    """The fewest GPUs (given their live free memory, most first) that hold every slice, first
    fit decreasing over the first k GPUs for k = 1, 2, ...; '-' when even all cannot."""
    for k in range(1, len(frees_mib) + 1):
        bins = list(frees_mib[:k])
        ok = True
        for s in sorted(slices_mib, reverse=True):
            for i, room in enumerate(bins):
                if room >= s:
                    bins[i] -= s
                    break
            else:
                ok = False
                break
        if ok:
            return k
    return "-"


RULES = ("ours", "live, no book", "requested-only")


def packing(mixes: list[tuple[int, int]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for n, seed in mixes:
        pods = mix(n, seed)
        for rule in RULES:
            r = place(pods, rule)
            rows.append([
                f"{n} pods, {sum(pods)} GiB (seed {seed})" if rule == RULES[0] else "", rule,
                r["placed"], r["refused"], r["gpus"], r["ideal"], r["idle_left"], r["ooms"],
            ])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few calls and one mix (smoke test)")
    p.add_argument("--calls", type=int, default=500, help="gRPC calls of each kind")
    args = p.parse_args(argv)
    from loguru import logger

    logger.remove()  # the plugin's own log lines are not the figures
    calls = 5 if args.quick else args.calls
    mixes = [(12, 1)] if args.quick else [(12, 1), (16, 2), (20, 3), (24, 4), (30, 5)]
    lat = latency(calls)
    emit(
        header("GPU sharing by memory: the device plugin (bench/sharing.py)", sys.argv),
        "kubelet calls over gRPC, 8 GPUs x 80 units (ms; the last row: the message, bytes)\n"
        + table(["call", "n", "p50", "p90", "p99", "max"], lat),
        "packing a burst of 4/10/20/40 GiB pods (weights 4:3:2:1) on the trace's 8 GPUs, "
        "79 units each (2 idle at the start)\n"
        + table(
            ["mix", "rule", "placed", "refused", "GPUs used", "ideal", "idle GPUs left",
             "would OOM"],
            packing(mixes),
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
