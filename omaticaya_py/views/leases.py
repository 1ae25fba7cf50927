"""The agents' liveness Leases for ``omaticaya top``: read where the nodes' telemetry names one,
so that a quiet node whose agent renews its Lease shows fresh, by the extender's rule
(``core.rules.liveness``).

One ``kube.LeaseCache`` (list+watch) per namespace named, started when a node first names it.
RBAC: ``list`` and ``watch`` on ``leases`` in that namespace; where they are refused (or the
namespace cannot be read in time), one line says so and its nodes are judged by ``read_at``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..core.rules.liveness import LeaseState, lease_from_object
from ..kube import KubeError, LeaseCache

__all__ = ["MAX_NAMESPACES", "TopLeases"]

#: the most namespaces watched: the nodes' telemetry is untrusted, and each namespace costs a
#: list+watch (an agent fleet keeps its Leases in one)
MAX_NAMESPACES = 8


class TopLeases:
    """The Leases of the namespaces the nodes' telemetry names (``watched``, ``lease``: the
    face ``views.fleet.node_row`` reads). ``follow(namespaces)`` starts a cache for each new
    one and waits up to ``wait_s`` seconds for its first LIST (or its first failure: then
    ``warn`` hears one line, and that namespace is not watched). ``factory`` builds a cache
    (``LeaseCache``'s arguments); ``monotonic`` is the clock of each Lease's ``seen``."""

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        warn: Callable[[str], None] = lambda line: None,
        wait_s: float = 10.0,
        factory: Callable[..., Any] = LeaseCache,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = {"kubeconfig": kubeconfig}
        if context:
            self._options["context"] = context
        self._warn = warn
        self._wait_s = wait_s
        self._factory = factory
        self._monotonic = monotonic
        self._caches: dict[str, Any] = {}
        self._refused: set[str] = set()
        self._over: set[str] = set()

    def follow(self, namespaces: Iterable[str]) -> None:
        """Watch the Leases of each namespace not yet watched (or refused), up to
        ``MAX_NAMESPACES`` (the others: one line, their nodes judged by ``read_at``)."""
        new = sorted(set(namespaces) - set(self._caches) - self._refused - self._over)
        room = max(0, MAX_NAMESPACES - len(self._caches) - len(self._refused))
        if len(new) > room:
            self._over.update(new[room:])
            self._warn(
                f"Leases in {len(self._over)} more namespaces not read (at most "
                f"{MAX_NAMESPACES}): their nodes judged by read_at"
            )
        for namespace in new[:room]:
            cache = self._start(namespace)
            if cache is None:
                self._refused.add(namespace)
            else:
                self._caches[namespace] = cache

    def _start(self, namespace: str) -> Any:
        failed: list[KubeError] = []
        done = threading.Event()
        holder: list[Any] = []

        def transform(lease: Any) -> LeaseState:
            meta = lease.get("metadata") if isinstance(lease, dict) else None
            name = (meta or {}).get("name") if isinstance(meta, dict) else None
            before = holder[0].get(name) if holder and isinstance(name, str) else None
            return lease_from_object(lease, before, self._monotonic())

        def on_error(err: KubeError) -> None:
            failed.append(err)
            done.set()

        try:
            cache = self._factory(transform, namespace, on_error=on_error, **self._options)
        except (KubeError, ValueError) as err:
            self._warn(f"Leases in {namespace} not read ({err}): its nodes judged by read_at")
            return None
        holder.append(cache)
        cache.start()
        deadline = time.monotonic() + self._wait_s
        while not cache.synced and not done.is_set() and time.monotonic() < deadline:
            cache.wait_synced(0.05)
        if cache.synced:
            return cache
        cache.stop()
        why = failed[0] if failed else f"no answer in {self._wait_s:g}s"
        self._warn(f"Leases in {namespace} not read ({why}): its nodes judged by read_at")
        return None

    def watched(self, ref: str) -> bool:
        """Whether the namespace of Lease ``"<namespace>/<name>"`` is watched and synced."""
        cache = self._caches.get(ref.partition("/")[0])
        return cache is not None and cache.synced

    def lease(self, ref: str) -> LeaseState | None:
        """The Lease ``"<namespace>/<name>"`` (``None``: no such Lease in a watched
        namespace, or not watched)."""
        cache = self._caches.get(ref.partition("/")[0])
        return cache.lease(ref) if cache is not None else None

    def close(self) -> None:
        """Stop every cache."""
        for cache in self._caches.values():
            cache.stop(timeout_s=1.0)
        self._caches.clear()
