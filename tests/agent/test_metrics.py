"""/metrics, /healthz and /readyz: the collector on its own, then a running agent scraped over
HTTP while it replays the H100 trace against the real API server; at start-up, an IPv6 address
serves IPv6 (and IPv4 on a dual-stack host), and a port that cannot be bound ends the command
with one line and exit status 2."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.metrics import agent_registry, readiness, serve
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import FAULTS_TRACE, H100_TRACE, free_port, settings
from tests.helpers import run_cli as _cli
from tests.waiting import wait_for

MIB = 1024 * 1024


def collect(agent: Agent) -> CollectorRegistry:
    registry = CollectorRegistry()
    agent_registry(agent, registry)
    return registry


def test_collector_reads_the_cache_only():
    agent = Agent(load_settings(node_name="n"), TraceReader(H100_TRACE, at_s=14.0), NodeApi(None))
    registry = collect(agent)
    assert registry.get_sample_value("omaticaya_gpu_memory_free_bytes", {"gpu": "0", "uuid": ""}) is None
    agent.tick()
    uuid = "GPU-178dd196-7fda-b7ae-a94e-630097a14ca4"
    key = {"gpu": "0", "uuid": uuid}
    snap = agent.cache.last.snapshot.gpus[0]
    cases = {
        "omaticaya_gpu_memory_free_bytes": snap.memory_free_mib * MIB,
        "omaticaya_gpu_memory_used_bytes": snap.memory_used_mib * MIB,
        "omaticaya_gpu_memory_total_bytes": 81559 * MIB,
        "omaticaya_gpu_temperature_celsius": snap.temperature_c,
        "omaticaya_gpu_power_watts": snap.power_w,
        "omaticaya_gpu_utilization_ratio": snap.utilization_pct / 100,
        "omaticaya_gpu_healthy": 1,
    }
    # by the pod holding the GPU, with dcgm-exporter's label names: empty, no kubelet here
    by_pod = {"omaticaya_gpu_memory_used_bytes", "omaticaya_gpu_utilization_ratio"}
    no_pod = {"pod": "", "namespace": "", "container": ""}
    for name, expected in cases.items():
        labels = {**key, **no_pod} if name in by_pod else key
        assert registry.get_sample_value(name, labels) == pytest.approx(expected), name
    assert registry.get_sample_value("omaticaya_node_health", {"state": "Healthy"}) == 1
    assert registry.get_sample_value("omaticaya_node_health", {"state": "Unknown"}) == 0
    assert registry.get_sample_value("omaticaya_ticks_total") == 1
    assert registry.get_sample_value("omaticaya_tick_duration_seconds_count") == 1
    reads_before = agent.reader._prev_s
    for _ in range(3):
        collect(agent).collect()
    assert agent.reader._prev_s == reads_before  # a scrape reads no GPU



def test_unhealthy_gpus_are_counted_by_reason():
    """The faults trace at 12 s: GPU 1's remapped rows are pending; at 21 s GPU 2 has Xid 79."""
    faults = FAULTS_TRACE
    uuid = "GPU-{:08d}-7fda-b7ae-a94e-630097a14ca4".format
    reader = TraceReader(faults, at_s=12.0)
    agent = Agent(load_settings(node_name="n", xid_quiet_s=600), reader, NodeApi(None))
    agent.tick()
    registry = collect(agent)
    name = "omaticaya_gpu_unhealthy_reason"
    assert registry.get_sample_value(name, {"gpu": "1", "uuid": uuid(1), "reason": "remap-pending"}) == 1
    assert registry.get_sample_value(name, {"gpu": "0", "uuid": uuid(0), "reason": "remap-pending"}) is None
    reader.at_s = 21.0
    agent.tick()
    reasons = {
        (s.labels["gpu"], s.labels["reason"])
        for family in collect(agent).collect()
        if family.name == name
        for s in family.samples
    }
    assert reasons == {("2", "xid-79")}

@pytest.mark.parametrize(
    ("read_ago_s", "api_ago_s", "ready", "reason"),
    [
        (1, 1, True, "ok"),
        (None, None, False, "no successful NVML read recently"),
        (100, 1, False, "no successful NVML read recently"),
        (1, None, False, "Kubernetes API not reached recently"),
        (1, 100, False, "Kubernetes API not reached recently"),
    ],
)
def test_readiness(read_ago_s, api_ago_s, ready, reason):
    agent = Agent(
        load_settings(node_name="n", schedule="@every 10s"), TraceReader(H100_TRACE), NodeApi(None)
    )
    now = 1000.0
    agent.cache.last_read_ok_s = None if read_ago_s is None else now - read_ago_s
    agent.cache.last_api_ok_s = None if api_ago_s is None else now - api_ago_s
    assert readiness(agent.cache, agent.period_s, now) == (ready, reason)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.cluster
