"""Footprint of the real daemon: ``omaticaya run`` as a subprocess over a trace, against a real
kube-apiserver: RSS, CPU share of one core, and start time to the first patch.

Runs (each ``--duration-s``, default 60 s, measured after the first patch):
- idle @ 5 s:    the trace's idle phase looping (a quiet GPU: the idle-CPU target);
- h100 @ 5 s:    the whole H100 trace looping (load changes every few seconds);
- h100 @ 1 s:    the same at a 1 s schedule.
The daemon runs as deployed: metrics server on (a free port), INFO logs to a pipe we drain.

Then ``--imports`` (on by default): what the RSS is made of, importing the agent's packages one
after the other in a fresh interpreter (RSS after each step, and the import time).

    .venv/bin/python bench/footprint.py              # ~4 min
    .venv/bin/python bench/footprint.py --quick      # one 5 s run + imports
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    admin_api,
    cluster,
    create_nodes,
    delete_nodes,
    emit,
    header,
    load_raw,
    phase_samples,
    proc_cpu_s,
    proc_rss_mib,
    table,
    write_trace,
)

TARGET_RSS_MIB = 60.0  # the issue says 60 MB; MiB is the stricter reading
TARGET_IDLE_CPU_PCT = 0.2
GROUP = f"footprint-{os.getpid()}"
OMATICAYA = ROOT / ".venv" / "bin" / "omaticaya"

IMPORT_STEPS = [
    ("python + stdlib the agent uses", "import json, ssl, threading, logging, datetime, argparse"),
    ("pydantic", "import pydantic"),
    ("pydantic_settings", "import pydantic_settings"),
    ("loguru", "import loguru"),
    ("tenacity", "import tenacity"),
    ("urllib3", "import urllib3"),
    ("prometheus_client", "import prometheus_client"),
    ("apscheduler (blocking scheduler)", "import apscheduler.schedulers.blocking"),
    ("pynvml", "import pynvml"),
    ("kubernetes.config", "import kubernetes.config"),
    ("kubernetes.client (all API classes and models)", "import kubernetes.client"),
    ("kubernetes (package: watch, dynamic, stream, utils...)", "import kubernetes"),
    ("grpc (device plugin)", "import grpc"),
    ("google.protobuf (device plugin)", "import google.protobuf"),
    ("watchdog.observers (device plugin)", "import watchdog.observers"),
    ("omaticaya_py.scheduler", "import omaticaya_py.scheduler"),
    ("omaticaya_py.deviceplugin", "import omaticaya_py.deviceplugin"),
    ("omaticaya_py (cli, agent, kube, nvml, metrics)",
     "import omaticaya_py.cli, omaticaya_py.agent, omaticaya_py.kube, omaticaya_py.sources.nvml, "
     "omaticaya_py.agent.metrics"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def import_table() -> str:
    """RSS after each import step in one fresh interpreter (so deltas are marginal costs)."""
    code = (
        "import time, json, sys\n"
        "def rss():\n"
        "    for l in open('/proc/self/status'):\n"
        "        if l.startswith('VmRSS:'): return int(l.split()[1]) / 1024\n"
        "out = [('start', rss(), 0.0)]\n"
        f"for name, stmt in {IMPORT_STEPS!r}:\n"
        "    t = time.perf_counter()\n"
        "    try: exec(stmt)\n"
        "    except Exception: t = float('nan')\n"
        "    t = time.perf_counter() - t\n"
        "    out.append((name, rss(), t))\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    steps = json.loads(proc.stdout)
    rows, prev = [], steps[0][1]
    for name, rss, took in steps:
        rows.append([name, rss, rss - prev, took * 1e3])
        prev = rss
    return table(["import step (cumulative)", "RSS MiB", "+MiB", "import ms"], rows)


def run_daemon(
    kubeconfig: str, api: Any, node: str, trace: Path, interval_s: float, duration_s: float
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_")}
    env.update(NODE_NAME=node, KUBECONFIG=kubeconfig)
    cmd = [
        str(OMATICAYA), "run", "--node", node, "--trace", str(trace),
        "--schedule", f"@every {interval_s:g}s", "--kubeconfig", kubeconfig,
        "--metrics-port", str(free_port()),
    ]
    t_spawn = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log: list[str] = []
    drain = threading.Thread(target=lambda: log.extend(proc.stdout or ()), daemon=True)
    drain.start()
    first_patch = float("nan")
    try:
        deadline = t_spawn + 30
        while time.perf_counter() < deadline and proc.poll() is None:
            labels = api.read_node(node).metadata.labels or {}
            if "omaticaya.io/gpu.health" in labels:
                first_patch = time.perf_counter() - t_spawn
                break
            time.sleep(0.02)
        if proc.poll() is not None:
            raise RuntimeError("omaticaya run exited early:\n" + "".join(log[-20:]))
        cpu0, t0 = proc_cpu_s(proc.pid), time.perf_counter()
        rss_max = 0.0
        while time.perf_counter() - t0 < duration_s and proc.poll() is None:
            rss_max = max(rss_max, proc_rss_mib(proc.pid)[0])
            time.sleep(0.5)
        cpu = proc_cpu_s(proc.pid) - cpu0
        wall = time.perf_counter() - t0
        rss, hwm = proc_rss_mib(proc.pid)
        total_cpu = proc_cpu_s(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    return {
        "first_patch_s": first_patch,
        "cpu_pct": 100 * cpu / wall,
        "rss": max(rss, rss_max),
        "hwm": hwm,
        "startup_cpu_s": total_cpu - cpu,
        "exit": rc,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one 5 s run (idle @ 5 s) + imports")
    ap.add_argument("--duration-s", type=float, default=60.0, help="measured seconds per run")
    ap.add_argument("--no-imports", action="store_true", help="skip the import table")
    ap.add_argument("--kubeconfig", help="reuse this API server (default $KUBECONFIG or a new one)")
    args = ap.parse_args(argv)
    raw = load_raw()
    idle = write_trace(phase_samples(raw, "idle"), "footprint-idle")
    h100 = ROOT / "tests" / "data" / "h100-trace.json"
    runs = [("idle", idle, 5.0), ("h100", h100, 5.0), ("h100", h100, 1.0)]
    if args.quick:
        runs, args.duration_s = runs[:1], min(args.duration_s, 5.0)
    rows, notes = [], []
    with cluster(args.kubeconfig) as c:
        api = admin_api(c.kubeconfig)
        try:
            for i, (name, trace, interval) in enumerate(runs):
                node = f"{GROUP}-{i}"
                create_nodes(api, [node], GROUP)
                r = run_daemon(c.kubeconfig, api, node, trace, interval, args.duration_s)
                rows.append([
                    f"{name} @ {interval:g} s", args.duration_s, r["first_patch_s"],
                    r["startup_cpu_s"], r["cpu_pct"], r["rss"], r["hwm"], r["exit"],
                ])
                if name == "idle" and interval == 5.0:
                    cpu_ok = r["cpu_pct"] <= TARGET_IDLE_CPU_PCT
                    notes.append(
                        f"target idle CPU @ 5 s <= {TARGET_IDLE_CPU_PCT}% of a core: "
                        f"{r['cpu_pct']:.3f}% -> {'met' if cpu_ok else 'missed'}"
                    )
                rss_ok = r["hwm"] <= TARGET_RSS_MIB
                notes.append(
                    f"target RSS <= {TARGET_RSS_MIB:g} MiB ({name} @ {interval:g} s): peak "
                    f"{r['hwm']:.1f} MiB -> "
                    + ("met" if rss_ok else f"missed by {r['hwm'] - TARGET_RSS_MIB:.1f} MiB")
                )
        finally:
            delete_nodes(api, GROUP)
            api.api_client.close()
    parts = [
        header("footprint of `omaticaya run` (subprocess, trace replay, real kube-apiserver)"),
        table(
            ["run", "measured s", "spawn -> 1st patch s", "startup CPU s", "CPU % of a core",
             "RSS MiB", "peak RSS MiB", "exit"],
            rows,
        ),
        "\n".join(notes),
    ]
    if not args.no_imports:
        parts.append(import_table())
    emit(*parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
