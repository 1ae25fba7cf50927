"""Single pods read, given Events and evicted (``PodClient``), for the agent's shared-GPU slices."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..core.rules.attribution import PodIdentity
from .events import EventNote, post_event
from .session import ApiSession

__all__ = ["PodClient", "pod_identity"]


class PodClient:
    """Reads single pods, posts Events on them and evicts them, over an ``ApiSession`` (the
    agent's: ``NodeClient.session``). RBAC: ``get`` on ``pods`` and ``create`` on ``events`` in
    the pods' namespaces; ``create`` on ``pods/eviction`` to evict (``evict_pod``). Raises
    ``KubeError`` subclasses (``KubeNotFound``: the pod is gone)."""

    def __init__(self, session: ApiSession, reporter: str, who: str = "the agent") -> None:
        """``reporter``: the reporting instance of the Events (the Node's name); ``who``: the
        program, as a 403's message names it (``the agent``, ``the extender``)."""
        self.session = session
        self.reporter = reporter
        self.who = who

    def read_pod(self, namespace: str, name: str) -> Any:
        """GET one pod: its v1.Pod document as the API server answered it (untrusted: the
        caller reads it field by field)."""
        response = self.session.call(
            "get",
            f"pod {namespace}/{name}",
            lambda: self.session.http(
                "GET", _POD_PATH, path_params={"namespace": namespace, "name": name}
            ),
            rbac=f"{self.who} needs get on pods in {namespace}",
        )
        return json.loads(response.data)

    def get_pod(self, namespace: str, name: str) -> PodIdentity:
        """GET one pod (``read_pod``): its UID and its containers' IDs and names."""
        return pod_identity(self.read_pod(namespace, name), namespace, name)

    def create_pod_event(
        self, *, namespace: str, name: str, uid: str, reason: str, message: str, warning: bool
    ) -> None:
        """POST a core/v1 Event about the pod in its namespace (``uid``: its ``metadata.uid``,
        which ``kubectl describe pod`` matches; "" when unknown). A 409 counts as posted (the
        name is unique to this call); otherwise raises ``KubeError``."""
        post_event(
            self.session,
            namespace=namespace,
            involved={
                "apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name,
                **({"uid": uid} if uid else {}),
            },
            note=EventNote(reason, message, warning),
            reporter=self.reporter,
            what=f"event {reason} on pod {namespace}/{name}",
        )  # fmt: skip

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """POST a ``policy/v1`` Eviction of the pod (its ``eviction`` subresource): the API
        server deletes it unless a PodDisruptionBudget forbids that now. ``uid`` (its
        ``metadata.uid``, as read before; required) is a precondition, so that a new pod of the
        same name (a StatefulSet's next) is never evicted in its place. One attempt, no
        retries: the caller tries again next tick. Raises ``KubeTooManyRequests`` (429: a
        PodDisruptionBudget does not allow it now), ``KubeNotFound`` (the pod is gone),
        ``KubeConflict`` (409: the pod of that name has another UID now), ``KubeForbidden``
        (the agent lacks ``create`` on ``pods/eviction``), other ``KubeError``s; ``ValueError``
        for an empty ``uid``."""
        if not uid:
            raise ValueError(f"evicting pod {namespace}/{name}: no UID to make it a precondition")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self.session.call(
            "create",
            f"eviction of pod {namespace}/{name}",
            lambda: self.session.http(
                "POST", _POD_PATH + "/eviction",
                path_params={"namespace": namespace, "name": name}, body=body,
                content_type="application/json",
            ),  # fmt: skip
            rbac=f"{self.who} needs create on pods/eviction in {namespace}",
            retry=False,
        )


_POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"


def pod_identity(doc: Any, namespace: str, name: str) -> PodIdentity:
    """A ``PodIdentity`` from a pod document (untrusted: fields of the wrong type are left
    out; no UID reads as "")."""
    meta = doc.get("metadata") if isinstance(doc, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    status = doc.get("status") if isinstance(doc, Mapping) else None
    containers: dict[str, str] = {}
    for field in ("containerStatuses", "initContainerStatuses"):
        listed = status.get(field) if isinstance(status, Mapping) else None
        for c in listed if isinstance(listed, list) else ():
            if not isinstance(c, Mapping):
                continue
            cid, cname = c.get("containerID"), c.get("name")
            if isinstance(cid, str) and isinstance(cname, str) and cid:
                containers[cid.rpartition("://")[2]] = cname
    return PodIdentity(namespace, name, uid if isinstance(uid, str) else "", containers)
