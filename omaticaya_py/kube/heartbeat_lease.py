"""The agent's liveness Lease: one ``coordination.k8s.io/v1`` Lease per Node, in the agent's
own namespace, renewed every heartbeat, so that the Node object itself changes only when a
label does (as the kubelet moved its heartbeat to ``kube-node-lease``, KEP-589).

A Lease write reaches only the clients that watch Leases in that namespace, not every client
that watches Nodes. The agent needs ``get``, ``create``, ``update`` and ``delete`` on ``leases``
in its namespace, and ``get`` on its Node.

Each Lease is owned by its Node (``metadata.ownerReferences``: ``v1``/``Node``, name and uid,
as the kubelet's node Leases in ``kube-node-lease`` are, without ``controller`` or
``blockOwnerDeletion``): the garbage collector deletes it with the Node, so Leases of Nodes an
autoscaler removed do not pile up. The reference is set on create and added on the next renewal
to a Lease that lacks it (an older agent's, or one created while the Node could not be read).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .errors import KubeConflict, KubeError, KubeNotFound
from .session import ApiSession

__all__ = ["LEASE_PREFIX", "LeaseClient", "lease_name", "lease_namespace"]

#: the Lease of Node ``n`` is ``omaticaya-node-<n>`` (made a valid name)
LEASE_PREFIX = "omaticaya-node-"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_COLLECTION = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_ONE = _COLLECTION + "/{name}"
_NODE = "/api/v1/nodes/{name}"
_NOT_NAME = re.compile(r"[^a-z0-9.-]+")


def lease_name(node: str) -> str:
    """``omaticaya-node-<node>`` as a valid object name (a DNS subdomain of at most 253
    characters: lower case, other characters replaced by ``-``, ends trimmed)."""
    name = _NOT_NAME.sub("-", (LEASE_PREFIX + node).lower())[:253]
    return re.sub(r"[^a-z0-9]+$", "", name) or LEASE_PREFIX.rstrip("-")


def lease_namespace(
    environ: Mapping[str, str], namespace_file: str = SERVICE_ACCOUNT_NAMESPACE
) -> str | None:
    """The agent's own namespace: ``POD_NAMESPACE`` (the downward API), else the service
    account's namespace file, else ``None`` (outside a cluster: no namespace of its own)."""
    namespace = (environ.get("POD_NAMESPACE") or "").strip()
    if namespace:
        return namespace
    try:
        with open(namespace_file, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _micro_time(when: datetime) -> str:
    """A ``MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseClient:
    """Holds the Lease ``namespace/name`` for ``holder`` over an ``ApiSession``.

    ``renew()`` creates the Lease or moves its ``renewTime`` (and takes it over: the holder is
    this pod); ``release()`` clears the holder on exit. ``duration_s`` is the
    ``leaseDurationSeconds``: how long after ``renewTime`` a reader may take the agent for dead.
    ``node``: the Node that owns the Lease (its ``ownerReferences``; ``None``: no owner).
    Requests are counted in the session's ``requests`` (verbs ``get``, ``create``, ``renew``,
    ``delete``; ``get-node`` for the owner's uid).
    Raises ``KubeError`` subclasses (``KubeForbidden``: RBAC lacks the Lease)."""

    def __init__(
        self,
        session: ApiSession,
        *,
        namespace: str,
        name: str,
        holder: str,
        duration_s: float,
        node: str | None = None,
    ) -> None:
        self.session = session
        self.node = node
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.duration_s = max(1, math.ceil(duration_s))
        self.renewals = 0
        self._object: dict[str, Any] | None = None
        self._owner: dict[str, str] | None = None
        #: why the owner could not be read (the last failure), for the caller to log
        self.owner_problem: str | None = None

    @property
    def ref(self) -> str:
        """``namespace/name``: where a reader finds the Lease."""
        return f"{self.namespace}/{self.name}"

    def _request(self, verb: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
        params = {"namespace": self.namespace}
        rbac = f"the agent needs get, create, update and delete on leases in {self.namespace}"
        if path == _ONE:
            params["name"] = self.name
        if path == _NODE:
            params = {"name": self.node or ""}
            rbac = "the agent needs get on nodes"
        response = self.session.call(
            verb,
            f"lease {self.ref}",
            lambda: self.session.http(
                method,
                path,
                path_params=params,
                body=body,
                content_type="application/json" if body is not None else None,
            ),
            rbac=rbac,
        )
        return json.loads(response.data)

    def get(self) -> dict[str, Any] | None:
        """The Lease as stored, or ``None`` when it does not exist."""
        try:
            return self._request("get", "GET", _ONE)
        except KubeNotFound:
            return None

    def owner_reference(self) -> dict[str, str] | None:
        """``{"apiVersion": "v1", "kind": "Node", "name", "uid"}`` of ``node`` (one GET of the
        Node, then remembered), or ``None`` without a ``node`` or when it cannot be read
        (``owner_problem`` says why; tried again at the next renewal, as the kubelet does)."""
        if self.node is None:
            return None
        if self._owner is None:
            try:
                uid = self._request("get-node", "GET", _NODE).get("metadata", {}).get("uid")
            except KubeError as err:
                self.owner_problem = str(err)
                return None
            if not isinstance(uid, str) or not uid:
                self.owner_problem = f"node {self.node} has no uid"
                return None
            self._owner = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}
            self.owner_problem = None
        return dict(self._owner)

    def _spec(self, now: datetime, acquire: bool) -> dict[str, Any]:
        stamp = _micro_time(now)
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": stamp,
        }
        if acquire:
            spec["acquireTime"] = stamp
        return spec

    def renew(self, now: datetime | None = None) -> dict[str, Any]:
        """Create the Lease, or update its ``renewTime`` (one PUT on the cached object; after a
        conflict, or the first time, a GET before it). Returns the Lease as stored."""
        now = now or datetime.now(timezone.utc)
        for _ in range(2):
            current = self._object if self._object is not None else self.get()
            if current is None:
                metadata: dict[str, Any] = {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/name": "omaticaya"},
                }
                owner = self.owner_reference()
                if owner is not None:
                    metadata["ownerReferences"] = [owner]
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": metadata,
                    "spec": self._spec(now, acquire=True),
                }
                try:
                    self._object = self._request("create", "POST", _COLLECTION, body)
                except KubeConflict:  # created meanwhile (or by a lost answer)
                    self._object = None
                    continue
            else:
                spec = dict(current.get("spec") or {})
                acquire = spec.get("holderIdentity") != self.holder
                spec.update(self._spec(now, acquire=acquire))
                body = {**current, "spec": spec}
                meta = current.get("metadata")
                if isinstance(meta, dict) and not meta.get("ownerReferences"):
                    owner = self.owner_reference()  # an older agent's Lease: owned from now on
                    if owner is not None:
                        body["metadata"] = {**meta, "ownerReferences": [owner]}
                try:
                    # verb "renew": a 409 means our copy is old; GET and try again, not the same PUT
                    self._object = self._request("renew", "PUT", _ONE, body)
                except (KubeNotFound, KubeConflict):
                    self._object = None  # changed or deleted behind our back
                    continue
            self.renewals += 1
            return self._object
        raise KubeError(f"lease {self.ref}: changed by another writer twice in a row")

    def delete(self, *, only_if_held: bool = False) -> bool:
        """Delete the Lease; True when this call deleted it. ``only_if_held``: only while this
        pod holds it, and only the version read (a DELETE with a ``resourceVersion``
        precondition): a new pod that took it over meanwhile (a rolling update with surge)
        keeps it. Gone already, or taken over: False. Raises ``KubeError``."""
        body: dict[str, Any] | None = None
        if only_if_held:
            current = self.get()
            if current is None or (current.get("spec") or {}).get("holderIdentity") != self.holder:
                return False
            version = (current.get("metadata") or {}).get("resourceVersion")
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "preconditions": {"resourceVersion": version}}
        try:
            self._request("delete", "DELETE", _ONE, body)
        except (KubeNotFound, KubeConflict):  # gone already; changed (taken over) since the read
            return False
        finally:
            self._object = None
        return True

    def release(self) -> None:
        """Clear ``holderIdentity`` (on exit) while this pod holds it: a reader sees at once
        that no agent holds it. Raises ``KubeError``."""
        current = self._object if self._object is not None else self.get()
        if current is None:
            return
        spec = dict(current.get("spec") or {})
        if spec.get("holderIdentity") != self.holder:
            return  # taken over (a rolling update's new pod): not ours to release
        spec.pop("holderIdentity", None)
        try:
            self._object = self._request("renew", "PUT", _ONE, {**current, "spec": spec})
        except (KubeNotFound, KubeConflict):
            self._object = None
