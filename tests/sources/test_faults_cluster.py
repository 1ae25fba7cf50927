"""API faults, each against the real kube-apiserver from scripts/dev-cluster.

Status faults (409, 429, 5xx) and a slow PATCH are injected by ``tests/faultproxy.py``, which
forwards everything else to the real API server; outages and restarts stop and start the real
kube-apiserver process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.schema import STATIC_NAMES
from omaticaya_py.kube import KubeForbidden, KubeUnavailable, NodeClient
from omaticaya_py.sources.nvml import NvmlReader, nvml_available
from omaticaya_py.sources.replay import TraceReader
from tests.audit import audit_events
from tests.conftest import node_metadata
from tests.faultproxy import Fault, FaultProxy
from tests.helpers import FAULTS_TRACE, H100_TRACE, Clock
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
P = "omaticaya.io/"


@pytest.fixture
def proxy(dev_cluster):
    p = FaultProxy(dev_cluster)
    yield p
    p.close()


def test_transient_statuses_are_retried_with_backoff_and_retry_after(
    proxy, make_node, admin_api, tmp_path
):
    node = make_node()
    naps: list[float] = []
    client = NodeClient(
        node, kubeconfig=str(proxy.kubeconfig(tmp_path / "kc")), attempts=5, sleep=naps.append
    )
    proxy.inject(
        Fault("PATCH", status=429, retry_after_s=2),
        Fault("PATCH", status=503),
        Fault("PATCH", status=409),
        Fault("PATCH", status=500),
    )
    meta = client.patch_node({"metadata": {"labels": {P + "x": "1"}}})
    assert meta.labels[P + "x"] == "1"
    assert node_metadata(admin_api, node)[0][P + "x"] == "1"
    # the proxy records a request after answering it: wait for its record of the last one
    wait_for(
        "the proxy's record of the five PATCHes",
        lambda: [s for m, _, s in proxy.seen if m == "PATCH"] == [429, 503, 409, 500, 200],
        10,
    )
    assert len(naps) == 4
    assert naps[0] >= 2.0  # Retry-After honoured
    assert all(0 <= n <= 5.0 for n in naps[1:])  # jittered exponential backoff, capped
    assert client.requests == {
        ("patch", "429"): 1, ("patch", "503"): 1, ("patch", "409"): 1,
        ("patch", "500"): 1, ("patch", "200"): 1,
    }


def test_retries_are_bounded(proxy, make_node, tmp_path):
    node = make_node()
    client = NodeClient(
        node, kubeconfig=str(proxy.kubeconfig(tmp_path / "kc")), attempts=3, sleep=lambda s: None
    )
    proxy.inject(*[Fault("GET", status=503)] * 3)
    with pytest.raises(KubeUnavailable, match="503"):
        client.get_node()
    assert client.requests == {("get", "503"): 3}


def test_409_is_retried_for_a_patch_but_never_for_the_event_post(proxy, make_node, admin_api, tmp_path):
    """A 409 on a merge patch is a conflict worth another try; on a POST it means the object
    exists (a create that succeeded but whose answer was lost): retrying posts nothing new, and
    the caller must not post the Event again next tick, so the create counts as done."""
    node = make_node()
    naps: list[float] = []
    client = NodeClient(
        node, kubeconfig=str(proxy.kubeconfig(tmp_path / "kc")), attempts=4, sleep=naps.append
    )
    proxy.inject(Fault("POST", status=409))
    client.create_node_event(node_uid="", reason="GpuUnhealthy", message="GPU 0 unhealthy", warning=True)
    assert naps == []
    assert client.requests[("create", "409")] == 1 and sum(client.requests.values()) == 1

    proxy.inject(Fault("PATCH", status=409))
    client.patch_node({"metadata": {"labels": {P + "x": "1"}}})
    assert client.requests[("patch", "409")] == 1 and client.requests[("patch", "200")] == 1
    # the proxy records a request after it has answered it: wait for its log to catch up
    wait_for("the proxy's record", lambda: [(m, s) for m, _, s in proxy.seen]
             == [("POST", 409), ("PATCH", 409), ("PATCH", 200)], 10)  # fmt: skip

    # and a real create of an Event that is already there (the real API server's 409)
    body_events = admin_api.list_namespaced_event("default").items
    before = len(body_events)
    client.create_node_event(node_uid="", reason="GpuRecovered", message="GPU 0 healthy", warning=False)
    assert len(admin_api.list_namespaced_event("default").items) == before + 1


def test_forbidden_is_reported_and_not_hammered(dev_cluster, admin_api, make_node, tmp_path):
    node = make_node()
    sa = f"norbac-agent-{os.getpid()}"
    admin_api.create_namespaced_service_account("default", {"metadata": {"name": sa}})
    token = admin_api.create_namespaced_service_account_token(
        sa, "default", {"spec": {"audiences": [], "expirationSeconds": 600}}
    ).status.token
    token_file = tmp_path / "token"
    token_file.write_text(token)
    port = dev_cluster.ports()["APISERVER_PORT"]
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
    client = NodeClient(
        node, environ=environ, token_file=str(token_file), ca_file=str(dev_cluster.ca_file),
        sleep=lambda s: None,
    )
    clock = Clock(0.0)
    settings = load_settings(node_name=node, schedule="@every 10s")
    agent = Agent(
        settings, TraceReader(H100_TRACE, at_s=3.0), NodeApi(client), clock=clock
    )
    for tick in range(60):  # ten minutes of ticks
        clock.t = tick * 10.0
        agent.safe_tick()
    # 10 s, 20 s, 40 s, 80 s, 160 s, then every 300 s: 6 tries in 600 s, not 60; and the one
    # GET at start that would carry Xid health over a restart (agent.xid_seed_reader), refused too
    assert client.requests == {("get", "403"): 6 + 1}
    with pytest.raises(KubeForbidden, match="RBAC"):
        client.get_node()


def test_rotated_in_cluster_token_is_used_by_the_next_request(
    dev_cluster, admin_api, make_node, tmp_path
):
    """In-cluster config with files we rotate; tokens from the TokenRequest API."""
    node = make_node()
    from kubernetes import client as k

    rbac = k.RbacAuthorizationV1Api(admin_api.api_client)
    suffix = os.getpid()
    rbac.create_cluster_role(
        {"metadata": {"name": f"nodes-{suffix}"},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}
    )
    users = []
    for who in ("old", "new"):
        name = f"agent-{who}-{suffix}"
        admin_api.create_namespaced_service_account("default", {"metadata": {"name": name}})
        rbac.create_cluster_role_binding(
            {"metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": f"nodes-{suffix}"},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}
        )
        users.append(name)
    tokens = [
        admin_api.create_namespaced_service_account_token(
            name, "default", {"spec": {"audiences": [], "expirationSeconds": 600}}
        ).status.token
        for name in users
    ]
    token_file = tmp_path / "token"
    token_file.write_text(tokens[0])
    port = dev_cluster.ports()["APISERVER_PORT"]
    client = NodeClient(
        node,
        environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)},
        token_file=str(token_file),
        ca_file=str(dev_cluster.ca_file),
    )
    client.patch_node({"metadata": {"labels": {P + "who": "old"}}})
    tmp = tmp_path / "token.new"  # rotate the way the kubelet does: write, then rename
    tmp.write_text(tokens[1])
    old_ns = token_file.stat().st_mtime_ns
    if tmp.stat().st_mtime_ns <= old_ns:  # a coarse clock: make the new file visibly newer
        os.utime(tmp, ns=(old_ns + 1_000_000, old_ns + 1_000_000))
    tmp.rename(token_file)
    client.patch_node({"metadata": {"labels": {P + "who": "new"}}})

    patchers = [
        event["user"]["username"]
        for event in audit_events(dev_cluster, stage=None, verb="patch", name=node)
    ]
    assert patchers == [f"system:serviceaccount:default:{u}" for u in users]


def _run_agent(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "run"],
        env=dict(env, PYTHONUNBUFFERED="1", OMATICAYA_METRICS_PORT="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _Lines:
    """The lines a process writes to a pipe, collected by a thread as they come, so that a
    test can wait for one while the process runs."""

    def __init__(self, pipe) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def text(self, timeout_s: float = 10) -> str:
        self._thread.join(timeout_s)
        return "".join(self.lines)


def _read_at(admin_api, node: str) -> datetime | None:
    try:
        raw = node_metadata(admin_api, node)[1].get(P + "telemetry")
    except Exception:  # noqa: BLE001 - API server down
        return None
    if raw is None:
        return None
    return datetime.fromisoformat(json.loads(raw)["read_at"].replace("Z", "+00:00"))


def _wait_fresh(admin_api, node: str, since: datetime, timeout_s: float) -> float:
    """Seconds until the telemetry's read_at is at or after ``since``."""
    start = time.monotonic()

    def fresh() -> bool:
        read_at = _read_at(admin_api, node)
        return read_at is not None and read_at >= since.replace(microsecond=0)

    wait_for("the telemetry to be refreshed", fresh, timeout_s, every_s=0.1)
    return time.monotonic() - start


