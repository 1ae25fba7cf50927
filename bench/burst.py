"""A burst of GPU pods on a real kube-scheduler (the dev cluster's release,
``devtools.devcluster.cluster.K8S_VERSION``: ``OMATICAYA_KUBERNETES_VERSION``): time to bound,
overcommit, and pods left Pending that had room, for the stock scheduler and the extender before
and after a change.

The cluster (``bench/burst_data.py``): ``--nodes`` Nodes x ``--gpus`` H100s, each GPU's free
memory drawn from the per-GPU free memory recorded in ``tests/data/h100-trace.json`` and
``multi-gpu-trace.json`` (seeded: the same cluster for every variant and run), written as the
agent would write them (``core.publish.render`` labels and the telemetry annotation, read now, fresh
for an hour); no agent and no kubelet run, so nothing the pods do shows in the telemetry: what
the extender holds for bound pods (``--settle-s`` 3600) is all that stops overcommit.

Variants, one after the other on the same kube-apiserver, each on a fresh copy of the cluster
(its own Nodes and namespace, deleted afterwards) with its own kube-scheduler
(``examples/scheduler/scheduler-config-v1.yaml`` of the extender's tree, read by
``tests.scheduler.scheduling_cluster_support.scheduler_config``, leader election off):

- ``stock``: no extender; pods in ``examples/scheduler/pod-affinity.yaml``'s form,
  ``gpu.memory.free-mib Gt <need - 1>`` and ``gpu.health In [Healthy]``;
- ``before``: ``omaticaya extender`` (its own process) from a ``git worktree`` of
  ``--before-rev``;
- ``after``: ``omaticaya extender`` from the working tree (or a worktree of ``--after-rev``);
  extender pods in ``examples/scheduler/pod-extender.yaml``'s form (``gpu-memory-mib``).

A warm-up pod (no GPU need) is bound and deleted first, so the scheduler and extender are
serving; then ``--pods`` pods of ``--pod-mib`` are created at once from ``--threads`` threads.
A watch records when each pod is first seen bound. The variant ends when every pod is bound, or
settled: no binding for ``--quiet-s`` and every Pending pod carries the scheduler's
Unschedulable condition (or at ``--timeout-s``).

Figures: ``time s``: first create to the last binding (every pod bound or settled Pending);
``nodes over``: nodes whose bound pods cannot all be placed on their GPUs within each GPU's
free memory (an exact packing check, ``burst_data.max_packed``); ``pods over``: the bound pods
no packing can hold; ``pending w/ room``: Pending pods that some node could still hold beside
its bound pods. Goal (issue 24): 0 over, 0 pending with room, ``after`` time <= 1.5x stock.

    .venv/bin/python bench/burst.py --before-rev <rev>      # 50 nodes x 8, 200 pods, ~1 min
    .venv/bin/python bench/burst.py --before-rev <rev> --nodes 20   # 215 slots: tight
    .venv/bin/python bench/burst.py --quick                  # 3 nodes x 8, 12 pods

A pod that fails the filter waits in kube-scheduler's unschedulable pool until a cluster event
moves it (any event, for a pod the extender turned down: it registers no queueing hints,
kubernetes#122019) or its flush (5 min; 60 s on 1.20): once the burst's bindings stop, one left
Pending with room waits for the next event or minutes, which is what ``pending w/ room`` counts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.burst_data import (  # noqa: E402
    TRACES,
    free_pool,
    max_packed,
    node_docs,
    node_frees,
    pending_with_room,
)
from bench.burst_procs import (  # noqa: E402
    Watched,
    start_extender,
    start_scheduler,
    watch_pods,
    worktree,  # noqa: E402
)
from bench.burst_procs import stop as stop_proc  # noqa: E402
from bench.common import ROOT, admin_api, cluster, delete_nodes, emit, header, table  # noqa: E402
from devtools.devcluster.cluster import K8S_VERSION  # noqa: E402


@dataclass
class Variant:
    key: str  # stock, before, after
    tree: Path | None  # the extender's source tree; None: no extender
    rev: str = ""


def pod_body(v: Variant, name: str, scheduler: str, mib: int | None) -> dict[str, Any]:
    """A pod in the example's form for this variant; ``mib`` None: no GPU need (warm-up)."""
    from tests.scheduler.scheduling_cluster_support import EXAMPLES, gpu_pod, load_pod

    if v.tree is not None:
        pod = gpu_pod(name, scheduler, mib or 0)
        if mib is None:
            del pod["metadata"]["annotations"]
        return pod
    pod = load_pod(EXAMPLES / "pod-affinity.yaml", name, schedulerName=scheduler)
    if mib is None:
        del pod["spec"]["affinity"]
    else:
        term = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = [str(mib - 1)]
    return pod


