"""The gRPC services of the DRA socket (``<OMATICAYA_DRA_PLUGIN_DIR>/dra.sock``):
``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` (``NodePrepareResources``,
``NodeUnprepareResources``) and ``DRAResourceHealth`` v1 and v1alpha1 (``NodeWatchResources``:
the kubelet calls the health service on the DRA endpoint). Each answers from the plugin
(``Driver``: ``plugin.DraPlugin``) one claim at a time; one claim's error is its answer's
``error``, never the whole call's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from . import healthreport as dra_health
from .health.v1 import api_pb2 as health_v1_pb2
from .health.v1 import api_pb2_grpc as health_v1_grpc
from .health.v1alpha1 import api_pb2 as health_v1alpha1_pb2
from .health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from .prepare import ClaimRef
from .v1 import api_pb2 as dra_pb2
from .v1 import api_pb2_grpc as dra_grpc

__all__ = ["Driver", "add_dra_services"]


class Driver(Protocol):
    """What the services ask the plugin (``plugin.DraPlugin``)."""

    #: the ResourceSlice's pool: the Node's name
    pool: str
    #: the kubelet shows a device Unknown this long after its last report, seconds
    health_timeout_s: int

    def prepare(self, ref: ClaimRef) -> tuple[list[dict[str, Any]], str]:
        """One claim's devices (the kubelet's ``Device`` fields each) or ``([], error)``."""
        ...

    def unprepare(self, ref: ClaimRef) -> str:
        """``""`` or the error."""
        ...

    def health_reports(self, active: Callable[[], bool]) -> Iterator[tuple[dra_health.DeviceHealth, ...]]:
        """The health stream, until ``active()`` turns false or the plugin stops."""
        ...


class _Node(dra_grpc.DRAPluginServicer):
    def __init__(self, plugin: Driver) -> None:
        self.plugin = plugin

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            devices, error = self.plugin.prepare(ref)
            answer = response.claims[claim.uid]
            if error:
                answer.error = error
                continue
            for d in devices:
                device = answer.devices.add(
                    request_names=list(d.get("request_names", ())), pool_name=d["pool_name"],
                    device_name=d["device_name"], cdi_device_ids=list(d.get("cdi_device_ids", ())),
                )  # fmt: skip
                if d.get("share_id"):
                    device.share_id = d["share_id"]
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            error = self.plugin.unprepare(ClaimRef(claim.namespace, claim.name, claim.uid))
            answer = response.claims[claim.uid]
            if error:
                answer.error = error
        return response


def _health_servicer(base: type, pb2: Any, plugin: Driver) -> Any:
    """A ``DRAResourceHealth`` servicer of one API version (``pb2``: its messages)."""

    class Servicer(base):
        def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
            for report in plugin.health_reports(context.is_active):
                yield pb2.NodeWatchResourcesResponse(devices=[
                    pb2.DeviceHealth(
                        device=pb2.DeviceIdentifier(pool_name=plugin.pool, device_name=h.device),
                        health=h.status, last_updated_time=int(time.time()),
                        health_check_timeout_seconds=plugin.health_timeout_s, message=h.message,
                    )
                    for h in report
                ])  # fmt: skip

    return Servicer()


def add_dra_services(server: grpc.Server, plugin: Driver) -> None:
    """Add ``DRAPlugin`` v1 and ``DRAResourceHealth`` v1 and v1alpha1, over ``plugin``, to
    ``server``."""
    dra_grpc.add_DRAPluginServicer_to_server(_Node(plugin), server)
    health_v1_grpc.add_DRAResourceHealthServicer_to_server(
        _health_servicer(health_v1_grpc.DRAResourceHealthServicer, health_v1_pb2, plugin), server)
    health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
        _health_servicer(health_v1alpha1_grpc.DRAResourceHealthServicer, health_v1alpha1_pb2,
                         plugin), server)  # fmt: skip
