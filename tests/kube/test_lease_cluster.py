"""Liveness on a Lease and the write budget, against the real kube-apiserver (dev cluster).

The agent replays the recorded H100 trace with a hand-driven clock (as in
test_agent_cluster.py); Node PATCHes and Lease writes are counted in the API server's own audit
log; the Lease is read back as admin.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from loguru import logger

from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.kube import NodeClient
from omaticaya_py.kube.heartbeat_lease import lease_name
from tests.audit import audit_count
from tests.conftest import node_metadata
from tests.helpers import Clock, token_kubeconfig
from tests.kube.lease_cluster_support import (  # the names moved out, for this file's tests
    NAMESPACE,  # noqa: F401
    POD,  # noqa: F401
    make_agent,  # noqa: F401
    namespace,  # noqa: F401
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

P = "omaticaya.io/"


def settle_audit(dev_cluster, client: NodeClient, node: str) -> None:
    """The audit backend writes asynchronously: one more GET's entry shows it has caught up."""
    before = audit_count(dev_cluster, verb="get", resource="nodes", name=node)
    client.get_node()
    wait_for(
        "the audit log to record the last GET",
        lambda: audit_count(dev_cluster, verb="get", resource="nodes", name=node) > before,
        10,
    )




class NodeWatcher:
    """A plain watch on one Node (``/api/v1/nodes?fieldSelector=metadata.name=...``), counting
    MODIFIED events on a thread, as a CNI agent's Node watch would receive them."""

    def __init__(self, admin_api, node: str) -> None:
        import threading

        from kubernetes import watch

        self.modified = 0
        self._watch = watch.Watch()
        version = admin_api.read_node(node).metadata.resource_version
        ready = threading.Event()

        def run() -> None:
            ready.set()
            try:
                for event in self._watch.stream(
                    admin_api.list_node, field_selector=f"metadata.name={node}",
                    resource_version=version, timeout_seconds=120,
                ):
                    if event["type"] == "MODIFIED":
                        self.modified += 1
            except Exception:  # noqa: BLE001 - the stream cut when the cluster stops: counted
                pass

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(5)

    def stop(self) -> None:
        self._watch.stop()




def test_lease_is_created_and_renewed_while_a_quiet_node_gets_no_patch(
    dev_cluster, admin_api, make_node, namespace, leases
):
    node = make_node()
    clock = Clock(3.0)  # the trace starts at the first read: idle until ~8 s later
    agent = make_agent(dev_cluster.kubeconfig, node, namespace, clock, heartbeat_s=30)
    name = lease_name(node)
    assert name == f"omaticaya-node-{node}"
    assert agent.lease is not None and agent.lease.ref == f"{namespace}/{name}"

    agent.tick()  # Lease created, Node labelled (GET + PATCH)
    lease = leases.read_namespaced_lease(name, namespace)
    assert lease.spec.holder_identity == POD
    assert lease.spec.lease_duration_seconds == 30 + 10  # heartbeat + schedule period + jitter
    first_renew: datetime = lease.spec.renew_time
    labels, annotations = node_metadata(admin_api, node)
    assert labels[P + "gpu.health"] == "Healthy"
    doc = json.loads(annotations[P + "telemetry"])
    assert doc["lease"] == f"{namespace}/{name}"
    assert "expires_at" not in doc and "refresh_s" not in doc  # liveness is on the Lease

    settle_audit(dev_cluster, agent.node, node)
    patches = audit_count(dev_cluster, verb="patch", resource="nodes", name=node)
    assert patches == 1
    requests_before = sum(agent.node.requests.values())
    for t in (4.0, 5.0, 6.0, 7.0, 8.0):  # the idle phase: nothing changes, no request at all
        clock.t = t
        assert agent.tick().patch is None
    assert sum(agent.node.requests.values()) == requests_before

    renewals = []
    sent = []
    for t in (40.0, 75.0):  # heartbeats (the trace has ended: the last sample holds still)
        clock.t = t
        sent.append(agent.tick())
        clock.t = t + 1
        sent.append(agent.tick())
        renewals.append(leases.read_namespaced_lease(name, namespace).spec.renew_time)
    settle_audit(dev_cluster, agent.node, node)
    updates = audit_count(dev_cluster, verb="update", resource="leases", name=name)
    node_patches = audit_count(dev_cluster, verb="patch", resource="nodes", name=node)
    assert first_renew < renewals[0] < renewals[1]
    assert updates == 2  # one PUT per heartbeat
    # the trace moved from idle to its last sample between 8 s and 40 s, so labels changed;
    # every Node patch carried a label change, none was a heartbeat
    assert node_patches - patches == sum(r.sent for r in sent)
    assert all("labels" in r.patch["metadata"] for r in sent if r.sent)
    assert agent.cache.lease_renewals == 3 and agent.cache.lease_fallbacks == 0
    before_quiet = audit_count(dev_cluster, verb="patch", resource="nodes", name=node)
    for t in (110.0, 145.0, 180.0):  # three more heartbeats on a quiet node: 0 Node writes
        clock.t = t
        agent.tick()
    settle_audit(dev_cluster, agent.node, node)
    assert audit_count(dev_cluster, verb="patch", resource="nodes", name=node) == before_quiet
    assert audit_count(dev_cluster, verb="update", resource="leases", name=name) == 5

    Daemon(agent).shutdown()  # SIGTERM's path: dynamic labels removed, and with cleanup_on_exit (the
    # default) the Lease it holds deleted (test_lease_owner.py: released when that is off)
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as gone:
        leases.read_namespaced_lease(name, namespace)
    assert gone.value.status == 404


