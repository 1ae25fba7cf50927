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

Behaviours (``--behaviours``): ``old``, no write budget and the heartbeat on the Node (before
issue 16, temperature labels on); ``fleet``, the write budget at 30 s (set here, not the
settings default), liveness on a Lease and no temperature labels. ``--watchers 1 10 50``: during each run, K plain Node watch streams (as one
CNI agent per node holds; ``bench/watchers.py``), in windows of ``--duration-s`` each (K grows
from one window to the next), counting the events and bytes they receive and the API server's
own ``apiserver_watch_events_total``/``_sizes`` (kind Node).

On a 2-core machine the load generator competes with kube-apiserver and etcd for the same
cores: read the API server CPU column together with the generator's.

    .venv/bin/python bench/fleet.py                       # N = 100, 500, 1000; 60 s each
    .venv/bin/python bench/fleet.py --nodes 100 --duration-s 30
    .venv/bin/python bench/fleet.py --nodes 100 --jitter yes --watchers 1 10 50 --duration-s 40
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
from collections.abc import Callable
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
from bench.watchers import watch_program, watch_rows  # noqa: E402

GROUP = f"fleet-{os.getpid()}"
#: the write budget of the agent-fleet behaviour (issue 16), set here, not taken from defaults
FLEET_BUDGET_S = 30.0


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


def build_agents(
    kubeconfig: str, names: list[str], interval_s: float, behaviour: str = "old"
) -> list[FleetAgent]:
    """One agent per Node. ``old``: no write budget, the heartbeat on the Node's annotation and
    the temperature labels on (the behaviour before issue 16); ``fleet``: the write budget at
    ``FLEET_BUDGET_S``, liveness on a Lease in ``default`` (as an agent whose pod runs there)
    and no temperature labels."""
    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.kube import NodeClient
    from omaticaya_py.sources.replay import TraceReader

    template = TraceReader(H100_TRACE, window_s=interval_s)
    budget_s = FLEET_BUDGET_S if behaviour == "fleet" else 0.0
    rng = random.Random(7)
    out = []
    for name in names:
        settings = bench_settings(
            node_name=name, schedule=f"@every {interval_s:g}s", cleanup_on_exit=False,
            min_patch_interval_s=budget_s, temperature_labels=behaviour == "old",
        )  # fmt: skip
        reader = copy.copy(template)  # shares the parsed frames; own replay state
        reader._averaged = {}  # noqa: SLF001
        offset = rng.uniform(0, template.period_s)  # each node runs its own job
        reader._start = time.monotonic() - offset  # noqa: SLF001 - trace time `offset` now
        client = NodeClient(name, kubeconfig=kubeconfig, attempts=2)
        if behaviour == "fleet":
            env = {"POD_NAMESPACE": "default", "POD_NAME": f"bench-{name}"}
            agent = Agent(settings, reader, NodeApi(client, environ=env))
        else:
            agent = Agent(settings, reader, NodeApi(client, lease=None))
        out.append(FleetAgent(agent, client))
    return out


def snapshot(agents: list[FleetAgent], pids: dict[str, int | None]) -> dict[str, Any]:
    """Counters now: wall time, CPU seconds per process, Node patches and Lease writes."""
    cpu = {k: proc_cpu_s(p) for k, p in pids.items() if p}
    cpu["generator"] = time.process_time()
    return {
        "t": time.perf_counter(),
        "cpu": cpu,
        "patches": sum(len(a.patch_s) for a in agents),
        "leases": sum(a.agent.cache.lease_renewals for a in agents),
    }


