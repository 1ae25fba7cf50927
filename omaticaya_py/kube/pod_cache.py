"""Pods in one list+watch cache (an informer), for the scheduler extender's in-flight
placements."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .informer import Informer
from .informer_options import informer_arguments

__all__ = ["PodCache", "pod_key"]

V = TypeVar("V")


def pod_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod document ("" when it has neither)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return ""
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class PodCache(Informer[V]):
    """An informer-style cache (``informer.Informer``) of the pods that match
    ``field_selector`` (every namespace): one LIST, then a WATCH from its resourceVersion, in a
    daemon thread; readers never call the API.

    Each pod document goes through ``transform(pod, previous)`` once per event (``previous``:
    the value stored for that pod before, or ``None``): a value is stored under
    ``namespace/name``, ``None`` drops the pod (not interesting, or finished). A pod whose
    ``transform`` raises is dropped, counted in ``skipped`` and passed to ``on_skip(key, exc)``;
    the others and the watch go on. ``version`` grows with every change (readers cache derived
    indexes by it). An expired watch (410) lists again; other failures are wrapped in
    ``KubeError``, passed to ``on_error`` and retried with exponential backoff, keeping the last
    known pods. Keyword arguments as ``NodeCache``. RBAC: ``list`` and ``watch`` on ``pods``.
    """

    path = "/api/v1/pods"
    what = "pods"
    label = "pod cache"

    def __init__(
        self,
        transform: Callable[[Mapping[str, Any], V | None], V | None],
        *,
        field_selector: str = "",
        **kwargs: Any,
    ) -> None:
        query = {"fieldSelector": field_selector} if field_selector else {}
        super().__init__(transform, **informer_arguments({**kwargs, "query": query}))

    def _key(self, obj: Any) -> str:
        """``namespace/name`` of the pod ("" when it has neither)."""
        return pod_key(obj) if isinstance(obj, Mapping) else ""
