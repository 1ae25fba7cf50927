"""Scheduler extender latency: filter + prioritize at N nodes with K pods in flight, and its RSS.

Each (nodes, pods in flight) case runs a fresh extender process (``multiprocessing`` spawn: an
interpreter of its own, so that its RSS is the extender's alone). It holds what
``scheduler.server.serve`` holds: the Node cache (each Node parsed as the server's ``transform``
does: ``parse_node``, ``with_signal``, ``with_policy``), the in-flight placements
(``placements.InFlight`` over a pod cache, wired to ``Extender.placements``/``assume`` as the
server wires them) and the Starlette app behind ``serving.HttpServer`` (uvicorn) on 127.0.0.1.
The Nodes carry what the agent renders (``core.render`` and the telemetry annotation, 8 H100s
each, random free memory); the placements are built directly, spread evenly over the nodes,
30 GiB each, none yet in its node's telemetry. The extender's clock is frozen when its cache is
built, so nothing settles or goes stale during a run.

Timed per call (milliseconds, p50 / p99 / max, per verb and for both verbs of one pod):

- ``pure``: ``Extender.filter`` + ``prioritize`` in the extender process, no HTTP;
- ``HTTP``: POST /filter and /prioritize from this process over one keep-alive connection,
  ``NodeNames`` (``nodeCacheCapable: true``, the shipped configuration), JSON both ways;
  "names" says how many: all of them (``percentageOfNodesToScore: 100``) or the share that
  kube-scheduler 1.20 sends by default (it stops its own filtering after
  ``max(100, N * max(5, 50 - N/125) %)`` feasible nodes: 420 of 1,000, 500 of 5,000).
  ``as shipped``: ``serving.HttpServer`` as it is; ``+NODELAY``: the same app on a second
  socket created as ``IPPROTO_TCP`` (``nodelay_bind``), the fix proposed for the ~40 ms that
  Nagle's algorithm and the client's delayed ACK add to every small response;
- ``HTTP, whole Nodes``: v1.Node objects (``nodeCacheCapable: false``), for comparison, at the
  smallest size and no pod in flight only.

RSS (MiB, /proc/<pid>/status of the extender process): after its imports, with the cache
built (the LIST body parsed and freed), the same after ``malloc_trim``, after the calls
(VmRSS) and the peak (VmHWM). The "assumed" table: pods that passed the filter on every node
and are not yet seen bound (``InFlight.assume``), at the largest size, with fewer calls.

Goal (issue 15): p99 under 10 ms at 5,000 nodes.

    .venv/bin/python bench/extender.py                          # 1,000 and 5,000 nodes, ~6 min
    .venv/bin/python bench/extender.py --nodes 1000 --calls 300 --inflight 0
    .venv/bin/python bench/extender.py --quick                  # 100 nodes, 30 calls
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import http.client
import json
import multiprocessing as mp
import os
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_settings, emit, header, pct, proc_rss_mib, table  # noqa: E402
from bench.extender_data import POD_MIB, PodCacheStub, node_docs, pod_doc  # noqa: E402


def default_share(n: int) -> int:
    """Nodes kube-scheduler 1.20 hands to extenders by default (``numFeasibleNodesToFind``)."""
    if n < 100:
        return n
    return max(100, n * max(5, 50 - n // 125) // 100)


def time_calls(fn: Any, calls: int) -> list[float]:
    for _ in range(min(10, calls)):  # warm-up
        fn()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def serve_extender(conn: Any, nodes: int, inflight: int, assumed: int, calls: int) -> None:
    """The extender process: cache, placements, pure timings, then HTTP until told to stop."""
    import omaticaya_py.kube  # noqa: F401 - the Node, pod and Lease caches' client
    from omaticaya_py import serving
    from omaticaya_py.logs import setup_logging
    from omaticaya_py.scheduler import Extender, ExtenderSettings, create_app, parse_node
    from omaticaya_py.scheduler.inflight import Placement
    from omaticaya_py.scheduler.placements import InFlight
    from omaticaya_py.scheduler.server import serve  # noqa: F401 - its imports, as in production
    from omaticaya_py.scheduler.signal import with_signal
    from omaticaya_py.scheduler.staleness import with_policy
    from omaticaya_py.serving import HttpServer

    setup_logging("INFO")
    pid = os.getpid()
    rss_imports = proc_rss_mib(pid)[0]
    settings = ExtenderSettings(_env_file=None, port=8888)  # type: ignore[call-arg]
    prefix, now = settings.prefix, time.time()
    body = json.dumps({"kind": "NodeList", "items": node_docs(nodes, now)}).encode()  # the LIST
    cache = {}
    for d in json.loads(body)["items"]:
        m = d["metadata"]
        state = parse_node(m["name"], m["labels"], m["annotations"], prefix)
        cache[m["name"]] = with_policy(with_signal(state, settings.signal), m["annotations"], prefix)
    del body, d, m
    gc.collect()
    rss_cache = proc_rss_mib(pid)[0]  # the cache, and what the freed LIST left mapped
    with contextlib.suppress(OSError, AttributeError):  # glibc: hand freed arenas back
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss_trimmed = proc_rss_mib(pid)[0]
    names = list(cache)
    rng = random.Random(11)
    placed = {}
    for j in range(inflight):
        node = names[j * len(names) // inflight]
        uid = f"inflight-{j:06d}"
        placed[uid] = Placement(f"default/p{j}", uid, node, POD_MIB, 1,
                                placed_at=now - rng.uniform(0, 30),
                                baseline_free_mib=cache[node].free_total_mib)  # fmt: skip
    flights = InFlight(PodCacheStub(placed), assume_s=86400)
    ext = Extender(settings, cache.get, clock=lambda: now)
    ext.placements, ext.assume = flights.for_node, flights.assume
    for j in range(assumed):
        flights.assume(f"assumed-{j:06d}", f"default/a{j}", POD_MIB, 1, names, now)
    args = {"Pod": pod_doc(prefix), "Nodes": None, "NodeNames": names}
    passed = len(ext.filter(args)["NodeNames"])
    pure = (time_calls(lambda: ext.filter(args), calls),
            time_calls(lambda: ext.prioritize(args), calls))  # fmt: skip
    shipped = HttpServer(create_app(ext), "127.0.0.1", 0).start()
    serving.bind = nodelay_bind  # the proposed fix, in this process only
    fixed = HttpServer(create_app(ext), "127.0.0.1", 0).start()
    conn.send({"ports": (shipped.port, fixed.port), "pure": pure, "passed": passed,
               "rss": (rss_imports, rss_cache, rss_trimmed),
               "assumed_seen": flights.assumed()})  # fmt: skip
    conn.recv()  # stop
    shipped.shutdown()
    fixed.shutdown()


def nodelay_bind(address: str, port: int) -> socket.socket:
    """``serving.bind`` with the socket created as ``IPPROTO_TCP``: asyncio then sets
    ``TCP_NODELAY`` on every accepted connection (it skips sockets whose ``proto`` is 0, which
    ``socket.create_server`` gives), so a response's headers and body are not held apart by
    Nagle's algorithm waiting for the client's delayed ACK (~40 ms on Linux)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen()
    sock.setblocking(False)
    return sock


