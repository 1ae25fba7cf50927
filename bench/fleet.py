"""Fleet scale: N Nodes, each with its own agent (Agent + NodeClient + TraceReader), ticking
at a 10 s schedule against one local kube-apiserver, with and without start jitter.

All agents share this process: a dispatcher thread fires each agent's tick when it is due
(every ``--interval-s``) on a pool of worker threads (each tick is the real ``Agent.tick()``:
read the looping H100 trace on the wall clock, render, diff, and a real merge patch over its
own TLS connection when a quantised value changed). Without jitter every agent starts at the
same instant, every interval (ticks in lock-step); with jitter each starts at a uniform random
offset within one interval. In both, each Node replays the trace from its own random point
(different jobs on different nodes), so that jitter changes only when requests are sent.

The first interval (every agent's first GET and full patch) is reported apart; the table is
the steady state after it: patches/s, patch round-trip p50/p99 (``NodeClient.patch_node``),
tick start lag p99 (how late the load generator started a tick: if high, the generator, not
the API server, is the bottleneck), kube-apiserver and etcd CPU (cores, from
/proc/<pid>/stat) and RSS, and this process' CPU.

On a 2-core machine the load generator competes with kube-apiserver and etcd for the same
cores: read the API server CPU column together with the generator's.

    .venv/bin/python bench/fleet.py                       # N = 100, 500, 1000; 60 s each
    .venv/bin/python bench/fleet.py --nodes 100 --duration-s 30
    .venv/bin/python bench/fleet.py --quick               # N = 20, 6 s each
"""

from __future__ import annotations

import argparse
import copy
import heapq
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    H100_TRACE,
    admin_api,
    bench_settings,
    cluster,
    create_nodes,
    delete_nodes,
    emit,
    header,
    median,
    pct,
    proc_cpu_s,
    proc_rss_mib,
    table,
)

GROUP = f"fleet-{os.getpid()}"


class FleetAgent:
    """One simulated node: its agent and what its ticks measured."""

    def __init__(self, agent: Any, client: Any) -> None:
        self.agent, self.client = agent, client
        self.patch_s: list[tuple[float, float]] = []  # (finished at, seconds)
        original = client.patch_node

        def timed_patch(patch: Any) -> Any:
            t0 = time.perf_counter()
            out = original(patch)
            t1 = time.perf_counter()
            self.patch_s.append((t1, t1 - t0))
            return out

        client.patch_node = timed_patch  # type: ignore[method-assign]


def build_agents(kubeconfig: str, names: list[str], interval_s: float) -> list[FleetAgent]:
    from omaticaya_py.agent import Agent
    from omaticaya_py.kube import NodeClient
    from omaticaya_py.sources.replay import TraceReader

    template = TraceReader(H100_TRACE, window_s=interval_s)
    settings = {
        n: bench_settings(node_name=n, schedule=f"@every {interval_s:g}s", cleanup_on_exit=False)
        for n in names
    }
    rng = random.Random(7)
    out = []
    for name in names:
        reader = copy.copy(template)  # shares the parsed frames; own replay state
        reader._averaged = {}  # noqa: SLF001
        offset = rng.uniform(0, template.period_s)  # each node runs its own job
        reader._start = time.monotonic() - offset  # noqa: SLF001 - trace time `offset` now
        client = NodeClient(name, kubeconfig=kubeconfig, attempts=2)
        out.append(FleetAgent(Agent(settings[name], reader, client), client))
    return out


