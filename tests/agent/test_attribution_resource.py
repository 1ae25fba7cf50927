"""Whose whole GPUs the kubelet lists: with the device plugin's whole-GPU resource renamed
(``OMATICAYA_DEVICE_PLUGIN_RESOURCE``, the chart's ``devicePluginResource``), the holders of
that resource are the GPU's holders, beside ``nvidia.com/*`` (NVIDIA's own plugin) and the
shared resource; any other resource is not ours (issue 38, fault 4: a GPU assigned under
``example.com/gpu`` looked free, and a 70 GB pod was handed a GPU with 10 GB).

Through ``Attribution`` (built from the settings, as the agent builds it) over a local gRPC
server speaking the kubelet's PodResources v1 API."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from omaticaya_py.agent.attribution_reader import Attribution, make_attribution
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import MULTI_TRACE

RENAMED = "example.com/gpu"
SHARED = "example.com/gpu-memory"


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Pod ``ml/<resource>`` holds ``device`` of that resource, for each ``(resource, device)``."""

    def __init__(self, held: list[tuple[str, str]]) -> None:
        self.held = held

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(name=resource, namespace="ml", containers=[
                api_pb2.ContainerResources(name="app", devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=[device]),
                ]),
            ])
            for resource, device in self.held
        ])  # fmt: skip


@pytest.fixture
def uuids() -> list[str]:
    snapshot = TraceReader(MULTI_TRACE, at_s=0.0).read()
    return [g.uuid for g in snapshot.gpus if g.uuid]


def _serve(tmp_path: Path, held: list[tuple[str, str]]) -> tuple[grpc.Server, Path]:
    socket_path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(held), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server, socket_path


@pytest.fixture
def edge(tmp_path: Path, uuids: list[str]) -> Iterator[Attribution]:
    held = [
        (RENAMED, uuids[0]),  # ours, renamed
        ("nvidia.com/gpu", uuids[1]),  # NVIDIA's plugin beside ours
        (SHARED, uuids[2] + "::0"),  # a slice of our shared resource
        ("example.com/fpga", uuids[3]),  # not a GPU resource: not ours to report
    ]
    server, socket_path = _serve(tmp_path, held)
    settings = load_settings(
        node_name="n", device_plugin_resource=RENAMED, shared_resource=SHARED,
        pod_resources_socket=socket_path, proc_root=None,
    )  # fmt: skip
    att = make_attribution(settings)
    assert att is not None
    try:
        yield att
    finally:
        att.close()
        server.stop(None)


def test_the_renamed_whole_gpu_resource_keeps_its_holders(edge: Attribution, uuids: list[str]):
    got = edge.observe(TraceReader(MULTI_TRACE, at_s=0.0).read())
    assert edge.listed
    holders = {u: [(h.pod, h.resource_name) for h in got[u].holders] for u in uuids[:4]}
    assert holders == {
        uuids[0]: [(RENAMED, RENAMED)],
        uuids[1]: [("nvidia.com/gpu", "nvidia.com/gpu")],
        uuids[2]: [(SHARED, SHARED)],
        uuids[3]: [],
    }
