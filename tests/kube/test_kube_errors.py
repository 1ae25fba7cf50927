"""The kube edge's errors (``kube/errors.py``): one class per answer, as kopf splits them, and
the RBAC hint said by the caller that made the request, never guessed for it.

Table-driven on ``wrap`` with the client's own ``ApiException``; then the real kube-apiserver
refusing a service account with no RBAC: a pod GET is told about pods, a Node PATCH about nodes.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from omaticaya_py.kube import (
    ApiSession,
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeRejected,
    KubeTooManyRequests,
    KubeUnauthorized,
    KubeUnavailable,
    NodeClient,
)
from omaticaya_py.kube.errors import is_transient, wrap
from omaticaya_py.kube.pod_client import PodClient


def _exc(status: int, message: str = "", retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="Reason", body=json.dumps({"message": message}))
    exc.headers = {"Retry-After": retry_after} if retry_after else {}
    return exc


@pytest.mark.parametrize(
    ("status", "kind", "transient_for_patch", "transient_for_create"),
    [
        (401, KubeUnauthorized, False, False),
        (403, KubeForbidden, False, False),
        (404, KubeNotFound, False, False),
        (409, KubeConflict, True, False),
        (422, KubeRejected, False, False),
        (429, KubeTooManyRequests, True, True),
        (500, KubeUnavailable, True, True),
        (503, KubeUnavailable, True, True),
    ],
)
def test_each_status_has_its_class(status, kind, transient_for_patch, transient_for_create):
    patch = wrap(_exc(status), "patch", "node n")
    assert type(patch) is kind and patch.status == status and patch.verb == "patch"
    assert is_transient(patch) is transient_for_patch
    assert is_transient(wrap(_exc(status), "create", "event e")) is transient_for_create


def test_a_401_is_a_refusal_as_a_403_is():
    # callers that pause on any refusal (agent.outage) catch KubeForbidden
    assert isinstance(wrap(_exc(401), "get", "node n"), KubeForbidden)
    assert not isinstance(wrap(_exc(403), "get", "node n"), KubeUnauthorized)


def test_no_answer_is_unavailable_and_retry_after_is_kept():
    err = wrap(ConnectionRefusedError("refused"), "get", "node n")
    assert type(err) is KubeUnavailable and err.status is None and is_transient(err)
    assert wrap(_exc(429, retry_after="7"), "patch", "node n").retry_after_s == 7.0


@pytest.mark.parametrize(
    ("rbac", "expected"),
    [
        ("", "get pod ns/p: HTTP 403 Reason: pods is forbidden"),
        ("the agent needs get on pods in ns",
         "get pod ns/p: HTTP 403 Reason: pods is forbidden (RBAC: the agent needs get on pods in ns)"),
    ],
)
def test_the_rbac_hint_is_the_callers(rbac, expected):
    err = wrap(_exc(403, "pods is forbidden"), "get", "pod ns/p", rbac)
    assert str(err) == expected
    # only a 403 carries it: a 404 or a 401 is no RBAC matter
    assert "RBAC" not in str(wrap(_exc(404), "get", "pod ns/p", rbac))
    assert "RBAC" not in str(wrap(_exc(401), "get", "pod ns/p", rbac))


@pytest.mark.parametrize("detail", [
    "nodes \"n\" is forbidden: ValidatingAdmissionPolicy 'omaticaya-node-writes' with binding "
    "'omaticaya-node-writes' denied request: the omaticaya agent may only add, change or remove "
    "Node labels under omaticaya.io/",
    "admission webhook \"v.example.com\" denied the request: no",
])
def test_a_refusal_by_admission_gets_no_rbac_hint(detail):
    """RBAC allowed the request; an admission policy refused it: the hint would mislead."""
    err = wrap(_exc(403, detail), "patch", "node n", "the agent needs get and patch on nodes")
    assert str(err) == f"patch node n: HTTP 403 Reason: {detail}"


@pytest.mark.cluster
def test_a_refused_pod_get_names_pods_and_a_refused_patch_nodes(
    dev_cluster, admin_api, make_node, tmp_path
):
    from tests.views.views_cluster_support import _token_kubeconfig

    node = make_node()
    kubeconfig = str(_token_kubeconfig(dev_cluster, admin_api, tmp_path, f"errors-{node}"))
    session = ApiSession(kubeconfig=kubeconfig, sleep=lambda s: None)
    try:
        with pytest.raises(KubeForbidden) as pod:
            PodClient(session, node).get_pod("default", "nope")
        assert "403" in str(pod.value) and "RBAC: the agent needs get on pods in default" in str(
            pod.value
        )
        assert "nodes" not in str(pod.value).partition("(RBAC")[2]
        with pytest.raises(KubeForbidden) as patch:
            NodeClient(node, session=session).patch_node({"metadata": {"labels": {"a": "b"}}})
        assert "RBAC: the agent needs get and patch on nodes" in str(patch.value)
        assert "pods" not in str(patch.value).partition("(RBAC")[2]
        assert isinstance(patch.value, KubeError)
    finally:
        session.close()
