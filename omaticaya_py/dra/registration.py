"""The DRA plugin's registration with the kubelet: the ``pluginregistration.Registration``
service on ``<OMATICAYA_DRA_REGISTRY_DIR>/<driver>-reg.sock``, which the kubelet's plugin watcher
finds (inotify, and a walk of the folder at its own start, so that a restarted kubelet registers
the plugin again by itself), asks ``GetInfo`` and answers with ``NotifyRegistrationStatus``.

The kubelet's constants (its ``pluginmanager`` and ``cm/dra``, v1.37): the plugin type
``DRAPlugin``; the supported versions are registration names of the services, not gRPC paths.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.publish.dra import DRIVER
from .pluginregistration import api_pb2 as reg_pb2
from .pluginregistration import api_pb2_grpc as reg_grpc

__all__ = ["DRA_SOCKET", "PLUGIN_TYPE", "SUPPORTED_VERSIONS", "RegistrationService",
           "registration_socket_name"]  # fmt: skip

#: the kubelet's plugin type for DRA drivers (pluginregistration v1 ``DRAPlugin``)
PLUGIN_TYPE = "DRAPlugin"
#: the gRPC services advertised as "supported versions" (the kubelet's constants
#: ``DRAPluginService``, ``DRAResourceHealthService``: registration names, not gRPC paths)
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
#: the DRA socket's name in the plugin folder (``OMATICAYA_DRA_PLUGIN_DIR``)
DRA_SOCKET = "dra.sock"


def registration_socket_name(driver: str = DRIVER) -> str:
    """``<driver>-reg.sock``: the registration socket's name in the registry folder."""
    return f"{driver}-reg.sock"


class RegistrationService(reg_grpc.RegistrationServicer):
    """``pluginregistration.Registration`` for the driver ``gpu.omaticaya.io``: ``GetInfo``
    answers type ``DRAPlugin``, the driver's name, ``endpoint`` (the DRA socket's path, as the
    kubelet dials it: the same path on the host and in the plugin's container) and
    ``SUPPORTED_VERSIONS``; ``NotifyRegistrationStatus`` hands the kubelet's answer to
    ``status(registered, error)``."""

    def __init__(self, endpoint: Path, status: Callable[[bool, str], None]) -> None:
        self.endpoint = endpoint
        self.status = status

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )  # fmt: skip

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.status(bool(request.plugin_registered), str(request.error))
        return reg_pb2.RegistrationStatusResponse()
