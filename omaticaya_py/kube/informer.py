"""One list+watch loop (an informer) over a Kubernetes collection, kept in memory for readers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, Self, TypeVar, cast

import tenacity
import urllib3
from kubernetes.client.exceptions import ApiException

from .errors import KubeError, KubeUnavailable, wrap
from .informer_options import InformerHooks, InformerOptions, informer_arguments
from .listwatch import end_read, list_pages, open_watch, release, watch_events
from .session import ApiSession

__all__ = ["Informer", "InformerHooks", "InformerOptions", "informer_arguments"]

V = TypeVar("V")


class Informer(Generic[V]):
    """An informer-style cache of one collection (``path``; ``query`` adds a
    ``fieldSelector``): one LIST, then a WATCH from its resourceVersion, in a daemon thread.
    Readers (``get``, ``snapshot``) never call the API.

    Each object goes through ``transform(obj, previous)`` once per event (``previous``: the
    value stored under its key before, or ``None``) and the result is stored under
    ``_key(obj)`` (``metadata.name``); ``None`` drops the key. Subclasses override ``_value``
    (what the transform is given) and ``_key``. ``version`` grows with every change. An object
    on which the transform raises is dropped (readers see it as unknown), counted in
    ``skipped`` and passed to ``on_skip(key, exception)``; the others and the watch go on.

    A watch that ends resumes from the last resourceVersion; an expired one (410) lists again
    at once. Other failures are wrapped in ``KubeError``, passed to ``on_error`` and retried
    (tenacity) after a random delay in ``[d/2, d]``, ``d = min(backoff_max_s, backoff_s *
    2**n)`` at the ``n``-th failure in a row; ``stop()`` cuts it short. Any other exception (a
    bug) is reported the same way and followed by a fresh LIST: the thread never dies of one.
    The last known state stays meanwhile.

    The LIST is paginated (``limit`` = ``page_size``, then ``continue``): each page is decoded,
    transformed and freed before the next is read, so the memory a LIST takes follows one page,
    not the collection. A continue token that expired (410) starts the LIST over.
    ``on_change(key, old, new)`` (optional) hears of every change of a stored value (``None``:
    absent), from the watch thread: each event, and after a LIST the keys it added, changed or
    dropped. ``health()``: is the loop alive, with a LIST or WATCH
    answer within ``stall_s`` seconds? Subclasses set ``path``, ``what`` (its name in messages)
    and ``label`` (in health reasons and the thread's name). ``options``: the configuration (as
    ``ApiSession``), the timeouts, back-off, page size, clock and ``rbac``, what a refused (403)
    request lacked, in the error's message (the caller says it for whom): ``InformerOptions``.
    ``hooks``: ``on_error``, ``on_skip``, ``on_change`` (``InformerHooks``).
    """

    path = ""
    what = "objects"
    label = "informer"

    def __init__(self, transform: Callable[..., Any], options: InformerOptions | None = None, *,
                 hooks: InformerHooks | None = None,
                 query: Mapping[str, str] | None = None) -> None:  # fmt: skip
        options = options if options is not None else InformerOptions()
        hooks = hooks if hooks is not None else InformerHooks()
        self._transform = transform
        self.rbac = options.rbac if options.rbac is not None else f"list and watch on {self.what}"
        self._on_change = hooks.on_change
        self._page_size = options.page_size
        self._on_skip = hooks.on_skip
        self._on_error = hooks.on_error
        self._clock = options.clock
        self._query = dict(query or {})
        self.stall_s = options.stall_bound_s()
        self._last_ok_s: float | None = None
        self._timeout_s = options.timeout_s
        self._watch_timeout_s = options.watch_timeout_s
        # the session brings the configuration, token rotation and request accounting; its
        # retries are kept to one attempt: this loop does its own backoff
        # (``context``: a kubeconfig context, as kubectl's ``--context``)
        self._session = ApiSession(
            kubeconfig=options.kubeconfig, context=options.context, environ=options.environ,
            timeout_s=options.timeout_s, attempts=1,
        )  # fmt: skip
        self._items: dict[str, V] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self._need_list = True
        self._retrying = self._retry_policy(options.backoff_s, options.backoff_max_s)
        self.resource_version = ""
        self.version = 0
        self.lists = 0
        self.events = 0
        self.last_error: KubeError | None = None
        #: objects dropped because the transform raised on them (counted once per event)
        self.skipped = 0

    def _retry_policy(self, backoff_s: float, backoff_max_s: float) -> tenacity.Retrying:
        """The loop's retries: at the n-th failure in a row a delay of ``d/2 + uniform(0,
        d/2)``, ``d = min(backoff_max_s, backoff_s * 2**n)`` seconds, cut short by ``stop()``;
        each failure passed to ``_failed``."""
        half = tenacity.wait_exponential(multiplier=backoff_s, max=backoff_max_s / 2)
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Exception),
            stop=tenacity.stop_when_event_set(self._stop),
            wait=half + tenacity.wait_random_exponential(multiplier=backoff_s, max=backoff_max_s / 2),
            sleep=self._stop.wait,  # type: ignore[arg-type]  # stop() ends the delay at once
            before_sleep=self._failed,
            retry_error_callback=lambda state: None,  # stopped while failing: end quietly
        )

    @property
    def server(self) -> str:
        """The API server URL in use."""
        return self._session.server

    @property
    def requests(self) -> Any:
        """API requests by ``(verb, result)`` (the session's accounting)."""
        return self._session.requests

    @property
    def synced(self) -> bool:
        """True once the first LIST has been stored."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        """Block until the first LIST is stored (or the timeout passes); returns ``synced``."""
        return self._synced.wait(timeout_s)

    def health(self) -> tuple[bool, str]:
        """(healthy, reason) for a readiness probe: False before the first LIST, when the
        thread is not running, or when no LIST or WATCH answered within ``stall_s`` seconds
        (the reason then names the last error); ``(True, "ok")`` otherwise."""
        if self._thread is None or not self._thread.is_alive():
            return False, f"{self.label} thread is not running"
        if not self.synced:
            why = f" (last error: {self.last_error})" if self.last_error else ""
            return False, f"{self.label} not synced yet" + why
        last = self._last_ok_s
        age = self._clock() - last if last is not None else float("inf")
        if age > self.stall_s:
            why = f"; last error: {self.last_error}" if self.last_error else ""
            return False, (
                f"{self.label} stalled: no successful list or watch for {age:.0f}s "
                f"(limit {self.stall_s:g}s){why}"
            )
        return True, "ok"

    def _contact(self) -> None:
        self._last_ok_s = self._clock()

    def get(self, key: str) -> V | None:
        """The stored value for ``key``, or ``None`` when the cache has no such object."""
        return self._items.get(key)

    def snapshot(self) -> dict[str, V]:
        """A copy of every stored value by key."""
        with self._lock:
            return dict(self._items)

    def __len__(self) -> int:
        return len(self._items)

    # -- the loop ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the list+watch thread (once); returns the cache."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=self.label.replace(" ", "-"), daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (ends the open watch at once) and close the HTTP connection pool."""
        self._stop.set()
        end_read(self._response)  # the watch thread's read in progress ends now
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._session.close()

    def _failed(self, state: tenacity.RetryCallState) -> None:
        """Before the delay: keep and report the failure (a ``KubeError``: see ``_round``)."""
        self.last_error = err = cast(KubeError, state.outcome.exception())  # type: ignore[union-attr]
        if self._on_error is not None:
            self._on_error(err)

    def _run(self) -> None:
        # one tenacity call per LIST/WATCH round: a round that succeeds resets the backoff
        while not self._stop.is_set():
            self._retrying(self._round)

    def _round(self) -> None:
        """LIST when needed, then one WATCH. Raises only ``KubeError`` (a 410 is no error)."""
        if self._stop.is_set():
            return
        try:
            if self._need_list:
                self._list()
                self._need_list = False
            self._need_list = self._watch()
        except KubeError as err:
            if err.status == 410:
                self._need_list = True
                return
            raise
        except Exception as exc:  # noqa: BLE001 - a bug or an unexpected answer: start over
            self._need_list = True
            unexpected = KubeUnavailable(
                f"list/watch {self.what}: unexpected {type(exc).__name__}: {exc}", verb="watch"
            )
            raise unexpected from exc

    def _key(self, obj: Any) -> str:
        """The key of an object: its ``metadata.name`` ("" when it has none)."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        return meta.get("name", "") if isinstance(meta, dict) else ""

    def _value(self, obj: Any, previous: V | None) -> V | None:
        """The stored value of an object; raises what the transform raises."""
        return self._transform(obj, previous)

    def _store(self, obj: Any) -> tuple[str, V | None]:
        """(key, value), or (key, None) when the transform raised: the object is skipped
        (counted, reported to ``on_skip``), never the cache."""
        key = self._key(obj)
        try:
            return key, self._value(obj, self._items.get(key))
        except Exception as exc:  # noqa: BLE001 - one hostile object must not stop the others
            self.skipped += 1
            if self._on_skip is not None:
                try:
                    self._on_skip(key, exc)
                except Exception:  # noqa: BLE001, S110 - a reporting hook must not either
                    pass
            return key, None

    def _list(self) -> None:
        items: dict[str, V] = {}
        resource_version = ""
        pages = list_pages(
            self._session, self.path, self._query, self.what, self._page_size, self.rbac
        )
        for objects, version in pages:
            resource_version = version
            for obj in objects:
                key, value = self._store(obj)
                if value is not None:
                    items[key] = value
            del objects  # this page is freed before the next is read
            self._contact()
        with self._lock:
            before, self._items = self._items, items
            self.version += 1
        self.resource_version = resource_version
        self.lists += 1
        self._contact()
        self._synced.set()
        if self._on_change is not None:
            old: V | None
            for key, old in before.items():
                if key not in items:
                    self._changed(key, old, None)
            for key, new in items.items():
                old = before.get(key)
                if old is not new:
                    self._changed(key, old, new)

    def _changed(self, key: str, old: Any, new: Any) -> None:
        """Tell ``on_change``; a hook that raises is logged through ``on_error``, never kills
        the loop."""
        if self._on_change is None or (old is None and new is None):
            return
        try:
            self._on_change(key, old, new)
        except Exception as exc:  # noqa: BLE001 - a consumer's bug must not stop the watch
            if self._on_error is not None:
                self._on_error(KubeUnavailable(f"{self.what}: on_change raised {exc!r}"))

    def _watch(self) -> bool:
        """One WATCH until the server ends it. Returns True when a new LIST is needed."""
        what = self.what
        try:
            self._response = open_watch(
                self._session, self.path, self._query, self.resource_version,
                timeout_s=self._timeout_s, watch_timeout_s=self._watch_timeout_s,
            )  # fmt: skip
            self._contact()
            for kind, obj in watch_events(self._response, self._stop.is_set):
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        return True
                    raise KubeUnavailable(
                        f"watch {what}: {code} {obj.get('message', '')}".strip(),
                        status=code, verb="watch",
                    )  # fmt: skip
                self._apply(kind, obj)
                self.events += 1
                self._contact()
            self._contact()
            return False
        except ApiException as exc:
            if exc.status == 410:
                return True
            raise wrap(exc, "watch", what, self.rbac) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            # (AttributeError: http.client's read on a response that stop() closed)
            if self._stop.is_set():
                return False
            raise wrap(exc, "watch", what, self.rbac) from exc
        finally:
            response, self._response = self._response, None
            release(response)

    def _apply(self, kind: Any, obj: Any) -> None:
        """Store one WATCH event's object (``ADDED``, ``MODIFIED``) or drop it (``DELETED``)."""
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.resource_version = meta["resourceVersion"]
        if kind in ("ADDED", "MODIFIED"):
            key, value = self._store(obj)
            with self._lock:
                old = self._items.get(key)
                if value is None:
                    self._items.pop(key, None)  # unknown beats wrong
                else:
                    self._items[key] = value
                self.version += 1
            if old is not value:
                self._changed(key, old, value)
        elif kind == "DELETED":
            key = self._key(obj)
            with self._lock:
                old = self._items.pop(key, None)
                self.version += 1
            self._changed(key, old, None)