@pytest.mark.slow
def test_api_outage_and_restart(dev_cluster, admin_api, make_node):
    """API server down for 30 s, then back; then restarted as a new process."""
    node = make_node()
    env = dict(
        dev_cluster.env(), NODE_NAME=node, OMATICAYA_TRACE=str(H100_TRACE),
        OMATICAYA_SCHEDULE="@every 1s", OMATICAYA_HEARTBEAT_S="1",
    )
    proc = _run_agent(env)
    log = _Lines(proc.stderr)
    try:
        _wait_fresh(admin_api, node, datetime.now(timezone.utc), 20)
        dev_cluster.stop_apiserver()
        # down until the agent has seen it (logged once) and kept ticking through failures
        wait_for("the agent to report the outage", lambda: log.count("Kubernetes API request failed"), 60)
        assert proc.poll() is None, "the agent must keep running"
        dev_cluster.start_apiserver()
        back = datetime.now(timezone.utc)
        _wait_fresh(admin_api, node, back, 20)  # patched again once the API server answers
        wait_for("the recovery to be logged", lambda: log.count("Kubernetes API reachable again"), 20)

        dev_cluster.restart_apiserver()  # a new process, same etcd
        back = datetime.now(timezone.utc)
        _wait_fresh(admin_api, node, back, 20)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    stderr = log.text()
    assert proc.returncode == 0, stderr
    outage_lines = [s for s in stderr.splitlines() if "Kubernetes API request failed" in s]
    # once per outage, not once per tick (~30 failed ticks); a restart may be short enough for
    # the retries inside one tick to ride it out, and then nothing is logged at all
    assert 1 <= len(outage_lines) <= 2, stderr
    assert stderr.count("Kubernetes API reachable again") == len(outage_lines)
    assert "Traceback" not in stderr


