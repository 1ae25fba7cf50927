"""The Node's ResourceSlice of the DRA driver ``gpu.omaticaya.io`` through the API.

One slice per Node (``core.publish.dra.slice_name``), written by server-side apply (one request
creates or updates it; field manager ``omaticaya-agent``, forced: the slice is ours alone),
read back at each heartbeat, deleted on exit. The content is decided elsewhere
(``core.publish.dra``); this edge only moves it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.publish.dra import DRIVER, slice_name
from .errors import KubeNotFound
from .session import ApiSession

__all__ = ["FIELD_MANAGER", "ResourceSliceClient", "SliceCleanup", "delete_driver_slices"]

#: the field manager of our server-side applies
FIELD_MANAGER = "omaticaya-agent"
_PATH = "/apis/resource.k8s.io/v1/resourceslices/{name}"
_COLLECTION = "/apis/resource.k8s.io/v1/resourceslices"
_APPLY = "application/apply-patch+yaml"
_RBAC = "the agent needs get, create, patch and delete on resourceslices.resource.k8s.io"


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
        """Server-side apply ``body`` (``core.publish.dra.slice_body``): creates the slice or brings it
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


@dataclass(frozen=True, slots=True)
class SliceCleanup:
    """What ``delete_driver_slices`` did: ``served`` (``False``: the server has no
    ``resource.k8s.io/v1``, nothing to delete), the slices ``found`` and those ``left``."""

    driver: str
    served: bool
    found: tuple[str, ...] = ()
    left: tuple[str, ...] = ()

    def line(self) -> str:
        """One line for the chart's uninstall hook to print."""
        if not self.served:
            return "resource.k8s.io/v1 is not served: no ResourceSlice to delete"
        if self.left:
            return f"ResourceSlices of {self.driver} still there: {', '.join(self.left)}"
        return f"ResourceSlices of {self.driver} deleted: {', '.join(self.found) or 'none was left'}"


def delete_driver_slices(session: ApiSession, driver: str = DRIVER) -> SliceCleanup:
    """Delete every ResourceSlice whose ``spec.driver`` is ``driver`` (every Node's: one whose
    agent died leaves its slice behind), by one delete-collection with the field selector
    ``spec.driver=<driver>``, then list again. Raises the session's ``KubeError`` subclasses
    (``KubeForbidden`` naming the RBAC it needs); a 404 on the list means the API is not served."""
    query = {"fieldSelector": f"spec.driver={driver}"}
    rbac = "the uninstall hook needs list and deletecollection on resourceslices.resource.k8s.io"

    def names() -> tuple[str, ...]:
        response = session.call(
            "list", f"resourceslices of {driver}",
            lambda: session.http("GET", _COLLECTION, query=query), rbac=rbac,
        )  # fmt: skip
        items = _json(response.data).get("items") or []
        return tuple(sorted(str((i.get("metadata") or {}).get("name")) for i in items))

    try:
        found = names()
    except KubeNotFound:
        return SliceCleanup(driver, served=False)
    if found:
        session.call(
            "deletecollection", f"resourceslices of {driver}",
            lambda: session.http("DELETE", _COLLECTION, query=query), rbac=rbac,
        )  # fmt: skip
    return SliceCleanup(driver, served=True, found=found, left=names() if found else ())


def _json(data: bytes | str) -> dict[str, Any]:
    obj = json.loads(data)
    return obj if isinstance(obj, dict) else {}
