"""Freshness: time from a change in the GPU reading to the new label visible on the Node,
seen through a watch stream, for safe-direction and attractive-direction changes apart.

The agent runs for real (``Daemon.run()``: the APScheduler loop, a real ``NodeClient``, a real
kube-apiserver, liveness on a Lease in ``default``) over a step trace built from two recorded
H100 samples, idle (free memory 81079 MiB) and 30 GiB allocated (49832 MiB), and the idle one
with remapped rows pending (the GPU Unhealthy). The states cycle idle -> 30 GiB -> idle ->
unhealthy -> idle, one change every ``hold`` seconds of wall time, so the changes are, in turn:

- free memory down (safe: less attractive; the write budget lets it go at once),
- free memory up (attractive: held back by the write budget),
- health worse (safe), health better (attractive).

For each change: delay = (first watch event on which the label it moves, ``gpu.memory.free-mib``
or ``gpu.health``, shows the new value, or for a safe change one less attractive still) -
(trace change time); the new values are what the pure stages render for each state. A safe
change that finds the Node already on its safe side (a change for the better held back by the
budget left it there: free memory 0 while a GPU was Unhealthy) is counted as "already safe".
A reading is seen at the next tick: the goal for safe changes is one interval plus the tick's
jitter plus 10 ms (tick, patch, watch delivery). Attractive changes wait for the write budget
(the last patch and the last change for the worse both ``min_patch_interval_s`` old), or go
earlier, merged into the next safe change's patch. ``hold`` is the larger of 1.37 intervals (not
a multiple of it: the changes fall at every point of the tick cycle) and 0.685 budgets.
"after tick": the part after the tick started (read, render, diff, patch, watch delivery and
the client's decoding of the event: the agent's own latency), for the safe changes.

    .venv/bin/python bench/freshness.py      # 10 s, jitter 5 s (the chart's), budget 30 and 0: ~6 min
    .venv/bin/python bench/freshness.py --intervals 1 5 --jitter-s 0 --budgets 0
    .venv/bin/python bench/freshness.py --quick    # 0.5 s, budgets 2 and 0, 4 changes: ~15 s
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    admin_api,
    bench_settings,
    cluster,
    create_nodes,
    delete_nodes,
    emit,
    header,
    load_raw,
    median,
    table,
    write_trace,
)

SLACK_S = 0.010
GROUP = f"freshness-{os.getpid()}"
PREFIX = "omaticaya.io"
#: the label each kind of change moves, and whether it is in the safe direction
KINDS = (
    ("free memory down", f"{PREFIX}/gpu.memory.free-mib", True),
    ("free memory up", f"{PREFIX}/gpu.memory.free-mib", False),
    ("health worse", f"{PREFIX}/gpu.health", True),
    ("health better", f"{PREFIX}/gpu.health", False),
)


def step_trace(hold_s: float, changes: int, tail_s: float) -> Path:
    """Idle, 30-GiB and unhealthy-idle samples of the recorded trace, cycling (see ``KINDS``)
    every ``hold_s`` for ``changes`` changes, then the last state for ``tail_s`` more."""
    raw = load_raw()
    idle = next(s for s in raw["samples"] if s["t"] >= 1.0)
    alloc = next(s for s in raw["samples"] if s["t"] >= 9.0)  # 30 GiB allocated, not busy
    sick = copy.deepcopy(idle)
    for g in sick["gpus"]:
        g["remapped_rows"] = {**g["remapped_rows"], "pending": 1}
    cycle = (idle, alloc, idle, sick)
    out = copy.deepcopy(raw)
    out["samples"] = [
        {**copy.deepcopy(cycle[k % 4]), "t": round(k * hold_s, 6)} for k in range(changes + 1)
    ]
    out["samples"].append({**copy.deepcopy(cycle[changes % 4]), "t": changes * hold_s + tail_s})
    out["interval_s"] = hold_s
    out["phases"] = [{"t": 0.0, "phase": "step"}]
    return write_trace(out, f"step-{hold_s:g}")


def run_one(
    kubeconfig: str, api: Any, interval_s: float, budget_s: float, jitter_s: float, changes: int
) -> dict[str, Any]:
    from kubernetes import watch
    from urllib3.exceptions import ProtocolError

    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.agent.daemon import Daemon
    from omaticaya_py.kube import NodeClient
    from omaticaya_py.sources.replay import TraceReader

    hold = max(interval_s * 1.37, budget_s * 0.685)
    node = f"{GROUP}-{interval_s:g}-{budget_s:g}".replace(".", "p")
    create_nodes(api, [node], GROUP)
    run_s = hold * changes + budget_s + interval_s + jitter_s + 2.0  # the last one seen
    path = step_trace(hold, changes, run_s)
    reader = TraceReader(path, window_s=interval_s)
    settings = bench_settings(
        node_name=node, schedule=f"@every {interval_s:g}s", cleanup_on_exit=False, metrics_port=0,
        min_patch_interval_s=budget_s, jitter_s=jitter_s,
    )  # fmt: skip
    env = {"POD_NAMESPACE": "default", "POD_NAME": f"bench-{node}"}
    agent = Agent(settings, reader, NodeApi(NodeClient(node, kubeconfig=kubeconfig), environ=env))
    tick_starts: list[float] = []
    safe_tick = agent.safe_tick

    def timed_tick() -> None:
        tick_starts.append(time.monotonic())
        safe_tick()

    agent.safe_tick = timed_tick  # type: ignore[method-assign]
    seen: list[tuple[float, dict[str, str]]] = []  # (when, our labels) per watch event
    ready = threading.Event()
    w = watch.Watch()

    def watcher() -> None:
        rv = api.read_node(node).metadata.resource_version
        ready.set()
        try:
            for ev in w.stream(
                api.list_node, field_selector=f"metadata.name={node}", resource_version=rv,
                timeout_seconds=int(run_s) + 60,
            ):  # fmt: skip
                labels = ev["object"].metadata.labels or {}
                mine = {k: v for k, v in labels.items() if k.startswith(PREFIX)}
                seen.append((time.monotonic(), mine))
        except ProtocolError:  # the stream closed under w.stop() once the run is over
            pass

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    ready.wait(10)
    daemon = Daemon(agent)
    stopper = threading.Timer(run_s, daemon.stop)
    stopper.start()
    reader._start = time.monotonic()  # noqa: SLF001 - trace time 0 = now (changes at k*hold)
    start = reader._start  # noqa: SLF001
    daemon.run()  # main thread: APScheduler loop until the timer stops it
    stopper.cancel()
    w.stop()
    expected = state_labels(path, hold, changes, settings)
    out: dict[bool, list[tuple[float, float]]] = {True: [], False: []}  # safe? -> (delay, after)
    missed, already = {True: 0, False: 0}, {True: 0, False: 0}
    for k in range(1, changes + 1):
        _, label, safe = KINDS[(k - 1) % 4]
        t_change, new = start + k * hold, expected[k].get(label)
        before = [labels.get(label) for t, labels in seen if t < t_change]
        if before and reached(label, before[-1], new, safe):  # a held-back change left it safe
            already[safe] += 1
            continue
        hit = next(
            (t for t, labels in seen if t >= t_change and reached(label, labels.get(label), new, safe)),
            None,
        )
        if hit is None:
            missed[safe] += 1
            continue
        ticks = [t for t in tick_starts if t <= hit]
        out[safe].append((hit - t_change, hit - ticks[-1] if ticks else float("nan")))
    return {"hold": hold, "changes": out, "missed": missed, "already": already}


def reached(label: str, value: str | None, new: str | None, safe: bool) -> bool:
    """Whether the Node's ``value`` of ``label`` shows a change to ``new``: that value, or (a
    safe change) one less attractive still (``core.publish.budget.worse``)."""
    from omaticaya_py.core.publish.budget import worse

    return value == new or (safe and worse(label.rpartition("/")[2], new, value))


def state_labels(path: Path, hold: float, changes: int, settings: Any) -> list[dict[str, str]]:
    """The labels the agent renders for the trace's state after each change (index k: after
    the k-th; 0: the start), from the pure stages (read at a pinned time, assess, render with
    the previous state's labels for hysteresis, as the agent's ticks do)."""
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.rules.health import assess
    from omaticaya_py.sources.replay import TraceReader

    out: list[dict[str, str]] = []
    for k in range(changes + 1):
        snap = TraceReader(path, at_s=(k + 0.5) * hold).read()
        previous = out[-1] if out else None
        desired = render(snap, assess(snap), settings, previous, with_telemetry=False)
        out.append(dict(desired.labels))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.5 s schedule, budgets 2 and 0, 4 changes")
    ap.add_argument("--intervals", type=float, nargs="+", help="schedules, s (default 10)")
    ap.add_argument("--changes", type=int, nargs="+", help="changes per schedule (default 8)")
    ap.add_argument("--budgets", type=float, nargs="+", help="min_patch_interval_s (default 30 0)")
    ap.add_argument("--jitter-s", type=float, help="the agent's jitter_s (default 5, the chart's)")
    ap.add_argument("--kubeconfig", help="reuse this API server (default $KUBECONFIG or a new one)")
    args = ap.parse_args(argv)
    if args.quick:
        args.intervals, args.changes = args.intervals or [0.5], args.changes or [4]
        args.budgets = args.budgets or [2.0, 0.0]
        args.jitter_s = 0.0 if args.jitter_s is None else args.jitter_s
    args.intervals, args.changes = args.intervals or [10.0], args.changes or [8]
    args.budgets = [30.0, 0.0] if args.budgets is None else args.budgets
    args.jitter_s = 5.0 if args.jitter_s is None else args.jitter_s
    from loguru import logger

    logger.remove()
    rows, notes = [], []
    with cluster(args.kubeconfig) as c:
        api = admin_api(c.kubeconfig)
        try:
            for interval, changes in zip(
                args.intervals, args.changes + args.changes[-1:] * len(args.intervals),
                strict=False,
            ):  # fmt: skip
                for budget in args.budgets:
                    r = run_one(c.kubeconfig, api, interval, budget, args.jitter_s, changes)
                    rows += result_rows(r, interval, budget, args.jitter_s, changes)
                    for safe, got in r["changes"].items():
                        kind = "safe" if safe else "attractive"
                        notes.append(f"{interval:g} s, budget {budget:g} s, {kind}: delays ms = "
                                     + ", ".join(f"{d * 1e3:.0f}" for d, _ in got))  # fmt: skip
                    over = [d for d, _ in r["changes"][True] if d > interval + SLACK_S]
                    notes.append(f"{interval:g} s, budget {budget:g} s: safe changes later than "
                                 f"one interval + 10 ms: {len(over)} of "
                                 f"{len(r['changes'][True])}")  # fmt: skip
        finally:
            delete_nodes(api, GROUP)
            api.api_client.close()
    emit(
        header("freshness: trace change -> label visible on a watch stream (real agent loop), "
               f"jitter {args.jitter_s:g} s, liveness on a Lease"),  # fmt: skip
        table(
            ["interval s", "budget s", "hold s", "changes seen", "direction", "seen",
             "already safe", "min ms", "median ms", "max ms", "after tick median ms",
             "goal: safe <= interval + jitter + 10 ms"],
            rows,
        ),  # fmt: skip
        "seen: the Node shows the new value (a safe change: or one less attractive still); "
        "already safe: it did at the change (a held-back change for the better left it there); "
        "delays over the others. Attractive changes wait for the budget: the last patch and the "
        "last change for the worse both budget seconds old (core.publish.budget.hold_back).\n"
        + "\n".join(notes),
    )
    return 0


def result_rows(
    r: dict[str, Any], interval: float, budget: float, jitter: float, changes: int
) -> list[list[Any]]:
    """One row per direction: changes seen on the Node, their delays, and (safe ones) the goal."""
    total = sum(len(v) + r["already"][k] for k, v in r["changes"].items())
    rows = []
    for safe in (True, False):
        got = r["changes"][safe]
        d = [x for x, _ in got]
        a = [x for _, x in got]
        wanted = len(got) + r["missed"][safe] + r["already"][safe]
        bound = interval + jitter + SLACK_S
        worst = max(d) if d else float("nan")
        ok = r["missed"][safe] == 0 and (not d or worst <= bound)
        rows.append([
            f"{interval:g}", f"{budget:g}", f"{r['hold']:.3g}", f"{total}/{changes}",
            "safe" if safe else "attractive", f"{len(d) + r['already'][safe]}/{wanted}",
            r["already"][safe], min(d) * 1e3 if d else float("nan"), median(d) * 1e3,
            worst * 1e3, median(a) * 1e3 if safe else "-",
            (f"{bound * 1e3:,.0f}: " + ("met" if ok else "MISSED")) if safe else "-",
        ])  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
