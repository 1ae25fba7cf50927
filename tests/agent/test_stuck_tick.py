"""A tick that never returns fails /healthz and is said once in the log (issue 23, item 4).

A reader whose ``read()`` blocks on an Event stands for a hung NVML call: the real agent, a real
``BackgroundScheduler`` wired as the daemon wires it, and the real HTTP server answer
``/healthz``. The rule itself (``SnapshotCache.tick_overdue``, ``Watchdog.check_stuck``,
``metrics.liveness``) is also driven with a hand-set clock."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import timezone

from apscheduler.schedulers.background import BackgroundScheduler

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.agent.metrics import liveness, serve
from omaticaya_py.agent.watchdog import Watchdog
from omaticaya_py.sources.replay import TraceReader
from tests.agent.stuck_tick_support import (  # the names moved out, for this file's tests
    BlockingReader,  # noqa: F401
    log_lines,  # noqa: F401
)
from tests.helpers import H100_TRACE, Clock, settings
from tests.waiting import wait_for


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_blocked_read_fails_healthz_and_is_logged_once(log_lines) -> None:
    reader = BlockingReader()
    agent = Agent(
        settings(node_name="n1", schedule="@every 0.2s", stuck_tick_periods=3),
        reader, NodeApi(None, dry_run=True),
    )  # fmt: skip
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    daemon = Daemon(agent)
    watchdog = daemon.schedule_ticks(scheduler)
    scheduler.start()
    server = serve(agent, "127.0.0.1", 0)
    try:
        wait_for("/healthz 200 after a tick", lambda: agent.cache.ticks and healthz(server.port)[0] == 200)
        reader.blocked.set()
        assert reader.entered.wait(20)
        status, body = wait_for("/healthz 503", lambda: (s := healthz(server.port))[0] == 503 and s)
        assert "stuck in 'read'" in body
        wait_for("the stuck line", lambda: any("tick stuck" in x for x in log_lines))
        ticks = agent.cache.ticks
        reader.blocked.clear()
        reader.gate.set()
        wait_for("/healthz 200 again", lambda: healthz(server.port)[0] == 200)
        wait_for("the recovery line", lambda: any("no longer stuck" in x for x in log_lines))
        wait_for("ticks again", lambda: agent.cache.ticks > ticks + 2)
        stuck = [x for x in log_lines if "tick stuck" in x]
        assert len(stuck) == 1, stuck
        assert "stage 'read' since" in stuck[0]
        assert sum("no longer stuck" in x for x in log_lines) == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert "omaticaya_last_tick_age_seconds" in r.read().decode()
    finally:
        reader.gate.set()
        server.shutdown()
        watchdog.stop()
        daemon.stop()


def test_the_stuck_rule_on_a_hand_driven_clock(log_lines) -> None:
    clock = Clock(100.0)
    s = settings(node_name="n1", schedule="@every 10s", stuck_tick_periods=3, jitter_s=5)
    agent = Agent(s, TraceReader(H100_TRACE), NodeApi(None, dry_run=True), clock=clock)

    class Running:
        running = True

    Daemon(agent).scheduler = Running()  # the probe reads it through agent.daemon
    watchdog = Watchdog(agent)
    assert agent.cache.stuck_after_s == 35.0  # 3 periods of 10 s, plus the 5 s jitter
    table = [
        # (seconds since start, a tick finished at that moment?, healthy, stuck line count)
        (0.0, True, True, 0),
        (35.0, False, True, 0),  # exactly the bound: still alive
        (35.5, False, False, 1),
        (60.0, False, False, 1),  # said once
        (61.0, True, True, 1),
        (200.0, False, False, 2),  # a second episode: said again
    ]
    for at_s, ticked, healthy, said in table:
        clock.t = 100.0 + at_s
        if ticked:
            agent.cache.stage("read")
            agent.cache.stage(None)
        watchdog.check_stuck()
        assert liveness(agent.daemon, agent.cache)[0] is healthy, at_s
        assert sum("tick stuck" in x for x in log_lines) == said, at_s
    assert sum("no longer stuck" in x for x in log_lines) == 1
    assert liveness(agent.daemon, agent.cache)[1] == "no tick finished for 139s (none running)"