def run_fleet(
    agents: list[FleetAgent], interval_s: float, duration_s: float, jitter: bool, workers: int,
    pids: dict[str, int | None],
) -> dict[str, Any]:
    rng = random.Random(42)
    t0 = time.perf_counter() + 0.5
    heap = [(t0 + (rng.uniform(0, interval_s) if jitter else 0.0), i) for i in range(len(agents))]
    heapq.heapify(heap)
    end = t0 + interval_s + duration_s
    steady_from = t0 + interval_s
    lags: list[tuple[float, float]] = []
    errors = [0]
    lock = threading.Lock()

    def tick(a: FleetAgent, due: float) -> None:
        start = time.perf_counter()
        with lock:
            lags.append((start, start - due))
        try:
            a.agent.tick()
        except Exception:  # noqa: BLE001 - counted, the fleet goes on
            with lock:
                errors[0] += 1

    cpu0: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        marked = False
        while heap:
            due, i = heap[0]
            now = time.perf_counter()
            if not marked and now >= steady_from:
                marked = True
                cpu0 = {k: proc_cpu_s(p) for k, p in pids.items() if p}
                cpu0["generator"] = time.process_time()
                wall0 = now
            if due >= end:
                break
            if due > now:
                time.sleep(min(due - now, 0.01))
                continue
            heapq.heappop(heap)
            pool.submit(tick, agents[i], due)
            heapq.heappush(heap, (due + interval_s, i))
        now = time.perf_counter()
        wall = now - wall0 if marked else float("nan")
        cpu = {k: proc_cpu_s(p) - cpu0.get(k, 0.0) for k, p in pids.items() if p}
        cpu["generator"] = time.process_time() - cpu0.get("generator", 0.0)
    patches = [(t, s) for a in agents for t, s in a.patch_s]
    steady = [s for t, s in patches if steady_from <= t < end]
    first = [t for t, _ in patches if t < steady_from]
    rss = {k: proc_rss_mib(p)[0] for k, p in pids.items() if p}
    return {
        "first_round_patches": len(first),
        "first_round_done_s": (max(first) - t0) if first else float("nan"),
        "patches": len(steady),
        "patches_per_s": len(steady) / duration_s,
        "p50_ms": median(steady) * 1e3,
        "p99_ms": pct(steady, 99) * 1e3,
        "lag_p99_ms": pct([lag for t, lag in lags if t >= steady_from], 99) * 1e3,
        "ticks": sum(1 for t, _ in lags if t >= steady_from),
        "errors": errors[0],
        "cpu": {k: v / wall for k, v in cpu.items()},
        "rss": rss,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 20, 6 s per run")
    ap.add_argument("--nodes", type=int, nargs="+", help="fleet sizes (default 100 500 1000)")
    ap.add_argument("--interval-s", type=float, help="schedule, s (default 10)")
    ap.add_argument("--duration-s", type=float, help="steady-state seconds per run (default 60)")
    ap.add_argument("--workers", type=int, default=32, help="worker threads running ticks")
    ap.add_argument("--kubeconfig", help="reuse this API server (default $KUBECONFIG or a new one)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes = args.nodes or [20]
        args.duration_s, args.interval_s = args.duration_s or 4.0, args.interval_s or 2.0
    args.nodes = args.nodes or [100, 500, 1000]
    args.duration_s, args.interval_s = args.duration_s or 60.0, args.interval_s or 10.0
    from loguru import logger

    logger.remove()
    rows = []
    with cluster(args.kubeconfig) as c:
        admin = admin_api(c.kubeconfig)
        pids = {"apiserver": c.pid("apiserver"), "etcd": c.pid("etcd")}
        try:
            for n in args.nodes:
                names = [f"{GROUP}-n{n}-{i:05d}" for i in range(n)]
                create_nodes(admin, names, GROUP)
                for jitter in (False, True):
                    agents = build_agents(c.kubeconfig, names, args.interval_s)
                    # a fresh Node state per run: remove what the previous run wrote
                    for a in agents:
                        a.agent.cleanup(keep_static=False)
                        a.patch_s.clear()
                    r = run_fleet(agents, args.interval_s, args.duration_s, jitter, args.workers, pids)
                    for a in agents:
                        a.client.close()
                    cpu, rss = r["cpu"], r["rss"]
                    rows.append([
                        n, "yes" if jitter else "no", r["first_round_done_s"], r["ticks"],
                        r["patches"], r["patches_per_s"], r["p50_ms"], r["p99_ms"],
                        r["lag_p99_ms"], r["errors"],
                        cpu.get("apiserver", float("nan")), rss.get("apiserver", float("nan")),
                        cpu.get("etcd", float("nan")), cpu["generator"],
                    ])
                    print(f"(N={n} jitter={jitter}: done)", file=sys.stderr, flush=True)
                delete_nodes(admin, GROUP)
        finally:
            delete_nodes(admin, GROUP)
            admin.api_client.close()
    emit(
        header(
            f"fleet: N agents at a {args.interval_s:g} s schedule against one kube-apiserver, "
            f"{args.duration_s:g} s steady state per run, {args.workers} worker threads"
        ),
        table(
            ["N", "jitter", "1st round s", "ticks", "patches", "patches/s", "patch p50 ms",
             "patch p99 ms", "tick lag p99 ms", "errors", "apiserver cores", "apiserver RSS MiB",
             "etcd cores", "generator cores"],
            rows,
        ),
        "1st round s: time until every Node had its first patch (GET + full patch each).\n"
        "cores: CPU seconds per wall second over the steady state (2 cores in all here).",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