def row(path: str, calls: int, ft: list[float], pt: list[float]) -> list[Any]:
    """p50/p99 of each verb, of their sum per pod, and the largest sum, ms."""
    both = [a + b for a, b in zip(ft, pt, strict=True)]
    return [path, calls, pct(ft, 50), pct(ft, 99), pct(pt, 50), pct(pt, 99), pct(both, 50),
            pct(both, 99), max(both)]  # fmt: skip


def http_row(port: int, path: str, args: dict[str, Any], calls: int) -> list[Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def post(verb: str, body: bytes) -> bytes:
        conn.request("POST", f"/{verb}", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, (resp.status, data[:200])
        return data

    body = json.dumps(args).encode()  # the scheduler's encoding: not the extender's cost
    ft = time_calls(lambda: post("filter", body), calls)
    pt = time_calls(lambda: post("prioritize", body), calls)
    conn.close()
    return row(path, calls, ft, pt)


def run_case(
    nodes: int, inflight: int, assumed: int, calls: int, whole: bool, full: bool = True
) -> dict[str, Any]:
    """One extender process: its timings (rows) and RSS. ``full``: every HTTP variant; else
    +NODELAY with all names only."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve_extender, args=(child, nodes, inflight, assumed, calls))
    proc.start()
    try:
        got = parent.recv()
        shipped, fixed = got["ports"]
        rows = [row("pure (no HTTP)", calls, *got["pure"])]
        names = [f"gpu-node-{i:05d}" for i in range(nodes)]
        pod = pod_doc(bench_settings().prefix)
        for kind, port in (("as shipped", shipped), ("+NODELAY", fixed))[0 if full else 1 :]:
            for share in sorted({nodes, default_share(nodes) if full else nodes}, reverse=True):
                args = {"Pod": pod, "Nodes": None, "NodeNames": names[:share]}
                rows.append(http_row(port, f"HTTP {kind}, {share} names", args, calls))
        if whole:
            items = node_docs(nodes, time.time())
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
            rows.append(http_row(fixed, "HTTP +NODELAY, whole Nodes", args, max(10, calls // 10)))
        rss, hwm = proc_rss_mib(proc.pid)
        parent.send("stop")
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
    return {"rows": rows, "passed": got["passed"], "rss": rss, "hwm": hwm,
            "rss_at": got["rss"], "assumed": got["assumed_seen"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", help="cluster sizes (default 1000 5000)")
    ap.add_argument("--inflight", type=int, nargs="+",
                    help="pods in flight (placed, not yet in telemetry), spread over the nodes "
                    "(default 0 100 1000)")  # fmt: skip
    ap.add_argument("--assumed", type=int, nargs="*",
                    help="pods passed and not yet seen bound, at the largest size (default 10 "
                    "100; none: skip)")  # fmt: skip
    ap.add_argument("--calls", type=int, help="timed calls per verb and case (default 100)")
    ap.add_argument("--quick", action="store_true", help="100 nodes, 30 calls (smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.calls = args.nodes or [100], args.calls or 30
        args.inflight = args.inflight or [0, 100]
        args.assumed = [5] if args.assumed is None else args.assumed
    args.nodes, args.calls = args.nodes or [1000, 5000], args.calls or 100
    args.inflight = args.inflight or [0, 100, 1000]
    args.assumed = [10, 100] if args.assumed is None else args.assumed
    timing, memory = [], []
    smallest = min(args.nodes)
    for n in args.nodes:
        for k in args.inflight:
            r = run_case(n, k, 0, args.calls, whole=n == smallest and k == 0 and n <= 1000)
            timing += [[n, k, *row] for row in r["rows"]]
            memory.append([n, k, r["passed"], *r["rss_at"], r["rss"], r["hwm"]])
            print(f"(nodes={n} in flight={k}: done)", file=sys.stderr, flush=True)
    cols = ["path", "calls", "filter p50", "filter p99", "prio p50", "prio p99", "both p50",
            "both p99", "both max"]  # fmt: skip
    parts = [
        header("scheduler extender: filter + prioritize, 8 GPUs per node, "
               f"{args.calls} calls per verb and case, extender in its own process"),  # fmt: skip
        table(["nodes", "in flight", *cols], timing),
        "ms per call; both: filter + prioritize of the same pod",
        table(["nodes", "in flight", "nodes pass", "RSS after imports MiB", "+ cache MiB",
               "after malloc_trim MiB", "RSS after calls MiB", "peak RSS (VmHWM) MiB"],
              memory),  # fmt: skip
        "+ cache: the Nodes parsed from one LIST body, the body freed (glibc may keep freed "
        "memory mapped: malloc_trim hands it back; the extender itself never calls it)",
    ]
    biggest = max(args.nodes)
    for kind in ("as shipped", "+NODELAY"):
        p99 = max((r[9] for r in timing if r[0] == biggest
                   and r[2] == f"HTTP {kind}, {biggest} names"), default=float("nan"))  # fmt: skip
        verdict = "met" if p99 < 10 else f"not met ({p99 / 10:.1f}x over)"
        parts.append(f"goal: filter + prioritize p99 < 10 ms at {biggest:,} nodes, HTTP {kind}, "
                     f"all names, worst in-flight case: {p99:.1f} ms: {verdict}")  # fmt: skip
    emit(*parts)
    assumed_rows, calls = [], max(5, args.calls // 10)
    for a in args.assumed:  # each call is slow (docs/benchmarks.md section 7): fewer calls
        r = run_case(biggest, 0, a, calls, whole=False, full=False)
        assumed_rows += [[biggest, a, *x] for x in r["rows"]]
    if assumed_rows:
        emit("", table(["nodes", "assumed", *cols], assumed_rows),
             "assumed: pods that passed the filter on every node, not yet seen bound")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
