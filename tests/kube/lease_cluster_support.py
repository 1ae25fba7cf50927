"""What other test files share of test_lease_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.kube import NodeClient
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import ensure_namespace
from tests.helpers import H100_TRACE, Clock

NAMESPACE = "omaticaya-lease-test"


POD = "omaticaya-agent-x7k2p"


@pytest.fixture(scope="module")
def namespace(admin_api) -> str:
    return ensure_namespace(admin_api, NAMESPACE)


def make_agent(kubeconfig, node: str, namespace: str, clock: Clock, **env) -> Agent:
    settings = load_settings(node_name=node, **env)
    reader = TraceReader(H100_TRACE, loop=False, window_s=2.0, clock=clock)
    client = NodeClient(node, kubeconfig=str(kubeconfig), sleep=lambda s: None)
    environ = {"POD_NAMESPACE": namespace, "POD_NAME": POD}
    return Agent(settings, reader, NodeApi(client, environ=environ), clock=clock)