def test_scrape_a_running_agent(dev_cluster, make_node):
    node = make_node()
    port = free_port()
    env = dict(
        dev_cluster.env(),
        NODE_NAME=node,
        OMATICAYA_TRACE=str(H100_TRACE),
        OMATICAYA_SCHEDULE="@every 1s",
        OMATICAYA_METRICS_PORT=str(port),
        OMATICAYA_METRICS_ADDRESS="127.0.0.1",
        OMATICAYA_TEMPERATURE_LABELS="true",  # the 18 labels counted below include it
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "run"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("the agent to be ready", lambda: get(base + "/readyz")[0] == 200, 20, every_s=0.2)
        assert get(base + "/healthz") == (200, "ok\n")
        assert get(base + "/readyz") == (200, "ok\n")

        def scrape() -> dict | None:
            status, text = get(base + "/metrics")
            assert status == 200
            found = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            return found if found.get(("omaticaya_ticks_total", ()), 0) >= 3 else None

        samples = wait_for("three ticks counted on /metrics", scrape, 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    gpu = {"gpu": "0", "uuid": "GPU-178dd196-7fda-b7ae-a94e-630097a14ca4"}
    assert value("omaticaya_gpu_memory_total_bytes", **gpu) == 81559 * MIB
    assert 40_000 * MIB < value("omaticaya_gpu_memory_free_bytes", **gpu) <= 81559 * MIB
    assert 0 <= value("omaticaya_gpu_utilization_ratio", **gpu, pod="", namespace="", container="") <= 1
    assert 30 <= value("omaticaya_gpu_temperature_celsius", **gpu) <= 90
    assert value("omaticaya_gpu_healthy", **gpu) == 1
    assert value("omaticaya_node_health", state="Healthy") == 1
    assert value("omaticaya_api_requests_total", verb="get", result="200") == 1
    assert value("omaticaya_api_requests_total", verb="patch", result="200") >= 1
    assert value("omaticaya_patches_total") == value(
        "omaticaya_api_requests_total", verb="patch", result="200"
    )
    assert value("omaticaya_labels_changed_total") >= 18
    assert value("omaticaya_ticks_total") >= 3
    assert value("omaticaya_tick_duration_seconds_count") == value("omaticaya_ticks_total")
    assert abs(value("omaticaya_last_patch_timestamp_seconds") - time.time()) < 60
    build = [k for k in samples if k[0] == "omaticaya_build_info"]
    assert len(build) == 1 and dict(build[0][1])["version"]


# ------------------------------------------------------------ the server at start-up ----


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def get_raising(url: str) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status raises ``urllib.error.HTTPError``."""
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


@pytest.mark.skipif(not _ipv6(), reason="this host has no IPv6 loopback")
def test_metrics_address_ipv6_serves_ipv6():
    agent = Agent(settings(trace=H100_TRACE), TraceReader(H100_TRACE), NodeApi(None, dry_run=True))
    agent.tick()
    server = serve(agent, "::", 0)
    try:
        status, text = get_raising(f"http://[::1]:{server.port}/metrics")
        assert status == 200 and "omaticaya_gpu_memory_free_bytes" in text
        # the probes are the agent's, not the exposition's
        assert get_raising(f"http://[::1]:{server.port}/readyz") == (200, "ok\n")
        with pytest.raises(urllib.error.HTTPError) as err:
            get_raising(f"http://[::1]:{server.port}/healthz")  # the scheduler is not running
        assert err.value.code == 503
    finally:
        server.shutdown()


@pytest.fixture
def kubeconfig(tmp_path):
    """A kubeconfig for a server that is never contacted (the command ends before any request)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return str(path)


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0"])
def test_metrics_port_in_use_is_one_line_and_exit_2(kubeconfig, address):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _cli(
            "run", "--node", "n1", "--trace", str(H100_TRACE), "--kubeconfig", kubeconfig,
            "--metrics-port", str(port), OMATICAYA_METRICS_ADDRESS=address,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot serve /metrics on {address}:{port}" in lines[0]
    assert "--metrics-port" in lines[0] and "OMATICAYA_METRICS_ADDRESS" in lines[0]


def test_metrics_address_not_on_this_host_is_one_line_and_exit_2(kubeconfig):
    done = _cli(
        "run", "--node", "n1", "--trace", str(H100_TRACE), "--kubeconfig", kubeconfig,
        OMATICAYA_METRICS_ADDRESS="192.0.2.1", OMATICAYA_METRICS_PORT="19402",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot serve /metrics on 192.0.2.1:19402" in lines[0], done.stderr
