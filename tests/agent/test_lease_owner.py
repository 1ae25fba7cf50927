"""Leases owned by their Node and removed on uninstall (issue 23, item 8), on the real
kube-apiserver (dev cluster).

Each agent Lease carries an ownerReference to its Node as the kubelet's node Leases do (``v1``
``Node``, name and uid; no ``controller``, no ``blockOwnerDeletion``), set on create and added
to an older Lease on renewal; with kube-controller-manager's garbage collector running, deleting
the Node deletes the Lease. SIGTERM with cleanup_on_exit deletes the Lease the agent still holds
(never one a new pod took over), and ``omaticaya cleanup`` deletes it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.devcluster.cluster import bin_dir
from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.kube import NodeClient
from omaticaya_py.kube.heartbeat_lease import lease_name
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import ensure_namespace
from tests.helpers import H100_TRACE, Clock
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

NAMESPACE = "omaticaya-lease-owner"
POD = "omaticaya-agent-owner"


@pytest.fixture(scope="module")
def namespace(admin_api) -> str:
    return ensure_namespace(admin_api, NAMESPACE)


def make_agent(dev_cluster, node: str, pod: str = POD, **env) -> Agent:
    settings = load_settings(node_name=node, **env)
    clock = Clock()
    reader = TraceReader(H100_TRACE, loop=False, clock=clock)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    environ = {"POD_NAMESPACE": NAMESPACE, "POD_NAME": pod}
    return Agent(settings, reader, NodeApi(client, environ=environ), clock=clock)


def read_lease(leases, node: str):
    from kubernetes.client.exceptions import ApiException

    try:
        return leases.read_namespaced_lease(lease_name(node), NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def owners(lease) -> list[dict]:
    return [
        {k: v for k, v in ref.to_dict().items() if v is not None}
        for ref in lease.metadata.owner_references or ()
    ]


def test_the_lease_is_owned_by_its_node_as_the_kubelets_are(
    dev_cluster, admin_api, make_node, namespace, leases
) -> None:
    node = make_node()
    uid = admin_api.read_node(node).metadata.uid
    make_agent(dev_cluster, node).tick()
    lease = read_lease(leases, node)
    assert owners(lease) == [{"api_version": "v1", "kind": "Node", "name": node, "uid": uid}]


def test_an_older_lease_without_owner_gets_one_on_renewal(
    dev_cluster, admin_api, make_node, namespace, leases
) -> None:
    node = make_node()
    leases.create_namespaced_lease(NAMESPACE, {  # as an agent before ownerReferences wrote it
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease_name(node), "namespace": NAMESPACE},
        "spec": {"holderIdentity": "old-pod", "leaseDurationSeconds": 330},
    })
    make_agent(dev_cluster, node).tick()
    lease = read_lease(leases, node)
    assert owners(lease)[0]["uid"] == admin_api.read_node(node).metadata.uid
    assert lease.spec.holder_identity == POD


def test_sigterm_with_cleanup_deletes_the_lease_without_it_releases(
    dev_cluster, admin_api, make_node, namespace, leases
) -> None:
    node = make_node()
    agent = make_agent(dev_cluster, node)
    agent.tick()
    assert read_lease(leases, node) is not None
    Daemon(agent).cleanup_on_exit()  # what SIGTERM does, cleanup_on_exit true (the chart's default)
    assert read_lease(leases, node) is None

    kept = make_node()
    agent = make_agent(dev_cluster, kept, cleanup_on_exit=False)
    agent.tick()
    Daemon(agent).cleanup_on_exit()
    lease = read_lease(leases, kept)
    assert lease is not None and not lease.spec.holder_identity  # released, kept


def test_sigterm_leaves_a_lease_a_new_pod_took_over(
    dev_cluster, admin_api, make_node, namespace, leases
) -> None:
    node = make_node()
    old = make_agent(dev_cluster, node, pod="agent-old")
    old.tick()
    make_agent(dev_cluster, node, pod="agent-new").tick()  # a rolling update with surge
    Daemon(old).cleanup_on_exit()
    lease = read_lease(leases, node)
    assert lease is not None and lease.spec.holder_identity == "agent-new"


def test_omaticaya_cleanup_deletes_the_lease(
    dev_cluster, admin_api, make_node, namespace, leases
) -> None:
    node = make_node()
    make_agent(dev_cluster, node).tick()
    env = dict(dev_cluster.env(), NODE_NAME=node, POD_NAMESPACE=NAMESPACE)
    done = subprocess.run([sys.executable, "-m", "omaticaya_py", "cleanup"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"and Lease {NAMESPACE}/{lease_name(node)}" in done.stdout
    assert read_lease(leases, node) is None


# -- the garbage collector ------------------------------------------------------------------


def controller_manager_binary() -> Path:
    return bin_dir() / "kube-controller-manager"


@pytest.fixture
def garbage_collector(dev_cluster, tmp_path) -> Iterator[subprocess.Popen]:
    """kube-controller-manager with only the garbage collector, on the test's API server."""
    binary = controller_manager_binary()
    if not binary.exists():
        pytest.skip(f"{binary} not built (scripts/dev-cluster build --full)")
    log = open(tmp_path / "controller-manager.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(binary), "--kubeconfig", str(dev_cluster.kubeconfig), "--leader-elect=false",
         "--controllers=garbagecollector", "--secure-port=0", "--v=1"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    yield proc
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    log.close()


def test_deleting_the_node_deletes_its_lease(
    dev_cluster, admin_api, make_node, namespace, leases, garbage_collector, tmp_path
) -> None:
    node = make_node()
    make_agent(dev_cluster, node).tick()
    assert owners(read_lease(leases, node))
    admin_api.delete_node(node)
    gone = wait_for("the garbage collector to delete the Lease",
                    lambda: read_lease(leases, node) is None or garbage_collector.poll() is not None,
                    120)
    assert garbage_collector.poll() is None, (tmp_path / "controller-manager.log").read_text()[-3000:]
    assert gone and read_lease(leases, node) is None
