"""The Node's ResourceSlice of the DRA driver ``gpu.omaticaya.io`` through the API.

One slice per Node (``core.dra.slice_name``), written by server-side apply (one request
creates or updates it; field manager ``omaticaya-agent``, forced: the slice is ours alone),
read back at each heartbeat, deleted on exit. The content is decided elsewhere
(``core.dra``); this edge only moves it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..core.dra import slice_name
from .errors import KubeNotFound
from .session import ApiSession

__all__ = ["FIELD_MANAGER", "ResourceSliceClient"]

#: the field manager of our server-side applies
FIELD_MANAGER = "omaticaya-agent"
_PATH = "/apis/resource.k8s.io/v1/resourceslices/{name}"
_APPLY = "application/apply-patch+yaml"
_RBAC = "the agent needs get, patch and delete on resourceslices.resource.k8s.io"


class ResourceSliceClient:
    """The ResourceSlice of Node ``node_name`` over ``session`` (``kube.session.ApiSession``:
    its retries, accounting and errors). Every method raises the session's ``KubeError``
    subclasses (``KubeForbidden`` with what RBAC must allow, ``KubeUnavailable``, ...)."""

    def __init__(self, session: ApiSession, node_name: str) -> None:
        self.session = session
        self.node_name = node_name
        self.name = slice_name(node_name)

    def get(self) -> dict[str, Any] | None:
        """GET the slice as JSON; ``None`` when there is none."""
        try:
            response = self.session.call(
                "get", f"resourceslice {self.name}",
                lambda: self.session.http("GET", _PATH, path_params={"name": self.name}),
                rbac=_RBAC,
            )  # fmt: skip
        except KubeNotFound:
            return None
        return _json(response.data)

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply ``body`` (``core.dra.slice_body``): creates the slice or brings it
        to ``body``; returns the slice as stored."""
        response = self.session.call(
            "apply", f"resourceslice {self.name}",
            lambda: self.session.http(
                "PATCH", _PATH, path_params={"name": self.name},
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                body=dict(body), content_type=_APPLY,
            ),
            rbac=_RBAC,
        )  # fmt: skip
        return _json(response.data)

    def delete(self) -> bool:
        """DELETE the slice; ``False`` when there was none."""
        try:
            self.session.call(
                "delete", f"resourceslice {self.name}",
                lambda: self.session.http("DELETE", _PATH, path_params={"name": self.name}),
                rbac=_RBAC,
            )  # fmt: skip
        except KubeNotFound:
            return False
        return True


def _json(data: bytes | str) -> dict[str, Any]:
    obj = json.loads(data)
    return obj if isinstance(obj, dict) else {}
