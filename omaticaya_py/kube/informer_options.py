"""What an informer (``informer.Informer``) is configured with: how it reaches the API and
paces its loop (``InformerOptions``), whom it tells (``InformerHooks``), and the caches' flat
keyword arguments split into both (``informer_arguments``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import KubeError

__all__ = ["InformerHooks", "InformerOptions", "informer_arguments"]


@dataclass(frozen=True, slots=True)
class InformerOptions:
    """How an informer reaches the API and paces its loop. ``kubeconfig``, ``context`` (a
    kubeconfig context, as kubectl's ``--context``), ``environ``: the configuration, as
    ``ApiSession``; ``timeout_s``: one request's, seconds; ``watch_timeout_s``: after how many
    seconds the server ends a WATCH; ``backoff_s`` to ``backoff_max_s``: the retries' delays,
    seconds; ``stall_s``: ``health()`` fails without a LIST or WATCH answer within it, seconds
    (``None``: ``stall_bound_s``); ``page_size``: objects per LIST page; ``clock``: monotonic
    seconds; ``rbac``: what a refused (403) request lacked, in the error's message (``None``:
    ``list and watch on <what>``)."""

    kubeconfig: str | None = None
    context: str | None = None
    environ: Mapping[str, str] | None = None
    timeout_s: float = 10.0
    watch_timeout_s: int = 300
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    stall_s: float | None = None
    page_size: int = 500
    clock: Callable[[], float] = time.monotonic
    rbac: str | None = None

    def stall_bound_s(self) -> float:
        """``stall_s``, or by default ``watch_timeout_s + 2 * timeout_s + backoff_max_s``: a
        quiet cluster sends nothing on an open watch until the server ends it after
        ``watch_timeout_s``; the client's read timeout ends a dead one ``timeout_s`` later."""
        if self.stall_s is not None:
            return self.stall_s
        return self.watch_timeout_s + (2 * self.timeout_s + self.backoff_max_s)


@dataclass(frozen=True, slots=True)
class InformerHooks:
    """Whom an informer tells, from its thread (each optional): ``on_error(KubeError)``, a
    failure before its retry; ``on_skip(key, exception)``, an object the transform raised on;
    ``on_change(key, old, new)``, a stored value changed (``None``: absent)."""

    on_error: Callable[[KubeError], None] | None = None
    on_skip: Callable[[str, Exception], None] | None = None
    on_change: Callable[[str, Any, Any], None] | None = None


_OPTION_NAMES = frozenset(f.name for f in fields(InformerOptions))
_HOOK_NAMES = frozenset(f.name for f in fields(InformerHooks))


def informer_arguments(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """The caches' keyword arguments (``NodeCache(transform, kubeconfig=..., on_error=...)``):
    each a field of ``InformerOptions`` or ``InformerHooks``, or ``options``, ``hooks`` or
    ``query`` themselves, as ``Informer``'s (``options``, ``hooks``, ``query``); the fields
    given override those of ``options`` and ``hooks``. Raises ``TypeError`` for any other."""
    rest = dict(keywords)
    options = rest.pop("options", None) or InformerOptions()
    hooks = rest.pop("hooks", None) or InformerHooks()
    query = rest.pop("query", None)
    unknown = sorted(set(rest) - _OPTION_NAMES - _HOOK_NAMES)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    options = replace(options, **{k: v for k, v in rest.items() if k in _OPTION_NAMES})
    hooks = replace(hooks, **{k: v for k, v in rest.items() if k in _HOOK_NAMES})
    return {"options": options, "hooks": hooks, "query": query}