def test_budget_holds_a_rise_and_sends_a_drop_at_once(dev_cluster, admin_api, make_node, namespace):
    node = make_node()
    clock = Clock(0.0)  # trace time = clock time since the first read
    agent = make_agent(
        dev_cluster.kubeconfig, node, namespace, clock, min_patch_interval_s=30, heartbeat_s=300
    )

    def free() -> int:
        return int(node_metadata(admin_api, node)[0][P + "gpu.memory.free-mib"])

    watcher = NodeWatcher(admin_api, node)  # what every Node watcher (a CNI agent) receives
    assert agent.tick().sent  # the first patch
    idle = free()
    assert idle == 80896
    clock.t = 9.5  # 30 GiB allocated: free memory down, sent at once though 9.5 s < 30 s
    result = agent.tick()
    assert result.sent
    dropped = free()
    assert idle - dropped >= 29 * 1024
    for t in (14.0, 17.0):  # utilisation up under the matmul (a mean over the interval): at once
        clock.t = t
        assert agent.tick().sent
    assert node_metadata(admin_api, node)[0][P + "gpu.utilization-pct"] == "100"
    last_sent = clock.t
    clock.t = 20.0  # most of it released: free memory up, held back (3 s after the last patch)
    result = agent.tick()
    # held: the Node keeps its values (nothing for the worse to send, so no request at all)
    assert result.patch is None and not result.sent
    assert int(result.desired.labels[P + "gpu.memory.free-mib"]) == dropped
    assert agent.cache.patches_held == 1
    assert free() == dropped
    clock.t = 25.5  # still held
    assert not agent.tick().sent and free() == dropped
    assert agent.cache.patches_held == 2
    # the interval has passed since the last patch and since the reading last got worse (the
    # utilisation rise at 17 s): the held rise goes out, merged
    clock.t = last_sent + 30.0
    result = agent.tick()
    assert result.sent
    assert free() >= idle - 2048
    assert int(node_metadata(admin_api, node)[0][P + "gpu.utilization-pct"]) <= 10
    held = [
        m for m in agent_registry(agent).collect() if m.name == "omaticaya_patches_held"
    ]
    assert held and held[0].samples[0].value == 2
    # one watch event per patch sent (5), none for the held-back ticks
    assert agent.cache.patches_sent == 5
    wait_for("the watch to deliver every patch", lambda: watcher.modified >= 5, 20)
    settle = node_metadata(admin_api, node)  # noqa: F841 - a read, no event
    watcher.stop()
    assert watcher.modified == 5