def run_variant(v: Variant, kubeconfig: str, frees: list[list[int]], args: argparse.Namespace,
                tmp: Path) -> dict[str, Any]:  # fmt: skip
    from tests.helpers import free_port as _free_port
    from tests.scheduler.scheduling_cluster_support import schedulable
    from tests.waiting import wait_for

    api = admin_api(kubeconfig)
    api.api_client.configuration.connection_pool_maxsize = args.threads
    group = f"burst-{v.key}-{os.getpid()}"
    names = [f"{group}-{i:03d}" for i in range(len(frees))]
    ext = sched = None
    stop = threading.Event()
    try:
        for doc in node_docs(names, frees, group):
            api.create_node(doc)
            schedulable(api, doc["metadata"]["name"])
        api.create_namespace({"metadata": {"name": group}})
        api.create_namespaced_service_account(group, {"metadata": {"name": "default"}})
        port = _free_port() if v.tree is not None else None
        if port is not None:
            ext = start_extender(v.tree, kubeconfig, group, port, args.strategy, tmp)
        sched = start_scheduler(kubeconfig, group, port, v.tree or ROOT, tmp)
        api.create_namespaced_pod(group, pod_body(v, "warm-up", group, None))
        wait_for("the warm-up pod to bind",
                 lambda: api.read_namespaced_pod("warm-up", group).spec.node_name, 60)  # fmt: skip
        api.delete_namespaced_pod("warm-up", group, grace_period_seconds=0)
        wait_for("the warm-up pod to go", lambda: not api.list_namespaced_pod(group).items, 30)
        seen = Watched()
        rv = api.list_namespaced_pod(group).metadata.resource_version
        watcher = threading.Thread(target=watch_pods, args=(kubeconfig, group, rv, seen, stop),
                                   daemon=True)  # fmt: skip
        watcher.start()
        bodies = [pod_body(v, f"gpu-{i:04d}", group, args.pod_mib) for i in range(args.pods)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda b: api.create_namespaced_pod(group, b), bodies))
        created = time.monotonic()
        pods = {b["metadata"]["name"] for b in bodies}
        settled = False
        while time.monotonic() - t0 < args.timeout_s:
            with seen.lock:
                bound, reason = dict(seen.bound_at), dict(seen.reason)
            quiet = time.monotonic() - max([created, *bound.values()])
            if len(bound) == len(pods) or (
                quiet >= args.quiet_s and all(p in bound or p in reason for p in pods)
            ):
                settled = True
                break
            time.sleep(0.2)
        stop.set()
        return judge(api, group, names, frees, args.pod_mib, t0, created, bound, reason, settled)
    finally:
        stop.set()
        stop_proc(sched)
        stop_proc(ext)
        with contextlib.suppress(Exception):
            api.delete_collection_namespaced_pod(group, grace_period_seconds=0)
            api.delete_namespace(group)
        delete_nodes(api, group)
        api.api_client.close()


def judge(api: Any, ns: str, names: list[str], frees: list[list[int]], mib: int, t0: float,
          created: float, bound_at: dict[str, float], reason: dict[str, str],
          settled: bool) -> dict[str, Any]:  # fmt: skip
    """The figures, from a LIST after the end (who is bound where) and the watch's times."""
    free_of = dict(zip(names, frees, strict=True))
    on: dict[str, list[int]] = {}
    pending = []
    for p in api.list_namespaced_pod(ns).items:
        if p.spec.node_name:
            on.setdefault(p.spec.node_name, []).append(mib)
        else:
            pending.append(p.metadata.name)
    packed = {n: max_packed(free_of[n], needs) for n, needs in on.items()}
    why = Counter(_short(reason.get(p, "(no reason yet)")) for p in pending)
    return {
        "create_s": created - t0,
        "time_s": (max(bound_at.values()) - t0) if bound_at else float("nan"),
        "bound": sum(len(v) for v in on.values()),
        "pending": len(pending),
        "nodes_over": sum(packed[n] < len(on[n]) for n in on),
        "pods_over": sum(len(on[n]) - packed[n] for n in on),
        "pending_room": pending_with_room(free_of, on, [mib] * len(pending)),
        "settled": "yes" if settled else "timeout",
        "why": why.most_common(2),
    }


