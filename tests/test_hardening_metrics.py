"""The metrics/probe server at start-up: an IPv6 address serves IPv6 (and IPv4 on a dual-stack
host), and a port that cannot be bound ends the command with one line and exit status 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from omaticaya_py.agent import Agent
from omaticaya_py.agent.metrics import serve
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import H100_TRACE
from tests.helpers import settings


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


@pytest.mark.skipif(not _ipv6(), reason="this host has no IPv6 loopback")
def test_metrics_address_ipv6_serves_ipv6():
    agent = Agent(settings(trace=H100_TRACE), TraceReader(H100_TRACE), None, dry_run=True)
    agent.tick()
    server = serve(agent, "::", 0)
    try:
        status, text = get(f"http://[::1]:{server.port}/metrics")
        assert status == 200 and "omaticaya_gpu_memory_free_bytes" in text
        # the probes are the agent's, not the exposition's
        assert get(f"http://[::1]:{server.port}/readyz") == (200, "ok\n")
        with pytest.raises(urllib.error.HTTPError) as err:
            get(f"http://[::1]:{server.port}/healthz")  # the scheduler is not running
        assert err.value.code == 503
    finally:
        server.shutdown()


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_") and k != "NODE_NAME"}
    return subprocess.run(
        [sys.executable, "-m", "omaticaya_py", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


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
