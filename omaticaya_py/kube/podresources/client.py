"""A thin client of the kubelet's PodResources API (gRPC v1 ``List``): which container holds
which device, as ``core.rules.attribution.ContainerDevices`` values.

The kubelet serves it on a unix socket, ``<kubelet --root-dir>/pod-resources/kubelet.sock``
(``/var/lib/kubelet/pod-resources/kubelet.sock`` by default), from v1.20 on for API v1. No
credentials: whoever can open the socket may list. One call per ``list()``, no retries: the
caller asks again on its next tick.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ...core.rules.attribution import ContainerDevices

if TYPE_CHECKING:
    import grpc

__all__ = [
    "DEFAULT_SOCKET",
    "PodResourcesAbsent",
    "PodResourcesCallFailed",
    "PodResourcesClient",
    "PodResourcesError",
]

#: the kubelet's socket with its default --root-dir (/var/lib/kubelet)
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: a List answer lists every pod on the node; allow more than gRPC's default 4 MiB
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    # after a kubelet restart, reconnect within seconds rather than gRPC's 120 s backoff cap
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class PodResourcesError(Exception):
    """The PodResources API could not be read; ``socket_path`` names the socket asked."""

    def __init__(self, message: str, socket_path: Path) -> None:
        super().__init__(message)
        self.socket_path = socket_path


class PodResourcesAbsent(PodResourcesError):
    """No socket at the path: no kubelet there, a different ``--root-dir``, or the folder is not
    mounted into this container. Nothing was called."""


class PodResourcesCallFailed(PodResourcesError):
    """The socket is there but ``List`` failed. ``code`` is the gRPC status name
    (``UNAVAILABLE``: nobody answers, e.g. a socket left by a stopped kubelet;
    ``UNIMPLEMENTED``: a kubelet older than v1.20, which serves v1alpha1 only;
    ``DEADLINE_EXCEEDED``: no answer within the timeout); ``details`` is gRPC's text."""

    def __init__(self, message: str, socket_path: Path, code: str, details: str) -> None:
        super().__init__(message, socket_path)
        self.code = code
        self.details = details


class PodResourcesClient:
    """Lists the kubelet's device assignments over ``socket_path`` (see ``DEFAULT_SOCKET``).

    ``timeout_s`` bounds each ``list()`` call (seconds). The gRPC channel is opened on the first
    call, kept for the next ones, and dropped after a failed call so that the next one starts
    afresh. Thread-safe as gRPC channels are; ``close()`` (or ``with``) releases it.
    """

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET, *, timeout_s: float = 5.0) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None

    def list(self) -> tuple[ContainerDevices, ...]:
        """One ``ContainerDevices`` per (pod, container, resource) that holds devices, in the
        kubelet's order: namespace, pod name, container name, resource name (e.g.
        ``nvidia.com/gpu``) and device IDs (for our plugin: GPU or MIG UUIDs). A container's
        DRA devices (``dynamic_resources``) come after, one entry per driver: its name as the
        resource name, each device as ``<pool>/<device name>`` (for ``gpu.omaticaya.io``:
        ``<node>/gpu-3``). Containers without devices do not appear.

        Raises ``PodResourcesAbsent`` when there is no socket at ``socket_path``, and
        ``PodResourcesCallFailed`` when the call fails (see its ``code``).
        """
        self._check_socket()
        # grpc (~9 MiB of RSS) is loaded once a socket is there, not by an agent without a kubelet
        import grpc

        from .v1 import api_pb2, api_pb2_grpc

        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path.absolute()}", options=_CHANNEL_OPTIONS
            )
        stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self.close()
            code = exc.code().name if exc.code() is not None else "UNKNOWN"
            details = exc.details() or ""
            raise PodResourcesCallFailed(
                f"PodResources List on {self.socket_path} failed: {code} {details}".rstrip(),
                self.socket_path,
                code,
                details,
            ) from None
        # one entry per container and resource: a kubelet splits a container's devices of one
        # resource into an entry per topology group (1.37 sends one per device), 1.20 sent one
        merged: dict[tuple[str, str, str, str], list[str]] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    key = (pod.namespace, pod.name, container.name, devices.resource_name)
                    merged.setdefault(key, []).extend(devices.device_ids)
                # DRA (1.27+): each claim's devices, as ``<pool>/<device>`` under the driver
                for claim in container.dynamic_resources:
                    for r in claim.claim_resources:
                        key = (pod.namespace, pod.name, container.name, r.driver_name)
                        merged.setdefault(key, []).append(f"{r.pool_name}/{r.device_name}")
        return tuple(
            ContainerDevices(
                namespace=namespace,
                pod=pod_name,
                container=container_name,
                resource_name=resource,
                device_ids=tuple(ids),
            )
            for (namespace, pod_name, container_name, resource), ids in merged.items()
        )

    def _check_socket(self) -> None:
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise PodResourcesAbsent(
                f"no kubelet PodResources socket at {self.socket_path}", self.socket_path
            ) from None
        except OSError as exc:
            raise PodResourcesAbsent(
                f"kubelet PodResources socket {self.socket_path} cannot be reached: {exc.strerror}",
                self.socket_path,
            ) from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesAbsent(f"{self.socket_path} is not a socket", self.socket_path)

    def close(self) -> None:
        """Close the channel (a later ``list()`` opens a new one)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
