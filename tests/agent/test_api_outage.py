"""An API server that accepts and never answers does not slow the reading (issue 23, item 5).

The agent talks to the real kube-apiserver through ``tests/faultproxy.py``; ``stall()`` makes
the proxy accept every request and never answer it. The agent runs as the daemon runs it (a
real ``BackgroundScheduler``, ``agent.daemon.Daemon.schedule_ticks``): while the Node write (or the
Lease renewal) is held, readings keep coming on the schedule; once the proxy heals, the Node
converges to the latest reading."""

from __future__ import annotations

from datetime import timezone

import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.kube import NodeClient
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import node_metadata
from tests.faultproxy import FaultProxy
from tests.helpers import H100_TRACE, settings
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
P = "omaticaya.io/"
FREE = P + "gpu.memory.free-mib"


def test_readings_keep_the_schedule_while_the_api_hangs(dev_cluster, admin_api, make_node, tmp_path):
    node = make_node()
    proxy = FaultProxy(dev_cluster)
    # one held request lasts 30 s (the timeout), far longer than the readings counted below
    client = NodeClient(node, kubeconfig=str(proxy.kubeconfig(tmp_path / "kc")), timeout_s=30)
    reader = TraceReader(H100_TRACE, at_s=2.0)  # idle
    agent = Agent(
        settings(node_name=node, schedule="@every 0.5s", heartbeat_s=1, min_patch_interval_s=0),
        reader, NodeApi(client, environ={"POD_NAMESPACE": "default", "POD_NAME": "agent-0"}),
    )  # fmt: skip
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    daemon = Daemon(agent)
    watchdog = daemon.schedule_ticks(scheduler)
    scheduler.start()
    try:
        idle_free = wait_for("the idle labels", lambda: node_metadata(admin_api, node)[0].get(FREE))
        assert agent.lease is not None
        proxy.stall()
        wait_for("a request held by the proxy", proxy.in_flight.is_set, 20)
        reader.at_s = 15.0  # 30 GiB allocated: the free-memory label must go down
        ticks = agent.cache.ticks
        # the held request has not timed out (a retry would be a second held request), yet
        # readings go on: before, the tick waited in the API call (4 x 30 s here)
        wait_for("five readings while the API hangs", lambda: agent.cache.ticks >= ticks + 5, 25)
        assert proxy.held == 1
        busy_free = agent.cache.last.desired.labels[FREE]
        assert int(busy_free) < int(idle_free)
        assert node_metadata(admin_api, node)[0][FREE] == idle_free  # nothing written
        renewals = agent.cache.lease_renewals
        proxy.heal()
        # the held request ends unanswered; the next round writes the latest reading
        wait_for("the Node to converge", lambda: node_metadata(admin_api, node)[0][FREE] == busy_free, 90)
        wait_for("the Lease renewed again", lambda: agent.cache.lease_renewals > renewals, 30)
    finally:
        proxy.heal()
        watchdog.stop()
        scheduler.shutdown(wait=False)
        daemon.shutdown()
        proxy.close()
    assert FREE not in node_metadata(admin_api, node)[0]  # cleaned up on exit