def _short(message: str) -> str:
    """The scheduler's message without its ``0/N nodes are available:`` head, up to the first
    colon of the first reason (``50 node(s) had room taken by in-flight pods``)."""
    return message.split(": ", 1)[-1].split(":", 1)[0][:90]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--pod-mib", type=int, default=30720)
    ap.add_argument("--before-rev", default="HEAD", help="the extender 'before' (a git rev)")
    ap.add_argument("--after-rev", help="the extender 'after' (default: the working tree)")
    ap.add_argument("--variants", nargs="+", default=["stock", "before", "after"],
                    choices=["stock", "before", "after"])  # fmt: skip
    ap.add_argument("--strategy", default="binpack", choices=["binpack", "spread"])
    ap.add_argument("--threads", type=int, default=16, help="threads creating the pods")
    ap.add_argument("--quiet-s", type=float, default=10, help="no binding this long: settled")
    ap.add_argument("--timeout-s", type=float, default=180, help="per variant, from 1st create")
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--kubeconfig", help="an API server to use (default: start a dev cluster)")
    ap.add_argument("--quick", action="store_true", help="3 nodes, 12 pods, quiet 3 s")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.quiet_s = 3, 12, 3

    frees = node_frees(args.nodes, args.gpus, free_pool(), args.seed)
    slots = sum(f // args.pod_mib for node in frees for f in node)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    rows, results, failed = [], {}, {}
    with (
        tempfile.TemporaryDirectory(prefix="omaticaya-burst-") as d,
        cluster(args.kubeconfig) as cl,
    ):
        tmp = Path(d)
        trees: list[Path] = []
        try:
            variants = []
            for key in args.variants:
                rev = {"before": args.before_rev, "after": args.after_rev}.get(key)
                if rev:
                    path, sha = worktree(rev, tmp, key)
                    trees.append(path)
                    variants.append(Variant(key, path, sha[:10]))
                elif key == "after":
                    variants.append(Variant(key, ROOT, f"{head[:10]} + working tree"))
                else:
                    variants.append(Variant(key, None))
            for v in variants:
                print(f"(running {v.key} ...)", file=sys.stderr, flush=True)
                try:
                    results[v.key] = r = run_variant(v, cl.kubeconfig, frees, args, tmp)
                except Exception as exc:  # noqa: BLE001 - the other variants still run and print
                    failed[v.key] = f"{type(exc).__name__}: {exc}"
                    rows.append([v.key, v.rev or "-", *"----", "failed", *"---"])
                    continue
                rows.append([v.key, v.rev or "-", r["bound"], r["pending"], r["time_s"],
                             r["create_s"], r["settled"], r["nodes_over"], r["pods_over"],
                             r["pending_room"]])  # fmt: skip
        finally:
            for path in trees:
                subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                               check=False, capture_output=True)  # fmt: skip
    base = results.get("stock", {}).get("time_s")
    lines = [f"cluster: {args.nodes} nodes x {args.gpus} GPUs, free MiB per GPU drawn from "
             f"{', '.join(p.name for p in TRACES)} (seed {args.seed}): {slots} slots of "
             f"{args.pod_mib} MiB for {args.pods} pods, created from {args.threads} threads; "
             f"extender strategy {args.strategy}, quiet {args.quiet_s:g} s"]  # fmt: skip
    for key, r in results.items():
        ratio = f", {r['time_s'] / base:.2f}x stock" if base and key != "stock" else ""
        why = "; ".join(f"{n} x '{msg}'" for msg, n in r["why"]) or "none"
        lines.append(f"{key}: time to bound {r['time_s']:.1f} s{ratio}; Pending: {why}")
    lines += [f"{key}: FAILED: {why}" for key, why in failed.items()]
    after = results.get("after")
    if after and base:
        met = (after["pods_over"] == 0 and after["pending_room"] == 0
               and after["time_s"] <= 1.5 * base)  # fmt: skip
        lines.append(f"goal (0 over, 0 pending with room, time <= 1.5x stock): "
                     f"{'met' if met else 'NOT met'} by after")  # fmt: skip
    emit(
        header(f"scheduler burst: kube-scheduler {K8S_VERSION}, stock vs extender before/after"),
        "\n".join(lines[:1]),
        table(
            [
                "variant",
                "rev",
                "bound",
                "pending",
                "time s",
                "create s",
                "settled",
                "nodes over",
                "pods over",
                "pending w/ room",
            ],
            rows,
        ),  # fmt: skip
        "\n".join(lines[1:]),
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
