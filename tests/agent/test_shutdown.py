"""SIGTERM must leave no stale labels: a shutdown deadline below the kubelet's grace period, no
retries once stopping, no tick after the cleanup, and the signal handlers installed before the
servers start. Against the real kube-apiserver (through ``tests/faultproxy.py`` for the slow
request)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from omaticaya_py import cli
from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.agent.state import AgentStopping
from omaticaya_py.core.schema import STATIC_NAMES
from omaticaya_py.kube import NodeClient
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import node_metadata
from tests.faultproxy import Fault, FaultProxy
from tests.helpers import H100_TRACE, settings
from tests.waiting import wait_for

P = "omaticaya.io/"


def dynamic(labels: dict[str, str]) -> set[str]:
    return {k for k in labels if k.startswith(P) and k[len(P) :] not in STATIC_NAMES}


@pytest.mark.cluster
def test_no_tick_writes_after_the_cleanup(dev_cluster, admin_api, make_node):
    """A tick that starts after stop() (the scheduler's thread was already on its way) must not
    put the labels back that the cleanup removed."""
    node = make_node()
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig))
    agent = Agent(
        settings(node_name=node, trace=H100_TRACE), TraceReader(H100_TRACE), NodeApi(client)
    )
    agent.tick()
    assert dynamic(node_metadata(admin_api, node)[0])
    agent.stop()
    Daemon(agent).shutdown()
    assert not dynamic(node_metadata(admin_api, node)[0])
    with pytest.raises(AgentStopping):
        agent.tick()  # too late: must do nothing
    agent.safe_tick()
    assert not dynamic(node_metadata(admin_api, node)[0])


@pytest.mark.cluster
def test_sigterm_during_a_slow_patch_stops_retrying_and_cleans_up(
    dev_cluster, admin_api, make_node, tmp_path
):
    """The PATCH in flight at SIGTERM times out; it is not retried (it would only delay the
    cleanup towards the kubelet's SIGKILL): the next PATCH is the cleanup's."""
    proxy = FaultProxy(dev_cluster)
    node = make_node()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_")}
    env.update(
        NODE_NAME=node, OMATICAYA_TRACE=str(H100_TRACE), OMATICAYA_SCHEDULE="@every 1s",
        OMATICAYA_METRICS_PORT="0", OMATICAYA_KUBE_TIMEOUT_S="1", OMATICAYA_SHUTDOWN_TIMEOUT_S="8",
        OMATICAYA_HEARTBEAT_S="1",
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "run", "--kubeconfig", str(proxy.kubeconfig(tmp_path / "kc"))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for("the agent to label the node", lambda: dynamic(node_metadata(admin_api, node)[0]), 30)
        # held longer than the 1 s request timeout, then answered 503 (recorded as such)
        proxy.inject(Fault("PATCH", status=503, delay_s=3))
        wait_for("a PATCH held by the proxy", proxy.in_flight.is_set, 30)
        held_at = len(proxy.seen)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    # the proxy records a request after answering it (the held one never: its client is gone
    # by then): let its log catch up with the cleanup's PATCH
    wait_for("the proxy's record of the cleanup's PATCH",
             lambda: 200 in {s for m, _, s in proxy.seen[held_at:] if m == "PATCH"}, 10)  # fmt: skip
    patches_after = [s for m, _, s in proxy.seen[held_at:] if m == "PATCH"]
    assert patches_after.count(200) == 1, proxy.seen[held_at:]  # the cleanup's, no retry
    assert not dynamic(node_metadata(admin_api, node)[0]), err
    assert "removed" in err and "dynamic labels" in err
    proxy.close()


@pytest.mark.cluster
def test_a_tick_stuck_in_nvml_does_not_hold_the_cleanup_back(dev_cluster, admin_api, make_node):
    """SIGTERM while a tick hangs in its read (a hung NVML call): the cleanup still removes the
    dynamic labels within the deadline (before: shutdown waited for the tick forever, and the
    kubelet's SIGKILL left every label in place)."""
    from datetime import timezone

    from apscheduler.schedulers.background import BackgroundScheduler

    from tests.agent.stuck_tick_support import BlockingReader

    node = make_node()
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig))
    reader = BlockingReader()
    agent = Agent(
        settings(node_name=node, schedule="@every 0.2s", shutdown_timeout_s=3), reader,
        NodeApi(client, environ={}),
    )  # fmt: skip
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    daemon = Daemon(agent)
    watchdog = daemon.schedule_ticks(scheduler)
    scheduler.start()
    try:
        wait_for("the agent to label the node", lambda: dynamic(node_metadata(admin_api, node)[0]), 30)
        reader.blocked.set()
        assert reader.entered.wait(20)  # a tick is now stuck in read()
        stopping = threading.Thread(target=daemon.shutdown, daemon=True)  # what SIGTERM runs
        stopping.start()
        stopping.join(30)  # a bound: before, it waited for the stuck tick forever
        assert not stopping.is_alive(), "shutdown waits for the stuck tick"
        assert not dynamic(node_metadata(admin_api, node)[0])
        assert agent.cache.tick_stage == "read"
    finally:
        reader.gate.set()
        watchdog.stop()


def test_signal_handlers_are_installed_before_the_metrics_server(tmp_path, monkeypatch):
    """A SIGTERM while the metrics server starts must stop the agent cleanly, not reach the
    default handler (which would kill the process with the labels in place)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )

    class Reached(Exception):
        pass

    def default(signum, frame):  # stands in for the default action: the process would die
        raise Reached("SIGTERM reached the default handler")

    from omaticaya_py.agent import metrics

    class Dummy:
        port = 0

        def shutdown(self) -> None:
            pass

    def serve(agent, address, port, **_):
        os.kill(os.getpid(), signal.SIGTERM)
        return Dummy()

    monkeypatch.setattr(metrics, "serve", serve)
    previous = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    signal.signal(signal.SIGTERM, default)
    try:
        code = cli.main([
            "run", "--node", "n1", "--trace", str(H100_TRACE), "--kubeconfig", str(kubeconfig),
            "--metrics-port", "19999",
        ])  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    assert code == 0


@pytest.mark.parametrize(("grace", "deadline"), [(None, "20"), (60, "40"), (0, "1")])
def test_chart_sets_the_shutdown_deadline_below_the_grace_period(helm, grace, deadline):
    from tests.chart import render

    values = {} if grace is None else {"terminationGracePeriodSeconds": grace}
    ds = next(d for d in render(helm, values) if d["kind"] == "DaemonSet")
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OMATICAYA_SHUTDOWN_TIMEOUT_S"] == deadline
    assert settings(shutdown_timeout_s=deadline).shutdown_timeout_s == float(deadline)
