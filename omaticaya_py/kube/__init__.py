"""The Kubernetes edge: the only package that imports the ``kubernetes`` client.

One module per thing held, named by it:

- ``session``: ``ApiSession``, requests to the API server (configuration, credentials,
  retries, accounting); ``errors``: the ``KubeError`` family, so that nothing above this
  package sees library types.
- ``node_client``: ``NodeClient``, the agent's own Node (GET, merge patch) and its Events;
  ``heartbeat_lease``: ``LeaseClient``, the agent's own liveness Lease;
  ``pod_client``: ``PodClient``, single pods read and given Events (shared-GPU slices);
  ``index_moved``: a shared GPU index that moved since the last start, as the Node's Event and
  a gauge (the DRA plugin's and the device plugin's report).
- ``informer``: ``Informer``, the one list+watch loop (``listwatch``: its requests;
  ``informer_options``: its options and hooks), and the
  caches over it: ``node_cache`` (``NodeCache``, every Node: the extender, ``omaticaya top``),
  ``lease_cache`` (``LeaseCache``, the agents' Leases), ``pod_cache`` (``PodCache``).
- ``workloads``: stopping a DaemonSet (the chart's pre-delete hook); ``agent_nodes``: whether the
  agent labelled the Nodes its DaemonSet runs on (the chart's ``helm test``); ``quantity``;
  ``podresources``: the kubelet's PodResources API.
"""

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
from .heartbeat_lease import LeaseClient
from .lease_cache import LeaseCache
from .node_cache import NodeCache
from .node_client import MERGE_PATCH, NodeClient
from .pod_cache import PodCache
from .quantity import parse_quantity
from .session import ApiSession
from .workloads import StopWait, stop_daemonset

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
    "LeaseClient",
    "NodeCache",
    "NodeClient",
    "PodCache",
    "StopWait",
    "parse_quantity",
    "stop_daemonset",
]
