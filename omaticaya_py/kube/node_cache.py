"""Every Node in one list+watch cache (an informer), for the scheduler extender."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..core.publish.patch import NodeMeta
from .informer import Informer
from .informer_options import informer_arguments

__all__ = ["NodeCache"]

V = TypeVar("V")


class NodeCache(Informer[V]):
    """An informer-style cache of every Node (``informer.Informer``): one LIST, then a WATCH
    from its resourceVersion, in a daemon thread. Readers (``get``, ``snapshot``) never call
    the API.

    Each Node's metadata (``NodeMeta``: name, uid, labels, annotations) goes through
    ``transform`` once per event and the result is stored by Node name, so that the work of
    parsing a Node is done when it changes, not when it is read. A Node's content is untrusted
    (many controllers can write annotations): when ``transform`` raises on one Node, that Node
    is dropped from the cache (readers see it as unknown), ``skipped`` is incremented and
    ``on_skip(name, exception)`` is called; the other Nodes and the watch go on.

    Keyword arguments: the fields of ``InformerOptions`` (``kubeconfig``, ``timeout_s``,
    ``watch_timeout_s``, ``backoff_s`` to ``backoff_max_s``, ``stall_s``, ``clock``...) and of
    ``InformerHooks`` (``on_error``, ``on_skip``, ``on_change``), or ``options``, ``hooks`` and
    ``query`` as ``Informer`` takes them (``informer.informer_arguments``).
    RBAC: ``list`` and ``watch`` on ``nodes``.
    """

    path = "/api/v1/nodes"
    what = "nodes"
    label = "node cache"

    def __init__(self, transform: Callable[[NodeMeta], V], **kwargs: Any) -> None:
        super().__init__(transform, **informer_arguments(kwargs))

    def _value(self, obj: Any, previous: V | None) -> V | None:
        """``transform`` of the Node's ``NodeMeta``; raises what ``transform`` raises."""
        meta = (obj if isinstance(obj, dict) else {}).get("metadata") or {}
        node = NodeMeta(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
        )
        return self._transform(node)