def test_sigterm_while_a_patch_is_in_flight(dev_cluster, admin_api, make_node, proxy, tmp_path):
    node = make_node(labels={"nvidia.com/gpu.present": "true"})
    env = dict(
        os.environ,
        KUBECONFIG=str(proxy.kubeconfig(tmp_path / "kc")),
        NODE_NAME=node,
        OMATICAYA_TRACE=str(H100_TRACE),
        OMATICAYA_SCHEDULE="@every 1s",
    )
    proxy.inject(Fault("GET"), Fault("PATCH", delay_s=3.0))  # the first PATCH hangs for 3 s
    proc = _run_agent(env)
    try:
        assert proxy.in_flight.wait(20), "the agent never sent its first patch"
        proc.send_signal(signal.SIGTERM)  # while the proxy holds the PATCH
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    labels, annotations = node_metadata(admin_api, node)
    ours = {k.removeprefix(P) for k in labels if k.startswith(P)}
    assert ours and ours <= STATIC_NAMES  # the patch completed, then cleanup removed the rest
    assert P + "telemetry" not in annotations
    # cleanup: read the Node, remove dynamic keys (recorded just after the answer: wait)
    wait_for("the cleanup's GET and PATCH", lambda: [m for m, _, _ in proxy.seen][-2:] == ["GET", "PATCH"], 10)


def test_without_nvml_health_is_unknown_and_numbers_are_absent(dev_cluster, admin_api, make_node):
    """The real NVML library on a machine without a GPU or driver: Unknown, no numbers."""
    if nvml_available():
        pytest.skip("a GPU is present: this test needs a machine where NVML cannot start")
    node = make_node()
    stale = {P + "gpu.memory.free-mib": "80896", P + "gpu-0.utilization-pct": "100"}
    admin_api.patch_node(node, {"metadata": {"labels": stale}})
    settings = load_settings(node_name=node)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig))
    agent = Agent(settings, NvmlReader(watch_xid=False), NodeApi(client))
    result = agent.tick()
    assert result.snapshot.error is not None and result.snapshot.error.startswith("NVMLError")
    labels, _ = node_metadata(admin_api, node)
    assert {k: v for k, v in labels.items() if k.startswith(P)} == {P + "gpu.health": "Unknown"}
    assert agent.reader.errors[("nvmlInit", result.snapshot.error)] == 1
    agent.tick()  # retried every tick
    assert agent.reader.errors[("nvmlInit", result.snapshot.error)] == 2




