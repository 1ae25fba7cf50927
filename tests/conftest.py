"""Shared fixtures: the real dev cluster, an admin client, and throwaway Nodes."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart import helm  # noqa: F401  (session fixture)
from tests.devcluster import DevCluster, dev_cluster  # noqa: F401  (session fixture)

_names = itertools.count()


#: a test module that uses the machine's one kubelet says so in its ``pytestmark``
#: (tests/project/test_layout.py holds every module that starts it to the mark)
_KUBELET_MARK = "pytest.mark.kubelet"


@functools.cache
def _marks_kubelet(root: Path, module: str) -> bool:
    path = root / module
    return path.is_file() and _KUBELET_MARK in path.read_text()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist with ``--dist loadscope`` (the whole run of ``scripts/test``): one work
    unit per test module, so a module's tests stay on one worker (they share module-scoped
    fixtures: an agent, a device plugin, a dev cluster of their own), and one unit, "kubelet",
    for every module marked ``kubelet``: the machine has one kubelet (its device-plugin socket
    is a fixed path), so those modules run one after another on one worker while the others
    take the rest. Each worker brings up its own dev cluster (a session fixture). (Not
    ``--dist loadgroup``: its marks no longer reach the scheduler with pytest 9.2, whose node ids
    xdist 3.8 cannot suffix.)"""
    if config.getoption("dist", "no") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "kubelet" if _marks_kubelet(root, module) else module

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker: the modules marked ``kubelet`` first (the scheduler's work
    units follow the collection's order, so the longest unit starts at once)."""
    if not hasattr(config, "workerinput"):
        return
    kubelet = [i for i in items if i.get_closest_marker("kubelet") is not None]
    rest = [i for i in items if i.get_closest_marker("kubelet") is None]
    items[:] = kubelet + rest


@pytest.fixture(scope="session")
def admin_client(dev_cluster: DevCluster):  # noqa: F811
    """``kubernetes.client.ApiClient`` as cluster admin (client certificate), for any API group;
    closed when the session ends (tests never close it)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(dev_cluster.kubeconfig), client_configuration=cfg)
    api_client = client.ApiClient(cfg)
    yield api_client
    api_client.close()


@pytest.fixture(scope="session")
def admin_api(admin_client):
    """``kubernetes.client.CoreV1Api`` as cluster admin (client certificate)."""
    from kubernetes import client

    return client.CoreV1Api(admin_client)


def ensure_namespace(admin_api, name: str) -> str:
    """Create Namespace ``name`` unless it exists; returns ``name``."""
    from kubernetes.client.exceptions import ApiException

    try:
        admin_api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    return name


@pytest.fixture(scope="session")
def scheduling_cluster(dev_cluster: DevCluster) -> DevCluster:  # noqa: F811
    """The dev cluster with the default kube-scheduler running (``up --scheduler``, idempotent;
    built on first use)."""
    dev_cluster.start_scheduler()
    return dev_cluster


@pytest.fixture(scope="session")
def leases(admin_client):
    """``kubernetes.client.CoordinationV1Api`` as cluster admin."""
    from kubernetes import client

    return client.CoordinationV1Api(admin_client)


@pytest.fixture
def make_node(admin_api) -> Iterator[Callable[..., str]]:
    """Create Nodes with a unique name and foreign labels/annotations; delete them after."""
    created: list[str] = []

    def make(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> str:
        name = f"gpu-node-{os.getpid()}-{next(_names)}"
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "nvidia.com/gpu.present": "true",
                    **(labels or {}),
                },
                "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
            },
        }
        admin_api.create_node(body)
        created.append(name)
        return name

    yield make
    from kubernetes.client.exceptions import ApiException

    for name in created:
        try:
            admin_api.delete_node(name)
        except ApiException:
            pass


def node_metadata(admin_api, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) of a Node, read as admin."""
    node = admin_api.read_node(name)
    return dict(node.metadata.labels or {}), dict(node.metadata.annotations or {})
