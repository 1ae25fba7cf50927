"""The agent's own Node: read it, merge-patch its labels and annotations, post Events on it."""

from __future__ import annotations

import json
from typing import Any

from ..core.publish.patch import MergePatch, NodeMeta
from .events import EventNote, post_event
from .session import ApiSession

__all__ = ["MERGE_PATCH", "NodeClient"]

MERGE_PATCH = "application/merge-patch+json"
_NODE_PATH = "/api/v1/nodes/{name}"


class NodeClient:
    """Reads and patches one Node (``/api/v1/nodes/{node_name}``) and posts its Events.

    The keyword arguments configure its ``ApiSession`` (see there: kubeconfig or in-cluster
    credentials, per-request timeout, retries). ``requests`` counts requests by
    ``(verb, status)``. Raises ``KubeError`` subclasses; a bad or missing configuration raises
    ``KubeError``.
    """

    def __init__(
        self, node_name: str, *, session: ApiSession | None = None, **options: Any
    ) -> None:
        """``options`` configure a new ``ApiSession`` (``kubeconfig``, ``environ``,
        ``token_file``, ``ca_file``, ``timeout_s``, ``attempts``, ``backoff_s``,
        ``backoff_max_s``, ``sleep``) unless ``session`` is given."""
        self.node_name = node_name
        self.session = session if session is not None else ApiSession(**options)
        self.requests = self.session.requests
        self.stopping = self.session.stopping
        self.timeout_s = self.session.timeout_s

    @property
    def server(self) -> str:
        """The API server URL in use."""
        return self.session.server

    def begin_shutdown(self, deadline_s: float) -> None:
        """No more retries, and requests cut to ``deadline_s`` (see ``ApiSession``)."""
        self.session.begin_shutdown(deadline_s)

    @staticmethod
    def _meta(response: Any) -> NodeMeta:
        body = json.loads(response.data)
        meta = body.get("metadata", {})
        return NodeMeta(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
        )

    def get_node(self) -> NodeMeta:
        """GET the Node; returns its name, uid, labels and annotations.

        Raises ``KubeNotFound``, ``KubeForbidden``, ``KubeUnavailable``, ``KubeRejected``."""
        response = self.session.call(
            "get",
            f"node {self.node_name}",
            lambda: self.session.http("GET", _NODE_PATH, path_params={"name": self.node_name}),
            rbac="the agent needs get on nodes",
        )
        return self._meta(response)

    def patch_node(self, patch: MergePatch) -> NodeMeta:
        """PATCH the Node with a JSON merge patch (RFC 7386) and return the Node as stored.

        Raises as ``get_node``."""
        response = self.session.call(
            "patch",
            f"node {self.node_name}",
            lambda: self.session.http(
                "PATCH",
                _NODE_PATH,
                path_params={"name": self.node_name},
                body=patch,
                content_type=MERGE_PATCH,
            ),
            rbac="the agent needs get and patch on nodes",
        )
        return self._meta(response)

    def create_node_event(
        self, *, node_uid: str, reason: str, message: str, warning: bool, namespace: str = "default"
    ) -> None:
        """POST a core/v1 Event about the Node (as the kubelet does, in ``namespace``).

        ``reason`` is CamelCase (``GpuUnhealthy``), ``warning`` picks type Warning or Normal;
        reporting component ``omaticaya``, instance the Node name. A 409 (AlreadyExists: the
        Event's name is unique to this call, so an earlier attempt of it got through) counts as
        posted; it is never retried. Raises ``KubeError`` otherwise."""
        post_event(
            self.session,
            namespace=namespace,
            involved={
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": node_uid or self.node_name,
            },
            note=EventNote(reason, message, warning),
            reporter=self.node_name,
            what=f"event {reason} on node {self.node_name}",
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.session.close()
