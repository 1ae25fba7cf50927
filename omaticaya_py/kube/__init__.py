"""The Kubernetes edge: the only package that imports the ``kubernetes`` client.

``ApiSession`` talks to the API server (configuration, credentials, retries, accounting);
``NodeClient`` reads and merge-patches the agent's own Node and posts Events on it;
``NodeCache`` lists and watches every Node for the scheduler extender (``LeaseCache`` the
agents' Leases); ``errors`` holds the
``KubeError`` family that nothing above this package sees library types through.
"""

from .cache import NodeCache
from .errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeRejected,
    KubeTooManyRequests,
    KubeUnauthorized,
    KubeUnavailable,
)
from .lease import LeaseClient as LeaseClient
from .leases import LeaseCache
from .nodes import MERGE_PATCH, NodeClient
from .pods import PodCache
from .quantity import parse_quantity
from .session import ApiSession
from .workloads import stop_daemonset as stop_daemonset

__all__ = [
    "MERGE_PATCH",
    "ApiSession",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeNotFound",
    "KubeRejected",
    "KubeTooManyRequests",
    "KubeUnauthorized",
    "KubeUnavailable",
    "LeaseCache",
    "NodeCache",
    "NodeClient",
    "PodCache",
    "parse_quantity",
]
