"""The Leases of one namespace in one list+watch cache, for the scheduler extender: the agents'
liveness (``kube.lease``), read where their telemetry names a Lease."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from .cache import NodeCache

__all__ = ["LeaseCache"]

V = TypeVar("V")

_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")


class LeaseCache(NodeCache[V]):
    """``NodeCache``'s informer over the ``coordination.k8s.io/v1`` Leases of ``namespace``:
    each Lease document goes through ``transform`` once per event and the result is stored by
    the Lease's name. A Lease is untrusted like a Node: one on which ``transform`` raises is
    dropped (readers see no such Lease), counted in ``skipped`` and passed to ``on_skip``.
    Other arguments as ``NodeCache``. RBAC: ``list`` and ``watch`` on ``leases`` in
    ``namespace`` (a Role)."""

    what = "leases"
    label = "lease cache"

    def __init__(self, transform: Callable[[dict[str, Any]], V], namespace: str, **kwargs: Any):
        if not _NAMESPACE.match(namespace or ""):
            raise ValueError(f"not a namespace name: {namespace!r}")
        super().__init__(transform, **kwargs)  # type: ignore[arg-type]
        self.namespace = namespace
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _key_value(self, obj: dict[str, Any]) -> tuple[str, V]:
        meta = obj.get("metadata") or {}
        return meta.get("name", ""), self._transform(obj)  # type: ignore[arg-type]

    def lease(self, ref: str) -> V | None:
        """The stored value for ``"<namespace>/<name>"``; ``None`` when the cache holds no such
        Lease (a Lease in another namespace than the one watched included)."""
        namespace, _, name = ref.partition("/")
        return self.get(name) if namespace == self.namespace else None
