"""The Leases of one namespace in one list+watch cache, for the scheduler extender: the agents'
liveness (``kube.heartbeat_lease``), read where their telemetry names a Lease."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from .informer import Informer
from .informer_options import informer_arguments

__all__ = ["LeaseCache"]

V = TypeVar("V")

_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")


class LeaseCache(Informer[V]):
    """An informer (``informer.Informer``, as ``NodeCache``) over the
    ``coordination.k8s.io/v1`` Leases of ``namespace``: each Lease document goes through
    ``transform`` once per event and the result is stored by the Lease's name. A Lease is untrusted like a Node: one on which ``transform`` raises is
    dropped (readers see no such Lease), counted in ``skipped`` and passed to ``on_skip``.
    Keyword arguments as ``NodeCache``. RBAC: ``list`` and ``watch`` on ``leases`` in
    ``namespace`` (a Role)."""

    what = "leases"
    label = "lease cache"

    def __init__(self, transform: Callable[[dict[str, Any]], V], namespace: str, **kwargs: Any):
        if not _NAMESPACE.match(namespace or ""):
            raise ValueError(f"not a namespace name: {namespace!r}")
        super().__init__(transform, **informer_arguments(kwargs))
        self.namespace = namespace
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _value(self, obj: Any, previous: V | None) -> V | None:
        """``transform`` of the Lease document; raises what ``transform`` raises."""
        return self._transform(obj if isinstance(obj, dict) else {})

    def lease(self, ref: str) -> V | None:
        """The stored value for ``"<namespace>/<name>"``; ``None`` when the cache holds no such
        Lease (a Lease in another namespace than the one watched included)."""
        namespace, _, name = ref.partition("/")
        return self.get(name) if namespace == self.namespace else None