def test_fault_trace_gives_the_right_labels_and_events(dev_cluster, admin_api, make_node):
    """Xid 79 on GPU 2, remapped rows pending on GPU 1, GPU 3 lost, the driver gone: labels
    and Events at each point, and recovery without a restart."""
    node = make_node()
    clock = Clock(0.0)
    # recoveries on the Node at the tick they happen: no write budget (it would hold them)
    settings = load_settings(node_name=node, xid_quiet_s=8, min_patch_interval_s=0)
    reader = TraceReader(FAULTS_TRACE, loop=False, window_s=1.0, clock=clock)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig))
    agent = Agent(settings, reader, NodeApi(client), clock=clock)
    states: dict[int, dict[str, str]] = {}
    for t in range(40):
        clock.t = float(t)
        agent.tick()
        labels = node_metadata(admin_api, node)[0]
        states[t] = {k.removeprefix(P): v for k, v in labels.items() if k.startswith(P)}

    def health(t: int) -> tuple[str, ...]:
        s = states[t]
        return (s["gpu.health"], *(s.get(f"gpu-{i}.health", "-") for i in range(4)))

    assert health(3) == ("Healthy", "Healthy", "Healthy", "Healthy", "Healthy")
    assert health(6) == health(3)  # Xid 13 is an application fault: ignored
    assert health(10) == ("Degraded", "Healthy", "Unhealthy", "Healthy", "Healthy")  # remap
    assert health(15) == health(3)  # pending rows cleared: recovered
    assert health(20) == ("Degraded", "Healthy", "Healthy", "Unhealthy", "Healthy")  # Xid 79
    assert health(24) == ("Degraded", "Healthy", "Healthy", "Unhealthy", "Unhealthy")  # lost
    assert health(28) == health(3)  # quiet window over, GPU 3 back
    assert states[32] == {"gpu.health": "Unknown"}  # driver gone: numbers removed
    assert states[33] == states[32]
    assert health(35) == health(3)  # NVML back: labels return without a restart
    assert states[35]["gpu.healthy-count"] == "4"
    assert states[24]["gpu.healthy-count"] == "2"
    assert "gpu-3.memory.free-mib" not in states[24]  # a lost GPU's numbers are removed

    events = admin_api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}"
    ).items
    seen = sorted(  # names end in a microsecond timestamp: chronological
        (e.metadata.name, e.reason, e.type, e.message, e.reporting_component) for e in events
    )
    assert [(r, ty, m, c) for _, r, ty, m, c in seen] == [
        ("GpuUnhealthy", "Warning", "GPU 1 unhealthy: remap-pending", "omaticaya"),
        ("GpuRecovered", "Normal", "GPU 1 healthy again", "omaticaya"),
        ("GpuUnhealthy", "Warning", "GPU 2 unhealthy: xid-79", "omaticaya"),
        ("GpuUnhealthy", "Warning", "GPU 3 unhealthy: lost", "omaticaya"),
        ("GpuRecovered", "Normal", "GPU 2 healthy again", "omaticaya"),
        ("GpuRecovered", "Normal", "GPU 3 healthy again", "omaticaya"),
    ]
    assert all(e.involved_object.kind == "Node" for e in events)


def test_a_health_event_lost_to_an_outage_is_posted_on_the_next_tick(
    dev_cluster, admin_api, make_node, proxy, tmp_path
):
    node = make_node()
    clock = Clock(9.0)
    settings = load_settings(node_name=node)
    reader = TraceReader(FAULTS_TRACE, at_s=9.0)
    client = NodeClient(
        node, kubeconfig=str(proxy.kubeconfig(tmp_path / "kc")), attempts=2, sleep=lambda s: None
    )
    agent = Agent(settings, reader, NodeApi(client), clock=clock)
    agent.tick()  # all healthy
    reader.at_s = clock.t = 10.0  # GPU 1: remapped rows pending
    proxy.inject(Fault("POST", status=503), Fault("POST", status=503))
    agent.tick()
    reader.at_s = clock.t = 11.0
    agent.tick()

    events = admin_api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}"
    ).items
    assert [(e.reason, e.message) for e in events] == [
        ("GpuUnhealthy", "GPU 1 unhealthy: remap-pending")
    ]
    wait_for(
        "the proxy's record of the three POSTs",
        lambda: [s for m, _, s in proxy.seen if m == "POST"] == [503, 503, 201],
        10,
    )
