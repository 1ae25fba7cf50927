"""Scheduler extender latency and memory: filter + prioritize at N nodes with pods in flight,
the extender before a change (a ``git worktree`` of ``--before-rev``) and after it (this
working tree), side by side in one run.

Each case runs a fresh extender process (``multiprocessing`` spawn, ``sys.path`` pointing at
the tree under test: its RSS is the extender's alone). It builds what ``scheduler.server.serve``
builds: the Node cache from the LIST (each Node parsed as the server's ``transform`` does:
``parse_node``, ``with_signal``, ``with_policy``), fed the LIST bodies this process encoded
once: one body of every Node for ``before`` (its informer's single LIST), pages of
``--page-size`` Nodes for ``after`` (``limit`` + ``continue``: each page decoded, transformed
and freed before the next, as ``kube.Informer._list`` does); the pods in flight; and the
Starlette app behind ``serving.HttpServer`` (uvicorn) on 127.0.0.1. The Nodes carry what the
agent renders (``core.publish.render`` and the telemetry annotation, 8 H100s each, random free memory).
The extender's clock is frozen when its cache is built, so nothing settles or goes stale.

Pods in flight (30 GiB each, none yet in its node's telemetry): ``in flight`` pods bound,
spread evenly over the nodes; ``assumed`` pods that passed the filter and are not yet seen
bound. Before: ``placements.InFlight`` over a pod cache stand-in, the assumed pods counted on
every node they passed on (``InFlight.assume`` with every name). After: the reservation ledger
(``scheduler.ledger``), bound pods through ``Ledger.pod_changed`` as the pod watch feeds them,
assumed pods reserved on one node each (what the filter's narrowing does).

Timed per call (ms, p50 / p99, per verb and for both verbs of one pod):

- ``cold first call``: the extender's first filter (no verdict kept yet: every name judged)
  and the prioritize of the same pod after it, one call each, on the wall clock and in the
  thread's CPU time, right after the cache is built (issue 51: at most 10 ms at 15,000 nodes);
- ``pure``: ``Extender.filter`` + ``prioritize`` in the extender process, no HTTP, all names;
  timed on the wall clock, then again in the thread's CPU time (``time.thread_time``: what the
  machine's other work does not inflate; a 2-core machine shared with other work makes the wall
  p99 mostly waiting for a core);
- ``HTTP, all names``: POST /filter and /prioritize, each with every name (``NodeNames``,
  ``nodeCacheCapable: true``, ``percentageOfNodesToScore: 100``), one keep-alive connection;
- ``HTTP, as scheduled``: /filter with every name, then /prioritize with the names the filter
  passed, as kube-scheduler 1.20 sends them (it skips prioritize when one node is left: after
  the narrowing that is always; the call is timed anyway).

RSS (MiB, /proc/<pid>/status of the extender): after its imports, with the cache built, and
the peak (VmHWM) after the calls. After the cache is built the extender settles its heap as
``serve`` does once its caches have synced (``server.settle_heap``: ``gc.freeze`` and a higher
first-generation threshold), where the tree has it.

The trees run case by case, one after the other (a load that changes during the run weighs on
both sides of a ratio alike); the first table gives, per case and path, both verbs' p50 and p99
on each tree and before / after (above 1: the working tree is faster). Today's tree against
the working tree, side by side in one run: ``--before-rev HEAD`` (or any commit).

    .venv/bin/python bench/extender.py                      # 5,000 nodes, before vs after, ~10 min
    .venv/bin/python bench/extender.py --nodes 15000 --before-rev c811c0e   # issue 51, ~3 min
    .venv/bin/python bench/extender.py --nodes 1000 --inflight 0 1000 --assumed 100
    .venv/bin/python bench/extender.py --quick              # 100 nodes, 30 calls, after only
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from itertools import product
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_settings, emit, header, pct, proc_rss_mib, table  # noqa: E402
from bench.extender_data import POD_MIB, PodCacheStub, node_docs, pod_doc  # noqa: E402

#: the last commit before the reservation ledger (issue 24): the default ``before``
BEFORE_REV = "45e220c"
#: the rows of the first filter and prioritize of the extender process (one call each)
COLD, COLD_CPU = "cold first call, all names", "cold first call, CPU time"
#: the rows the ratio table and the goal lines read
HTTP_ALL = "HTTP, all names"


def time_calls(fn: Any, calls: int, clock: Any = time.perf_counter) -> list[float]:
    """ms per call of ``fn`` by ``clock`` (wall; ``time.thread_time``: this thread's CPU time,
    which a busy machine's other processes do not inflate), after 10 warm-up calls."""
    for _ in range(min(10, calls)):  # warm-up
        fn()
    out = []
    for _ in range(calls):
        t0 = clock()
        fn()
        out.append((clock() - t0) * 1000)
    return out


def _in_flight(ext: Any, cache: dict[str, Any], names: list[str], inflight: int, assumed: int,
               now: float) -> str:  # fmt: skip
    """Wire the pods in flight the way the tree under test does; returns which way."""
    from omaticaya_py.scheduler.inflight import Placement

    rng = random.Random(11)
    bound = []
    for j in range(inflight):
        node = names[j * len(names) // inflight]
        uid = f"inflight-{j:06d}"
        bound.append(Placement(f"default/p{j}", uid, node, POD_MIB, 1,
                               placed_at=now - rng.uniform(0, 30)))  # fmt: skip
    try:
        from omaticaya_py.scheduler.ledger import Ledger
    except ImportError:  # before: InFlight over the pod cache, assumed on every name
        from omaticaya_py.scheduler.placements import InFlight

        flights = InFlight(PodCacheStub({p.key: p for p in bound}), assume_s=86400)
        ext.placements, ext.assume = flights.for_node, flights.assume
        for j in range(assumed):
            flights.assume(f"assumed-{j:06d}", f"default/a{j}", POD_MIB, 1, names, now)
        return "InFlight"
    ledger = Ledger(ext.settings.settle_s, assume_s=86400)
    for p in bound:
        ledger.pod_changed(p.key, None, p)
    for j in range(assumed):
        node = names[(j * len(names) // max(1, assumed) + 1) % len(names)]
        ledger.reserve(Placement(f"default/a{j}", f"assumed-{j:06d}", node, POD_MIB, 1,
                                 placed_at=now, gpus=(j % 8,), bound=False))  # fmt: skip
    ext.ledger = ledger
    return "Ledger"


def serve_extender(conn: Any, tree: str, nodes: int, inflight: int, assumed: int, calls: int
                   ) -> None:  # fmt: skip
    """The extender process of the tree at ``tree``: cache from the LIST bodies sent on
    ``conn``, pods in flight, pure timings, then HTTP until told to stop."""
    sys.path.insert(0, tree)
    import omaticaya_py.kube  # noqa: F401 - the Node, pod and Lease caches' client
    from omaticaya_py.logs import setup_logging
    from omaticaya_py.scheduler import Extender, ExtenderSettings, create_app, parse_node
    from omaticaya_py.scheduler.server import serve  # noqa: F401 - its imports, as in production
    try:  # the node view's module (scheduler.signal and scheduler.staleness before issue 32)
        from omaticaya_py.scheduler.nodeview import with_policy, with_signal
    except ImportError:
        from omaticaya_py.scheduler.signal import with_signal  # type: ignore[no-redef]
        from omaticaya_py.scheduler.staleness import with_policy  # type: ignore[no-redef]
    from omaticaya_py.serving import HttpServer

    assert omaticaya_py.kube.__file__.startswith(tree), omaticaya_py.kube.__file__
    setup_logging("INFO")
    pid = os.getpid()
    rss_imports = proc_rss_mib(pid)[0]
    settings = ExtenderSettings(_env_file=None, port=8888)  # type: ignore[call-arg]
    prefix, now = settings.prefix, time.time()
    cache = {}
    while body := conn.recv_bytes():  # each LIST body (page), decoded, transformed, freed
        for d in json.loads(body)["items"]:
            m = d["metadata"]
            state = parse_node(m["name"], m["labels"], m["annotations"], prefix)
            cache[m["name"]] = with_policy(with_signal(state, settings.signal), m["annotations"],
                                           prefix)  # fmt: skip
        del body, d, m
    gc.collect()
    rss_cache = proc_rss_mib(pid)[0]
    names = list(cache)
    ext = Extender(settings, cache.get, clock=lambda: now)
    way = _in_flight(ext, cache, names, inflight, assumed, now)
    try:  # what serve() does once its caches have synced (after: gc.freeze, GC threshold)
        from omaticaya_py.scheduler.server import settle_heap
    except ImportError:
        pass
    else:
        settle_heap()
    args = {"Pod": pod_doc(prefix), "Nodes": None, "NodeNames": names}
    # the cold first call: nothing judged yet (every name's verdict made now), wall and CPU
    w0, c0 = time.perf_counter(), time.thread_time()
    passed = len(ext.filter(args)["NodeNames"])
    w1, c1 = time.perf_counter(), time.thread_time()
    ext.prioritize(args)
    w2, c2 = time.perf_counter(), time.thread_time()
    cold = ([(w1 - w0) * 1000], [(w2 - w1) * 1000], [(c1 - c0) * 1000], [(c2 - c1) * 1000])
    pure = (time_calls(lambda: ext.filter(args), calls),
            time_calls(lambda: ext.prioritize(args), calls))  # fmt: skip
    cpu = (time_calls(lambda: ext.filter(args), calls, time.thread_time),
           time_calls(lambda: ext.prioritize(args), calls, time.thread_time))  # fmt: skip
    server = HttpServer(create_app(ext), "127.0.0.1", 0).start()
    conn.send({"port": server.port, "pure": pure, "cpu": cpu, "passed": passed, "way": way,
               "rss": (rss_imports, rss_cache), "cold": cold})  # fmt: skip
    conn.recv()  # stop
    server.shutdown()


def row(path: str, calls: int, ft: list[float], pt: list[float]) -> list[Any]:
    """p50/p99 of each verb, of their sum per pod, and the largest sum, ms."""
    both = [a + b for a, b in zip(ft, pt, strict=True)]
    return [path, calls, pct(ft, 50), pct(ft, 99), pct(pt, 50), pct(pt, 99), pct(both, 50),
            pct(both, 99), max(both)]  # fmt: skip


def http_rows(port: int, names: list[str], calls: int) -> list[list[Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def post(verb: str, body: bytes) -> bytes:
        conn.request("POST", f"/{verb}", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, (resp.status, data[:200])
        return data

    pod = pod_doc(bench_settings().prefix)
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    rows = [row("HTTP, all names", calls, time_calls(lambda: post("filter", body), calls),
                time_calls(lambda: post("prioritize", body), calls))]  # fmt: skip
    ft, pt = [], []
    for i in range(calls + min(10, calls)):  # as kube-scheduler: prioritize what passed
        t0 = time.perf_counter()
        passed = json.loads(post("filter", body))["NodeNames"] or []
        t1 = time.perf_counter()
        post("prioritize", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode())
        t2 = time.perf_counter()
        if i >= min(10, calls):
            ft.append((t1 - t0) * 1000)
            pt.append((t2 - t1) * 1000)
    rows.append(row("HTTP, as scheduled", calls, ft, pt))
    conn.close()
    return rows


def bodies(docs: list[dict[str, Any]], page: int) -> list[bytes]:
    """The LIST bodies: one of every Node (``page`` 0), else pages of ``page`` Nodes."""
    size = page or len(docs)
    return [json.dumps({"kind": "NodeList", "items": docs[i : i + size]}).encode()
            for i in range(0, len(docs), size)]  # fmt: skip


def run_case(tree: Path, lists: list[bytes], nodes: int, inflight: int, assumed: int,
             calls: int) -> dict[str, Any]:  # fmt: skip
    """One extender process of ``tree``: its timings (rows) and RSS."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve_extender,
                       args=(child, str(tree), nodes, inflight, assumed, calls))  # fmt: skip
    proc.start()
    try:
        for body in lists:
            parent.send_bytes(body)
        parent.send_bytes(b"")
        got = parent.recv()
        cold = got.get("cold")
        rows = [row(COLD, 1, *cold[:2]), row(COLD_CPU, 1, *cold[2:])] if cold else []
        rows += [row("pure (no HTTP), all names", calls, *got["pure"]),
                 row("pure, CPU time, all names", calls, *got["cpu"])]  # fmt: skip
        rows += http_rows(got["port"], [f"gpu-node-{i:05d}" for i in range(nodes)], calls)
        rss, hwm = proc_rss_mib(proc.pid)
        parent.send("stop")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
    return {"rows": rows, "passed": got["passed"], "rss": rss, "hwm": hwm, "way": got["way"],
            "rss_at": got["rss"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", help="cluster sizes (default 5000)")
    ap.add_argument("--inflight", type=int, nargs="+",
                    help="pods bound, not yet in telemetry (default 0 1000)")  # fmt: skip
    ap.add_argument("--assumed", type=int, nargs="*",
                    help="pods passed and not yet seen bound, added to the largest in-flight "
                    "case (default 100; none: skip)")  # fmt: skip
    ap.add_argument("--calls", type=int, help="timed calls per verb and case (default 100)")
    ap.add_argument("--page-size", type=int, default=500, help="Nodes per LIST page (after)")
    ap.add_argument("--before-rev", default=BEFORE_REV,
                    help=f"the extender 'before' (a git rev; default {BEFORE_REV}); 'none': skip")
    ap.add_argument("--quick", action="store_true", help="100 nodes, 30 calls, after only")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.calls = args.nodes or [100], args.calls or 30
        args.inflight = args.inflight or [0, 100]
        args.assumed = [5] if args.assumed is None else args.assumed
        args.before_rev = "none" if args.before_rev == BEFORE_REV else args.before_rev
    args.nodes, args.calls = args.nodes or [5000], args.calls or 100
    args.inflight = args.inflight or [0, 1000]
    args.assumed = [100] if args.assumed is None else args.assumed
    cases = [(k, 0) for k in args.inflight] + [(max(args.inflight), a) for a in args.assumed]
    trees: list[tuple[str, Path, int]] = []
    with tempfile.TemporaryDirectory(prefix="extender-bench-") as tmp:
        if args.before_rev != "none":
            from bench.burst import worktree

            path, sha = worktree(args.before_rev, Path(tmp), "before")
            # the extender before the ledger read every Node in one LIST; later ones page
            trees.append((f"before ({sha[:7]})", path,
                          0 if args.before_rev == BEFORE_REV else args.page_size))  # fmt: skip
        trees.append(("after", ROOT, args.page_size))
        try:
            return report(args, cases, trees)
        finally:
            for _, path, _ in trees:
                if path != ROOT:
                    import subprocess

                    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                                   check=False, capture_output=True)  # fmt: skip


def ratios(full: dict[tuple[str, int, int, int, str], list[Any]], before: str
           ) -> list[list[Any]]:  # fmt: skip
    """Per case and path measured on both trees: both verbs' p50 and p99, before and after,
    and before / after (above 1: the after tree is faster)."""
    out = []
    for (label, n, k, a, path), x in full.items():
        y = full.get(("after", n, k, a, path))
        if label != before or y is None:
            continue
        out.append([n, k, a, path, x[6], y[6], x[6] / y[6], x[7], y[7], x[7] / y[7]])
    return out


def report(args: Any, cases: list[tuple[int, int]], trees: list[tuple[str, Path, int]]) -> int:
    timing, memory = [], []
    full: dict[tuple[str, int, int, int, str], list[Any]] = {}
    for n in args.nodes:
        docs = node_docs(n, time.time())
        lists_of = {label: bodies(docs, page) for label, _, page in trees}
        # case by case, the trees one after the other: a machine whose load changes during
        # the run weighs on both sides of each ratio alike
        for (k, a), (label, tree, _) in product(cases, trees):
            lists = lists_of[label]
            # the extender before the ledger: ~1.7 s a call with pods assumed (issue 24)
            slow = label == f"before ({BEFORE_REV[:7]})" and a >= 10
            calls = max(5, args.calls // 10) if slow else args.calls
            r = run_case(tree, lists, n, k, a, calls)
            for x in r["rows"]:
                timing.append([label, n, k, a, *x])
                full[(label, n, k, a, x[0])] = x
            memory.append([label, n, k, a, r["way"], len(lists), r["passed"], *r["rss_at"],
                           r["rss"], r["hwm"]])  # fmt: skip
            print(f"({label}: nodes={n} in flight={k} assumed={a}: done)", file=sys.stderr,
                  flush=True)  # fmt: skip
    cols = ["path", "calls", "filter p50", "filter p99", "prio p50", "prio p99", "both p50",
            "both p99", "both max"]  # fmt: skip
    parts = [header("scheduler extender: filter + prioritize, 8 GPUs per node, extender in its "
                    "own process, before vs after")]  # fmt: skip
    for label, _, _ in trees[:-1]:
        parts += [table(["nodes", "in flight", "assumed", "path", "before both p50",
                         "after both p50", "ratio p50", "before both p99", "after both p99",
                         "ratio p99"], ratios(full, label)),  # fmt: skip
                  f"ms; before: {label}; ratio: before / after (above 1: after is faster); "
                  "cold: the first filter (every verdict made) and prioritize, one call each"]
    parts += [
        table(["tree", "nodes", "in flight", "assumed", *cols], timing),
        "ms per call; both: filter + prioritize of the same pod",
        table(["tree", "nodes", "in flight", "assumed", "in flight as", "LIST bodies",
               "nodes pass", "RSS after imports MiB", "+ cache MiB", "RSS after calls MiB",
               "peak RSS (VmHWM) MiB"], memory),  # fmt: skip
    ]
    nan = [float("nan")] * 9
    n, (k, a) = max(args.nodes), max(cases)
    after = full.get(("after", n, k, a, HTTP_ALL), nan)[7]
    for label, _, _ in trees[:-1]:
        before = full.get((label, n, k, a, HTTP_ALL), nan)[7]
        parts.append(f"{n:,} nodes, all names, {k:,} in flight + {a:,} assumed, HTTP: both "
                     f"p99 {before:.1f} ms before, {after:.1f} ms after: {before / after:.1f}x")  # fmt: skip
    peak = max((m[-1] for m in memory if m[0] == "after" and m[1] == n), default=float("nan"))
    verdict = "met" if after <= 10 else f"not met ({after / 10:.1f}x over)"
    parts.append(f"goal: filter + prioritize p99 <= 10 ms at {n:,} nodes, all names, "
                 f"{k:,} in flight + {a:,} assumed: {after:.1f} ms: {verdict}; "
                 f"peak RSS <= 100 MiB: {peak:.0f} MiB: {'met' if peak <= 100 else 'not met'}")  # fmt: skip
    cold = max(full.get(("after", n, kk, aa, COLD), nan)[2] for kk, aa in cases)
    cold_cpu = max(full.get(("after", n, kk, aa, COLD_CPU), nan)[2] for kk, aa in cases)
    verdict = "met" if cold <= 10 else f"not met ({cold / 10:.1f}x over)"
    parts.append(f"goal: cold first call (filter) <= 10 ms at {n:,} nodes, all names, worst "
                 f"case: {cold:.1f} ms ({cold_cpu:.1f} ms CPU): {verdict}")  # fmt: skip
    emit(*parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
