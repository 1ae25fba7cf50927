"""Readings per minute while the API server accepts and never answers (issue 23, item 5).

Two agents tick side by side at ``@every 1s`` against one "black hole" API server: a socket
that listens (the kernel completes each TCP handshake) and never reads or answers, as a hung
kube-apiserver or a dead load balancer does. Both hold a Lease (as the chart's agents do) and
use the chart's request timeout (10 s) and the edge's retries, so each API call takes
4 attempts x 10 s:

- before: the API work inline in the tick (``Agent.safe_tick``, the daemon's job until issue
  23): the next reading waits for the Lease renewal and the Node write to give up;
- after: the daemon's wiring (``agent.daemon.Daemon.schedule_ticks``): the tick reads, caches and
  tells the device plugin, and the writer thread takes the API work (latest reading wins).

A reading counts when the agent hands it to its listeners (the device plugin), which both do
before any API request. No cluster is needed.

    .venv/bin/python bench/outage.py               # 60 s
    .venv/bin/python bench/outage.py --seconds 10  # smoke
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from datetime import timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import H100_TRACE, bench_settings, emit, header, table  # noqa: E402


def black_hole() -> tuple[socket.socket, str]:
    """A listening socket that is never accepted from, and its kubeconfig (a temp file)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    kubeconfig = Path(tempfile.mkdtemp(prefix="omaticaya-outage-")) / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "hole",
        "clusters": [{"name": "hole", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "hole", "context": {"cluster": "hole", "user": "u"}}],
    }))  # fmt: skip
    return sock, str(kubeconfig)


def start_agent(mode: str, kubeconfig: str, timeout_s: float) -> tuple[Any, Any, list[float]]:
    """(agent, scheduler, reading times) for ``mode`` ``before`` or ``after``, started."""
    from apscheduler.schedulers.background import BackgroundScheduler

    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.agent.daemon import Daemon
    from omaticaya_py.kube import NodeClient
    from omaticaya_py.sources.replay import TraceReader

    settings = bench_settings(node_name=f"bench-{mode}", schedule="@every 1s", kube_timeout_s=timeout_s)
    client = NodeClient(settings.node_name, kubeconfig=kubeconfig, timeout_s=timeout_s)
    agent = Agent(
        settings, TraceReader(H100_TRACE),
        NodeApi(client, environ={"POD_NAMESPACE": "omaticaya", "POD_NAME": f"agent-{mode}"}),
    )  # fmt: skip
    readings: list[float] = []
    agent.on_tick.append(lambda _result: readings.append(time.monotonic()))
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    if mode == "after":
        Daemon(agent).schedule_ticks(scheduler)
    else:
        scheduler.add_job(
            agent.safe_tick, settings.schedule.trigger(), id="tick", coalesce=True,
            max_instances=1, misfire_grace_time=None,
        )  # fmt: skip
    scheduler.start()
    return agent, scheduler, readings


def run(seconds: float, timeout_s: float) -> str:
    sock, kubeconfig = black_hole()
    started = {mode: start_agent(mode, kubeconfig, timeout_s) for mode in ("before", "after")}
    t0 = time.monotonic()  # the API server hangs from the start: the outage is the whole run
    threading.Event().wait(seconds)
    rows = []
    for mode, (agent, scheduler, readings) in started.items():
        inside = [t for t in readings if t0 <= t <= t0 + seconds]
        n = len(inside)
        edges = [t0, *inside, t0 + seconds]  # the outage's start and end count as edges
        gaps = [b - a for a, b in zip(edges, edges[1:], strict=False)]
        rows.append([
            {"before": "before: API work inline in the tick",
             "after": "after: API work on the writer thread"}[mode],
            n, n * 60.0 / seconds, max(gaps), agent.cache.writes_superseded,
        ])  # fmt: skip
        scheduler.shutdown(wait=False)
        if agent.daemon is not None:  # "after": the writer thread and the watchdog
            agent.daemon.stop()
            agent.daemon.watchdog.stop()
    sock.close()
    return table(
        ["agent (@every 1s, API accepts and never answers)", "readings", "per minute",
         "longest gap s", "writes superseded"],
        rows,
    ) + (
        f"\n\n{seconds:g} s of outage; request timeout {timeout_s:g} s, the edge's retries "
        "(4 attempts per call), a Lease and a Node write per round"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the outage lasts")
    ap.add_argument("--timeout-s", type=float, default=10.0, help="one API request's timeout")
    args = ap.parse_args(argv)
    import logging

    from loguru import logger

    logger.remove()  # the outage's error lines are not the measure
    logging.getLogger("apscheduler").setLevel(logging.ERROR)  # "skipped: maximum ... instances"
    emit(header("readings per minute during an API outage (black-hole API server)"),
         run(args.seconds, args.timeout_s))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
