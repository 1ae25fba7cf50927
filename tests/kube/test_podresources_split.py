"""The PodResources client over a real gRPC server: a kubelet that splits one container's devices
of one resource into several ``ContainerDevices`` entries (kubelet 1.37 sends one per device,
each with its topology; 1.20 sent one) is read as one entry per container and resource, the IDs
in the kubelet's order. Seen on the real kubelet 1.37.2: a 20-unit slice came back as 20 entries
of one unit, and the agent published the pod as 20 holders of 1 GiB each."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from omaticaya_py.core.rules.attribution import ContainerDevices
from omaticaya_py.kube.podresources.client import PodResourcesClient
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc


def _devices(resource: str, *ids: str, numa: int = 0) -> api_pb2.ContainerDevices:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)])
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids), topology=topology)


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        app = api_pb2.ContainerResources(name="app", devices=[
            _devices("omaticaya.io/gpu-memory", "GPU-a::0"),
            _devices("nvidia.com/gpu", "GPU-b"),
            _devices("omaticaya.io/gpu-memory", "GPU-a::1", numa=1),
            _devices("omaticaya.io/gpu-memory", "GPU-a::2"),
        ])
        side = api_pb2.ContainerResources(name="sidecar", devices=[
            _devices("omaticaya.io/gpu-memory", "GPU-c::0"),
        ])
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(name="p", namespace="ns", containers=[app, side]),
            api_pb2.PodResources(name="q", namespace="ns", containers=[
                api_pb2.ContainerResources(name="app", devices=[_devices("nvidia.com/gpu", "GPU-d")]),
            ]),
        ])


@pytest.fixture
def client(tmp_path: Path) -> Iterator[PodResourcesClient]:
    socket_path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    c = PodResourcesClient(socket_path)
    try:
        yield c
    finally:
        c.close()
        server.stop(None)


def test_entries_of_one_container_and_resource_are_one(client: PodResourcesClient) -> None:
    assert client.list() == (
        ContainerDevices("ns", "p", "app", "omaticaya.io/gpu-memory",
                         ("GPU-a::0", "GPU-a::1", "GPU-a::2")),
        ContainerDevices("ns", "p", "app", "nvidia.com/gpu", ("GPU-b",)),
        ContainerDevices("ns", "p", "sidecar", "omaticaya.io/gpu-memory", ("GPU-c::0",)),
        ContainerDevices("ns", "q", "app", "nvidia.com/gpu", ("GPU-d",)),
    )


class _DraKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """A kubelet 1.27+ with containers holding DRA claims (``dynamic_resources``)."""

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        def claim(name: str, *devices: tuple[str, str, str]) -> api_pb2.DynamicResource:
            return api_pb2.DynamicResource(claim_name=name, claim_namespace="ns", claim_resources=[
                api_pb2.ClaimResource(driver_name=d, pool_name=p, device_name=n)
                for d, p, n in devices])  # fmt: skip

        app = api_pb2.ContainerResources(name="app", dynamic_resources=[
            claim("one", ("gpu.omaticaya.io", "node-a", "gpu-3")),
            claim("two", ("gpu.omaticaya.io", "node-a", "gpu-0-mig-1"),
                  ("nic.example.com", "node-a", "eth1")),
        ], devices=[_devices("nvidia.com/gpu", "GPU-b")])
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(name="r", namespace="ns", containers=[app]),
        ])


def test_dra_devices_are_listed_per_driver_as_pool_and_device(tmp_path: Path) -> None:
    socket_path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_DraKubelet(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    c = PodResourcesClient(socket_path)
    try:
        assert c.list() == (
            ContainerDevices("ns", "r", "app", "nvidia.com/gpu", ("GPU-b",)),
            ContainerDevices("ns", "r", "app", "gpu.omaticaya.io",
                             ("node-a/gpu-3", "node-a/gpu-0-mig-1")),
            ContainerDevices("ns", "r", "app", "nic.example.com", ("node-a/eth1",)),
        )
    finally:
        c.close()
        server.stop(None)