def run_fleet(
    agents: list[FleetAgent], interval_s: float, jitter: bool, workers: int,
    pids: dict[str, int | None], program: Callable[[], list[dict[str, Any]]], settle_s: float = 0.0,
) -> dict[str, Any]:
    """Tick every agent on its schedule (a dispatcher thread and ``workers`` threads) while
    ``program`` runs in this thread, from ``settle_s`` after the end of the first interval; the
    steady state is that span. ``program`` returns its measurement windows (in ``windows``)."""
    rng = random.Random(42)
    t0 = time.perf_counter() + 0.5
    heap = [(t0 + (rng.uniform(0, interval_s) if jitter else 0.0), i) for i in range(len(agents))]
    heapq.heapify(heap)
    first_round_end = t0 + interval_s
    steady_from = first_round_end + settle_s
    lags: list[tuple[float, float]] = []
    errors = [0]
    lock = threading.Lock()
    done = threading.Event()

    def tick(a: FleetAgent, due: float) -> None:
        start = time.perf_counter()
        with lock:
            lags.append((start, start - due))
        try:
            a.agent.tick()
        except Exception:  # noqa: BLE001 - counted, the fleet goes on
            with lock:
                errors[0] += 1

    def dispatch(pool: ThreadPoolExecutor) -> None:
        while not done.is_set():
            due, i = heap[0]
            now = time.perf_counter()
            if due > now:
                time.sleep(min(due - now, 0.01))
                continue
            heapq.heappop(heap)
            pool.submit(tick, agents[i], due)
            heapq.heappush(heap, (due + interval_s, i))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        dispatcher = threading.Thread(target=dispatch, args=(pool,), daemon=True)
        dispatcher.start()
        time.sleep(max(0.0, steady_from - time.perf_counter()))
        first = snapshot(agents, pids)
        try:
            windows = program()
        finally:
            last = snapshot(agents, pids)
            done.set()
            dispatcher.join()
    end = last["t"]
    wall = end - first["t"]
    patches = [(t, s) for a in agents for t, s in a.patch_s]
    steady = [s for t, s in patches if steady_from <= t < end]
    first_round = [t for t, _ in patches if t < first_round_end]
    rss = {k: proc_rss_mib(p)[0] for k, p in pids.items() if p}
    return {
        "first_round_done_s": (max(first_round) - t0) if first_round else float("nan"),
        "patches": len(steady),
        "patches_per_s": len(steady) / wall,
        "leases": last["leases"] - first["leases"],
        "wall_s": wall,
        "p50_ms": median(steady) * 1e3,
        "p99_ms": pct(steady, 99) * 1e3,
        "lag_p99_ms": pct([lag for t, lag in lags if steady_from <= t < end], 99) * 1e3,
        "ticks": sum(1 for t, _ in lags if steady_from <= t < end),
        "errors": errors[0],
        "cpu": {k: (last["cpu"][k] - first["cpu"][k]) / wall for k in last["cpu"]},
        "rss": rss,
        "windows": windows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 20, 4 s per run")
    ap.add_argument("--nodes", type=int, nargs="+", help="fleet sizes (default 100 500 1000)")
    ap.add_argument("--interval-s", type=float, help="schedule, s (default 10)")
    ap.add_argument("--duration-s", type=float, help="steady-state seconds per run, or per "
                    "watcher count with --watchers (default 60)")  # fmt: skip
    ap.add_argument("--workers", type=int, default=32, help="worker threads running ticks")
    ap.add_argument("--jitter", nargs="+", choices=["no", "yes"], default=["no", "yes"])
    ap.add_argument("--behaviours", nargs="+", choices=["old", "fleet"],
                    help="old: no budget, annotation heartbeat; fleet: 30 s budget + Lease "
                    "(default: old; old and fleet with --watchers)")  # fmt: skip
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="seconds after the first interval before the steady state is counted")
    ap.add_argument("--watchers", type=int, nargs="+", default=[],
                    help="plain Node watch streams during the run, counted per K (e.g. 1 10 50)")
    ap.add_argument("--kubeconfig", help="reuse this API server (default $KUBECONFIG or a new one)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes = args.nodes or [20]
        args.duration_s, args.interval_s = args.duration_s or 4.0, args.interval_s or 2.0
    args.nodes = args.nodes or [100, 500, 1000]
    args.duration_s, args.interval_s = args.duration_s or 60.0, args.interval_s or 10.0
    args.behaviours = args.behaviours or (["old", "fleet"] if args.watchers else ["old"])
    ks = sorted(set(args.watchers))
    from loguru import logger

    logger.remove()
    rows, wrows = [], []
    with cluster(args.kubeconfig) as c:
        admin = admin_api(c.kubeconfig)
        pids = {"apiserver": c.pid("apiserver"), "etcd": c.pid("etcd")}
        try:
            for n in args.nodes:
                names = [f"{GROUP}-n{n}-{i:05d}" for i in range(n)]
                create_nodes(admin, names, GROUP)
                for behaviour in args.behaviours:
                    for jitter in [j == "yes" for j in args.jitter]:
                        agents = build_agents(c.kubeconfig, names, args.interval_s, behaviour)
                        # a fresh Node state per run: remove what the previous run wrote
                        for a in agents:
                            a.agent.cleanup(keep_static=False)
                            a.patch_s.clear()
                        if ks:
                            program = watch_program(
                                c.kubeconfig, lambda a=agents: snapshot(a, pids), ks, args.duration_s
                            )
                        else:
                            program = lambda: time.sleep(args.duration_s) or []  # noqa: E731
                        r = run_fleet(
                            agents, args.interval_s, jitter, args.workers, pids, program,
                            settle_s=args.settle_s,
                        )  # fmt: skip
                        for a in agents:
                            a.client.close()
                        cpu, rss = r["cpu"], r["rss"]
                        rows.append([
                            n, behaviour, "yes" if jitter else "no", r["first_round_done_s"],
                            r["ticks"], r["patches"], r["patches_per_s"],
                            r["leases"] * 3600 / n / r["wall_s"], r["p50_ms"], r["p99_ms"],
                            r["lag_p99_ms"], r["errors"],
                            cpu.get("apiserver", float("nan")), rss.get("apiserver", float("nan")),
                            cpu.get("etcd", float("nan")), cpu["generator"],
                        ])  # fmt: skip
                        wrows += watch_rows(n, behaviour, r["windows"])
                        print(f"(N={n} {behaviour} jitter={jitter}: done)", file=sys.stderr, flush=True)
                delete_nodes(admin, GROUP)
        finally:
            delete_nodes(admin, GROUP)
            admin.api_client.close()
    steady = f"{args.duration_s * max(1, len(ks)):g} s steady state per run"
    steady += f" after {args.settle_s:g} s settling" if args.settle_s else ""
    parts = [
        header(
            f"fleet: N agents at a {args.interval_s:g} s schedule against one kube-apiserver, "
            f"{steady}, {args.workers} worker threads"
        ),
        table(
            ["N", "behaviour", "jitter", "1st round s", "ticks", "patches", "patches/s",
             "lease writes/node-h", "patch p50 ms", "patch p99 ms", "tick lag p99 ms", "errors",
             "apiserver cores", "apiserver RSS MiB", "etcd cores", "generator cores"],
            rows,
        ),  # fmt: skip
        "1st round s: time until every Node had its first patch (GET + full patch each).\n"
        "cores: CPU seconds per wall second over the steady state (2 cores in all here).\n"
        f"behaviour: old = no write budget, heartbeat on the Node, temperature labels; fleet = "
        f"write budget {FLEET_BUDGET_S:g} s, Lease heartbeat, no temperature labels.",
    ]
    if wrows:
        parts.append(table(
            ["N", "behaviour", "K", "window s", "node writes/s", "node writes/node-h",
             "lease writes/node-h", "watch events/s", "watch KiB/s", "events/node-h",
             "MiB/node-h", "apiserver events/s", "apiserver KiB/s", "apiserver events/node-h",
             "apiserver MiB/node-h", "apiserver cores"],
            wrows,
        ))  # fmt: skip
        parts.append(
            "K: plain Node watch streams. watch events, KiB: counted by the watchers (event lines "
            "as received); apiserver: apiserver_watch_events_total and _sizes_sum (kind Node; "
            "the object without the event wrapper). /node-h: per fleet node and hour."
        )
    emit(*parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
