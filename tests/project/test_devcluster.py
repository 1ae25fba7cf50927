"""Checks of the dev cluster itself (real etcd + kube-apiserver), stdlib only.

The ``dev_cluster`` fixture comes from tests/devcluster.py (loaded by
tests/conftest.py).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

from devtools.devcluster.cluster import K8S_VERSION, minor
from tests.devcluster import DevCluster

# the real dev cluster's processes (kube-apiserver, etcd): not in `scripts/test --quick`
pytestmark = pytest.mark.cluster


def _request(
    cluster: DevCluster, method: str, path: str, body: Any = None, timeout: float = 10
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        cluster.server + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=cluster.ssl_context(), timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _create_node(cluster: DevCluster, name: str) -> dict:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"omaticaya.test/created": "true"}},
    }
    status, obj = _request(cluster, "POST", "/api/v1/nodes", node)
    assert status == 201, (status, obj)
    return obj


def test_readyz_ok(dev_cluster: DevCluster) -> None:
    status, body = _request(dev_cluster, "GET", "/readyz")
    assert (status, body) == (200, "ok")
    status, version = _request(dev_cluster, "GET", "/version")
    # the release under test, stamped at build time (not v0.0.0-master)
    assert status == 200 and version["gitVersion"] == K8S_VERSION, version
    assert (version["major"], version["minor"]) == ("1", str(minor(K8S_VERSION))), version


def test_create_and_get_node(dev_cluster: DevCluster) -> None:
    name = f"node-{uuid.uuid4().hex[:8]}"
    created = _create_node(dev_cluster, name)
    assert created["metadata"]["name"] == name

    status, got = _request(dev_cluster, "GET", f"/api/v1/nodes/{name}")
    assert status == 200, got
    assert got["metadata"]["labels"]["omaticaya.test/created"] == "true"
    assert got["metadata"]["uid"] == created["metadata"]["uid"]

    # the audit log (Metadata level) records the request
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        events = [json.loads(line) for line in dev_cluster.audit_lines()]
        hits = [
            e
            for e in events
            if e.get("verb") == "create"
            and e.get("objectRef", {}).get("resource") == "nodes"
            and e.get("objectRef", {}).get("name") == name
        ]
        if hits:
            break
        time.sleep(0.1)
    assert hits and hits[0]["user"]["username"] == "admin"


def test_apiserver_outage_and_restart_keeps_data(dev_cluster: DevCluster) -> None:
    name = f"node-{uuid.uuid4().hex[:8]}"
    uid = _create_node(dev_cluster, name)["metadata"]["uid"]

    dev_cluster.stop_apiserver()
    try:
        assert not dev_cluster.readyz()
        try:
            _request(dev_cluster, "GET", f"/api/v1/nodes/{name}", timeout=3)
        except urllib.error.URLError as e:
            assert isinstance(e.reason, ConnectionRefusedError), e
        else:
            raise AssertionError("apiserver still answering after stop_apiserver()")
    finally:
        dev_cluster.start_apiserver()

    assert dev_cluster.readyz()
    status, got = _request(dev_cluster, "GET", f"/api/v1/nodes/{name}")
    assert status == 200, got
    assert got["metadata"]["uid"] == uid  # etcd kept it across the restart
