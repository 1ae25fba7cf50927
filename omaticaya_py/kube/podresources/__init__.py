"""The kubelet's PodResources API: ``PodResourcesClient`` lists which container holds which
device (gRPC v1 ``List`` on ``<kubelet root>/pod-resources/kubelet.sock``); ``v1`` holds the
modules generated from ``v1/api.proto`` by ``scripts/gen-podresources-proto``."""

from .client import (
    DEFAULT_SOCKET,
    PodResourcesAbsent,
    PodResourcesCallFailed,
    PodResourcesClient,
    PodResourcesError,
)

__all__ = [
    "DEFAULT_SOCKET",
    "PodResourcesAbsent",
    "PodResourcesCallFailed",
    "PodResourcesClient",
    "PodResourcesError",
]
