"""The demo: `omaticaya run` over the recorded H100 trace, labelling a Node on a real API server.

Starts the dev cluster (scripts/dev-cluster, its own state dir), creates the Node `gpu-node-1`
with a few labels of other owners, runs the agent (schedule @every 1s) while the trace plays
(idle -> 30 GiB allocated -> busy at 100% -> small and busy -> released), and prints the Node's
labels every two seconds the way `kubectl get nodes -L ...` would, then `--show-labels` once,
then stops the agent with SIGTERM and shows what the graceful exit left.

Usage: scripts/demo [--keep]   (--keep leaves the dev cluster running; `scripts/dev-cluster down`
with OMATICAYA_DEV_DIR=/tmp/omaticaya-demo stops it)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "h100-trace.json"
STATE = Path(os.environ.get("OMATICAYA_DEMO_DIR", "/tmp/omaticaya-demo"))
NODE = "gpu-node-1"
P = "omaticaya.io/"
COLUMNS = [
    ("HEALTH", "gpu.health"),
    ("GPUS", "gpu.count"),
    ("FREE-MIB", "gpu.memory.free-mib"),
    ("UTIL-PCT", "gpu.utilization-pct"),
    ("IDLE", "gpu.idle-count"),
    ("TEMP-C", "gpu-0.temperature-c"),
]


def dev_cluster(*args: str) -> str:
    env = dict(os.environ, OMATICAYA_DEV_DIR=str(STATE))
    out = subprocess.run(
        [str(ROOT / "scripts" / "dev-cluster"), *args],
        env=env, check=True, stdout=subprocess.PIPE, text=True,
    )
    return out.stdout


def main() -> int:
    keep = "--keep" in sys.argv[1:]
    out = dev_cluster("up")
    kubeconfig = re.search(r"export KUBECONFIG=(\S+)", out).group(1)  # type: ignore[union-attr]
    print(f"\n$ export KUBECONFIG={kubeconfig}")

    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    api = client.CoreV1Api(client.ApiClient(cfg))
    try:
        api.delete_node(NODE)
    except ApiException:
        pass
    api.create_node(
        {
            "metadata": {
                "name": NODE,
                "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true"},
            }
        }
    )
    print(f"$ kubectl create node {NODE}   (labels: nvidia.com/gpu.present=true)")

    phases = json.loads(TRACE.read_text())["phases"]

    def phase_at(t: float) -> str:
        name = "start"
        for p in phases:
            if t >= p["t"]:
                name = p["phase"]
        return name

    env = dict(
        os.environ,
        KUBECONFIG=kubeconfig,
        NODE_NAME=NODE,
        OMATICAYA_TRACE=str(TRACE),
        OMATICAYA_SCHEDULE="@every 1s",
        # the trace's phases last seconds: no write budget (30 s by default), so that each one
        # reaches the Node; the TEMP-C column is an opt-in label
        OMATICAYA_MIN_PATCH_INTERVAL_S="0",
        OMATICAYA_TEMPERATURE_LABELS="true",
        OMATICAYA_METRICS_PORT="0",
        OMATICAYA_LOG_LEVEL="WARNING",
    )
    cmd = [sys.executable, "-m", "omaticaya_py", "run"]
    print("$ NODE_NAME=gpu-node-1 OMATICAYA_TRACE=tests/data/h100-trace.json "
          "OMATICAYA_SCHEDULE='@every 1s' OMATICAYA_MIN_PATCH_INTERVAL_S=0 "
          "OMATICAYA_TEMPERATURE_LABELS=true omaticaya run &\n")
    agent = subprocess.Popen(cmd, env=env, cwd=ROOT)
    start = time.monotonic()
    cols = ",".join(P + key for _, key in COLUMNS)
    print(f"$ kubectl get node {NODE} -L {cols}   (every 2 s, with the trace's phase)\n")
    header = f"{'T':>5}  {'PHASE':<17} {'NAME':<11}" + "".join(f" {h:>9}" for h, _ in COLUMNS)
    print(header)
    try:
        while (t := time.monotonic() - start) < 27.0:
            time.sleep(2.0 - (t % 2.0))
            t = time.monotonic() - start
            labels = api.read_node(NODE).metadata.labels or {}
            row = "".join(f" {labels.get(P + key, '<none>'):>9}" for _, key in COLUMNS)
            print(f"{t:5.1f}  {phase_at(t):<17} {NODE:<11}{row}", flush=True)
        labels = api.read_node(NODE).metadata.labels or {}
        print(f"\n$ kubectl get node {NODE} --show-labels")
        print(f"{'NAME':<11} LABELS")
        print(f"{NODE:<11} " + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(timeout=30)
    labels = api.read_node(NODE).metadata.labels or {}
    print(f"\n$ kill -TERM <agent>   (exit status {code}); labels left on the Node:")
    for key, value in sorted(labels.items()):
        print(f"  {key}={value}")
    if keep:
        print(f"\ncluster left running: export KUBECONFIG={kubeconfig}")
    else:
        dev_cluster("down")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