def _token_kubeconfig(dev_cluster, admin_api, tmp_path, rules: list[dict]) -> str:
    """A kubeconfig holding only a ServiceAccount token whose ClusterRole has ``rules`` (the
    chart's ClusterRole before Leases: nodes and events, no leases)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    rbac = client.RbacAuthorizationV1Api(admin_api.api_client)
    sa = "omaticaya-old-chart"
    for create in (
        lambda: admin_api.create_namespaced_service_account(
            NAMESPACE, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}
        ),
        lambda: rbac.create_cluster_role(
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": sa}, "rules": rules}
        ),
        lambda: rbac.create_cluster_role_binding(
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": sa},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]}
        ),
    ):
        try:
            create()
        except ApiException as exc:
            if exc.status != 409:
                raise
    token = admin_api.create_namespaced_service_account_token(
        sa, NAMESPACE,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 600}},
    ).status.token
    return str(token_kubeconfig(dev_cluster, token, tmp_path / "token-kubeconfig"))


OLD_CHART_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]


def test_without_lease_rbac_the_agent_falls_back_and_says_so_once(
    dev_cluster, admin_api, make_node, namespace, tmp_path
):
    node = make_node()
    kubeconfig = _token_kubeconfig(dev_cluster, admin_api, tmp_path, OLD_CHART_RULES)
    probe = NodeClient(node, kubeconfig=kubeconfig, sleep=lambda s: None)
    wait_for("RBAC to let the token read its Node", probe.get_node, 20)  # informer propagation
    probe.close()

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        clock = Clock(3.0)
        agent = make_agent(kubeconfig, node, namespace, clock, heartbeat_s=30)
        assert agent.lease is not None
        agent.tick()  # the Lease: 403 -> annotation heartbeat, in the same tick
        assert agent.lease is None
        labels, annotations = node_metadata(admin_api, node)
        assert labels[P + "gpu.health"] == "Healthy"
        doc = json.loads(annotations[P + "telemetry"])
        assert "lease" not in doc and doc["refresh_s"] == 40
        for t in (10.0, 20.0, 34.0, 40.0, 70.0):
            clock.t = t
            result = agent.tick()
        # 34 s: the annotation heartbeat is back on the Node (an annotation-only patch)
        assert agent.node.requests[("patch", "200")] >= 3
        assert result is not None
    finally:
        logger.remove(sink)
    said = [line for line in lines if "no permission on Lease" in line]
    assert len(said) == 1, lines
    assert agent.cache.lease_fallbacks == 1
    assert agent.node.requests[("renew", "403")] + agent.node.requests[("get", "403")] == 1
    metrics = {m.name: m for m in agent_registry(agent).collect()}
    assert metrics["omaticaya_lease_fallbacks"].samples[0].value == 1
    assert metrics["omaticaya_heartbeat_on_lease"].samples[0].value == 0


CHART_RELEASE = "omaticaya-lease"  # fullname: the release name (it contains the chart name)


def _chart_rbac_docs() -> list[dict]:
    """The chart's ServiceAccount, ClusterRole(+Binding) and the Lease Role(+Binding), rendered
    into NAMESPACE by the real helm."""
    import os
    import subprocess
    from pathlib import Path

    import yaml

    from tests.tools import ToolUnavailable, helm_path

    try:
        helm = helm_path()
    except ToolUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc}")
    chart = Path(__file__).resolve().parents[2] / "charts" / "omaticaya"
    args = [str(helm), "template", CHART_RELEASE, str(chart), "--namespace", NAMESPACE]
    for t in ("serviceaccount", "clusterrole", "clusterrolebinding", "role", "rolebinding"):
        args += ["--show-only", f"templates/{t}.yaml"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_charts_rbac_lets_the_agent_hold_its_lease_and_no_other(
    dev_cluster, admin_api, make_node, namespace, leases, tmp_path
):
    from kubernetes import client, utils
    from kubernetes.client.exceptions import ApiException

    docs = _chart_rbac_docs()
    assert sorted(d["kind"] for d in docs) == [  # the Lease Role, and the Events Role
        "ClusterRole", "ClusterRoleBinding", "Role", "Role", "RoleBinding", "RoleBinding",
        "ServiceAccount",
    ]
    for doc in docs:
        try:
            utils.create_from_dict(admin_api.api_client, doc)
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    token = admin_api.create_namespaced_service_account_token(
        sa, NAMESPACE,
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 600}},
    ).status.token
    kubeconfig = token_kubeconfig(dev_cluster, token, tmp_path / "chart-token-kubeconfig")
    node = make_node()
    rbac = client.RbacAuthorizationV1Api(admin_api.api_client)
    try:
        clock = Clock(3.0)
        agent = make_agent(str(kubeconfig), node, namespace, clock, heartbeat_s=30)

        def holds() -> bool:
            agent.tick()
            return agent.lease is not None and agent.cache.lease_renewals == 1

        # RBAC reaches the authorizer through an informer, and a 403 on the Lease would fall
        # back for good: wait until the token may do both, then tick
        probe = NodeClient(node, kubeconfig=str(kubeconfig), sleep=lambda s: None)
        from omaticaya_py.kube.heartbeat_lease import LeaseClient

        other = LeaseClient(probe.session, namespace=namespace, name="rbac-probe",
                            holder="probe", duration_s=10)
        wait_for("RBAC to let the token read its Node", probe.get_node, 20)
        wait_for("RBAC to let the token renew a Lease", other.renew, 20)
        assert holds()
        lease = leases.read_namespaced_lease(lease_name(node), namespace)
        assert lease.spec.holder_identity == POD
        clock.t = 40.0
        agent.tick()
        assert agent.cache.lease_renewals == 2 and agent.cache.lease_fallbacks == 0
        # nothing outside its own namespace: the Role is namespaced
        elsewhere = LeaseClient(probe.session, namespace="default", name="rbac-probe",
                                holder="probe", duration_s=10)
        from omaticaya_py.kube import KubeForbidden

        with pytest.raises(KubeForbidden):
            elsewhere.renew()
        probe.close()
        assert lease.metadata.owner_references[0].uid == admin_api.read_node(node).metadata.uid
        Daemon(agent).shutdown()  # the chart lets it delete its Lease on exit (cleanup_on_exit)
        with pytest.raises(ApiException) as gone:
            leases.read_namespaced_lease(lease_name(node), namespace)
        assert gone.value.status == 404
    finally:
        for doc in docs:
            try:
                if doc["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(doc["metadata"]["name"])
                elif doc["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(doc["metadata"]["name"])
            except ApiException:
                pass
