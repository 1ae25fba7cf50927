"""Hardening of the Kubernetes edge (``omaticaya_py/kube/``) against the real kube-apiserver,
with faults injected by ``tests/faultproxy.py``."""

from __future__ import annotations

import pytest

from omaticaya_py.kube import NodeClient
from tests.faultproxy import Fault, FaultProxy
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
P = "omaticaya.io/"


@pytest.fixture
def proxy(dev_cluster):
    p = FaultProxy(dev_cluster)
    yield p
    p.close()


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
