"""The Lease's name and namespace (kube/heartbeat_lease.py), without an API server."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.render import is_valid_key  # a DNS subdomain check is part of it
from omaticaya_py.kube.heartbeat_lease import lease_name, lease_namespace


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("gpu-node-1", "omaticaya-node-gpu-node-1"),
        ("ip-10-0-0-1.ec2.internal", "omaticaya-node-ip-10-0-0-1.ec2.internal"),
        ("GPU_Node", "omaticaya-node-gpu-node"),
        ("a" * 253, "omaticaya-node-" + "a" * 238),
        ("node-", "omaticaya-node-node"),
    ],
)
def test_lease_name_is_a_valid_object_name(node, expected):
    name = lease_name(node)
    assert name == expected
    assert len(name) <= 253 and is_valid_key(f"{name}/x")


def test_namespace_from_the_downward_api_then_the_service_account(tmp_path):
    ns_file = tmp_path / "namespace"
    assert lease_namespace({"POD_NAMESPACE": "gpu-system"}, str(ns_file)) == "gpu-system"
    assert lease_namespace({}, str(ns_file)) is None  # outside a cluster: none of its own
    ns_file.write_text("omaticaya\n")
    assert lease_namespace({}, str(ns_file)) == "omaticaya"
    assert lease_namespace({"POD_NAMESPACE": " "}, str(ns_file)) == "omaticaya"


class FakeLease:
    """A LeaseClient stand-in whose renew() raises ``error`` (or succeeds)."""

    ref = "ns/omaticaya-node-n"

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.calls = 0

    def renew(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error


def _agent(lease):
    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.core.config.settings import load_settings
    from omaticaya_py.sources.replay import TraceReader
    from tests.helpers import H100_TRACE

    settings = load_settings(node_name="n", heartbeat_s=30)
    reader = TraceReader(H100_TRACE, at_s=3.0, loop=False)
    return Agent(settings, reader, NodeApi(None, lease=lease))


def test_a_403_falls_back_for_good_a_401_or_an_outage_does_not():
    from omaticaya_py.kube import KubeForbidden, KubeUnavailable

    forbidden = FakeLease(KubeForbidden("HTTP 403", status=403))
    agent = _agent(forbidden)
    result = agent.tick()
    assert agent.lease is None and agent.cache.lease_fallbacks == 1
    assert '"refresh_s"' in result.desired.annotations["omaticaya.io/telemetry"]
    agent.tick()
    assert forbidden.calls == 1  # never asked again

    for error in (KubeForbidden("HTTP 401", status=401), KubeUnavailable("no answer")):
        lease = FakeLease(error)
        agent = _agent(lease)
        agent.tick()
        agent.tick()  # still due: tried again each tick
        assert agent.lease is lease and lease.calls == 2
        assert agent.cache.lease_failures == 2 and agent.cache.lease_fallbacks == 0


def test_in_lease_mode_the_telemetry_names_the_lease():
    agent = _agent(FakeLease(None))
    result = agent.tick()
    doc = result.desired.annotations["omaticaya.io/telemetry"]
    assert '"lease":"ns/omaticaya-node-n"' in doc and '"expires_at"' not in doc
    assert agent.cache.lease_renewals == 1
