"""The agent's liveness Lease: one ``coordination.k8s.io/v1`` Lease per Node, in the agent's
own namespace, renewed every heartbeat, so that the Node object itself changes only when a
label does (as the kubelet moved its heartbeat to ``kube-node-lease``, KEP-589).

A Lease write reaches only the clients that watch Leases in that namespace, not every client
that watches Nodes. The agent needs ``get``, ``create`` and ``update`` on ``leases`` in its
namespace and nothing cluster-wide.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .errors import KubeError
from .session import ApiSession

__all__ = ["LEASE_PREFIX", "LeaseClient", "lease_name", "lease_namespace"]

#: the Lease of Node ``n`` is ``omaticaya-node-<n>`` (made a valid name)
LEASE_PREFIX = "omaticaya-node-"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_COLLECTION = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_ONE = _COLLECTION + "/{name}"
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
    Requests are counted in the session's ``requests`` (verbs ``get``, ``create``, ``update``).
    Raises ``KubeError`` subclasses (``KubeForbidden``: RBAC lacks the Lease)."""

    def __init__(
        self,
        session: ApiSession,
        *,
        namespace: str,
        name: str,
        holder: str,
        duration_s: float,
    ) -> None:
        self.session = session
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.duration_s = max(1, math.ceil(duration_s))
        self.renewals = 0
        self._object: dict[str, Any] | None = None

    @property
    def ref(self) -> str:
        """``namespace/name``: where a reader finds the Lease."""
        return f"{self.namespace}/{self.name}"

    def _request(self, verb: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
        params = {"namespace": self.namespace}
        if path == _ONE:
            params["name"] = self.name
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
        )
        return json.loads(response.data)

    def get(self) -> dict[str, Any] | None:
        """The Lease as stored, or ``None`` when it does not exist."""
        try:
            return self._request("get", "GET", _ONE)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

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
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "labels": {"app.kubernetes.io/name": "omaticaya"},
                    },
                    "spec": self._spec(now, acquire=True),
                }
                try:
                    self._object = self._request("create", "POST", _COLLECTION, body)
                except KubeError as err:
                    if err.status != 409:  # 409: created meanwhile (or by a lost answer)
                        raise
                    self._object = None
                    continue
            else:
                spec = dict(current.get("spec") or {})
                acquire = spec.get("holderIdentity") != self.holder
                spec.update(self._spec(now, acquire=acquire))
                body = {**current, "spec": spec}
                try:
                    # verb "renew": a 409 means our copy is old; GET and try again, not the same PUT
                    self._object = self._request("renew", "PUT", _ONE, body)
                except KubeError as err:
                    if err.status not in (404, 409):
                        raise
                    self._object = None  # changed or deleted behind our back
                    continue
            self.renewals += 1
            return self._object
        raise KubeError(f"lease {self.ref}: changed by another writer twice in a row")

    def release(self) -> None:
        """Clear ``holderIdentity`` (on exit): a reader sees at once that no agent holds it.
        Raises ``KubeError``."""
        current = self._object if self._object is not None else self.get()
        if current is None:
            return
        spec = dict(current.get("spec") or {})
        spec.pop("holderIdentity", None)
        try:
            self._object = self._request("renew", "PUT", _ONE, {**current, "spec": spec})
        except KubeError as err:
            if err.status not in (404, 409):
                raise
            self._object = None
