"""Every Node in one list+watch cache (an informer), for the scheduler extender."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines as _watch_lines

from ..core.patch import NodeMeta
from .errors import KubeError, KubeUnavailable, wrap
from .session import ApiSession

__all__ = ["NodeCache"]

V = TypeVar("V")


class NodeCache(Generic[V]):
    """An informer-style cache of every Node: one LIST, then a WATCH from its resourceVersion,
    in a daemon thread. Readers (``get``, ``snapshot``) never call the API.

    Each Node's metadata (``NodeMeta``: name, uid, labels, annotations) goes through
    ``transform`` once per event and the result is stored, so that the work of parsing a Node is
    done when it changes, not when it is read. A watch that ends (server timeout, dropped
    connection) resumes from the last resourceVersion; an expired one (410 Gone) lists again.
    Failures are wrapped in ``KubeError`` types, passed to ``on_error`` and retried with
    exponential backoff (``backoff_s`` to ``backoff_max_s``); while the API is unreachable the
    last known state stays (``synced`` stays true once the first LIST succeeded). Any other
    exception in the loop (a bug) is reported the same way and followed by a fresh LIST: the
    thread never dies of one.

    A Node's content is untrusted (many controllers can write annotations): when ``transform``
    raises on one Node, that Node is dropped from the cache (readers see it as unknown),
    ``skipped`` is incremented and ``on_skip(name, exception)`` is called; the other Nodes and the
    watch go on. ``health()`` says whether the loop is alive and has had a successful LIST or
    WATCH answer within ``stall_s`` seconds (default: one watch timeout plus slack).

    Configuration as ``ApiSession`` (``kubeconfig``, in-cluster service account otherwise).
    RBAC: ``list`` and ``watch`` on ``nodes``.

    Subclasses watch another kind by setting ``path`` (the collection's URL), ``what`` (its
    name in messages) and overriding ``_key_value`` (``leases.LeaseCache``).
    """

    #: the collection listed and watched, and its name in errors and health reasons
    path = "/api/v1/nodes"
    what = "nodes"
    label = "node cache"

    def __init__(
        self,
        transform: Callable[[NodeMeta], V],
        *,
        kubeconfig: str | None = None,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        on_error: Callable[[KubeError], None] | None = None,
        on_skip: Callable[[str, Exception], None] | None = None,
        stall_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transform = transform
        self._on_skip = on_skip
        self._clock = clock
        # a quiet cluster sends nothing on an open watch until the server ends it after
        # watch_timeout_s; the client's read timeout ends a dead one timeout_s later
        self.stall_s = (
            stall_s if stall_s is not None else watch_timeout_s + 2 * timeout_s + backoff_max_s
        )
        self._last_ok_s: float | None = None
        self._timeout_s = timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._on_error = on_error
        # the session brings the configuration, token rotation and request accounting; its
        # retries are kept to one attempt: this loop does its own backoff
        self._session = ApiSession(
            kubeconfig=kubeconfig, environ=environ, timeout_s=timeout_s, attempts=1
        )
        self._items: dict[str, V] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.resource_version = ""
        self.lists = 0
        self.events = 0
        self.last_error: KubeError | None = None
        #: Nodes dropped because ``transform`` raised on them (counted once per event)
        self.skipped = 0

    @property
    def server(self) -> str:
        """The API server URL in use."""
        return self._session.server

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

    def get(self, name: str) -> V | None:
        """The stored value for Node ``name``, or ``None`` when the cache has no such Node."""
        return self._items.get(name)

    def snapshot(self) -> dict[str, V]:
        """A copy of every stored value by Node name."""
        with self._lock:
            return dict(self._items)

    def __len__(self) -> int:
        return len(self._items)

    # -- the loop ------------------------------------------------------------------------

    def start(self) -> NodeCache[V]:
        """Start the list+watch thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=self.label.replace(" ", "-"), daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (closes the open watch) and the HTTP connection pool."""
        self._stop.set()
        response = self._response
        if response is not None:
            # shutdown(), not close(): closing the reader blocks on the lock of the read in
            # progress in the watch thread (a quiet watch: up to watch_timeout_s); shutting the
            # socket down ends that read now (as PodCache does)
            try:
                if hasattr(response, "shutdown"):
                    response.shutdown()
                else:
                    threading.Thread(target=response.close, daemon=True).start()
            except Exception:  # noqa: BLE001 - a half-dead socket
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._session.close()

    def _report(self, err: KubeError) -> None:
        self.last_error = err
        if self._on_error is not None:
            self._on_error(err)

    def _run(self) -> None:
        failures = 0
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                need_list = self._watch()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the cache must outlive any one failure
                if self._stop.is_set():
                    break
                if isinstance(exc, KubeError):
                    err = exc
                    if err.status == 410:
                        need_list = True
                        continue
                else:  # a bug or an answer of a shape we did not expect: start over
                    err = KubeUnavailable(
                        f"list/watch {self.what}: unexpected {type(exc).__name__}: {exc}", verb="watch"
                    )
                    err.__cause__ = exc
                    need_list = True
                self._report(err)
                failures += 1
                delay = min(self._backoff_max_s, self._backoff_s * 2 ** min(failures, 10))
                self._stop.wait(random.uniform(delay / 2, delay))

    def _key_value(self, obj: dict[str, Any]) -> tuple[str, V]:
        """(name, ``transform`` of the Node's ``NodeMeta``); raises what ``transform`` raises."""
        meta = obj.get("metadata") or {}
        node = NodeMeta(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
        )
        return node.name, self._transform(node)

    def _store(self, obj: dict[str, Any]) -> tuple[str, V | None]:
        """(name, transformed value), or (name, None) when ``transform`` raised: the object is
        skipped (counted, reported to ``on_skip``), never the cache."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name", "") if isinstance(meta, dict) else ""
        try:
            return self._key_value(obj)
        except Exception as exc:  # noqa: BLE001 - one hostile object must not stop the others
            self.skipped += 1
            if self._on_skip is not None:
                try:
                    self._on_skip(name, exc)
                except Exception:  # noqa: BLE001, S110 - a reporting hook must not either
                    pass
            return name, None

    def _list(self) -> None:
        response = self._session.call(
            "list", self.what, lambda: self._session.http("GET", self.path)
        )
        try:
            body = json.loads(response.data)
        except ValueError as exc:
            raise KubeUnavailable(f"list {self.what}: bad JSON: {exc}", verb="list") from exc
        items: dict[str, V] = {}
        for item in body.get("items") or []:
            name, value = self._store(item if isinstance(item, dict) else {})
            if value is not None:
                items[name] = value
        with self._lock:
            self._items = items
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion", "")
        self.lists += 1
        self._contact()
        self._synced.set()

    def _watch(self) -> bool:
        """One WATCH until the server ends it. Returns True when a new LIST is needed."""
        what = self.what
        try:
            self._response = self._session.http(
                "GET",
                self.path,
                query={
                    "watch": "true",
                    "resourceVersion": self.resource_version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": str(int(self._watch_timeout_s)),
                },
                timeout=(self._timeout_s, self._watch_timeout_s + self._timeout_s),
                stream=True,
            )
            self._contact()
            for line in _watch_lines(self._response):
                if self._stop.is_set():
                    return False
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        return True
                    raise KubeUnavailable(
                        f"watch {what}: {code} {obj.get('message', '')}".strip(),
                        status=code, verb="watch",
                    )
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    self.resource_version = meta["resourceVersion"]
                if kind in ("ADDED", "MODIFIED"):
                    name, value = self._store(obj)
                    with self._lock:
                        if value is None:
                            self._items.pop(name, None)  # unknown beats wrong
                        else:
                            self._items[name] = value
                elif kind == "DELETED":
                    with self._lock:
                        self._items.pop(meta.get("name", ""), None)
                self.events += 1
                self._contact()
            self._contact()
            return False
        except ApiException as exc:
            if exc.status == 410:
                return True
            raise wrap(exc, "watch", what) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            # (AttributeError: http.client's read on a response that stop() closed)
            if self._stop.is_set():
                return False
            raise wrap(exc, "watch", what) from exc
        finally:
            response, self._response = self._response, None
            if response is not None:
                try:
                    response.release_conn()
                except Exception:  # noqa: BLE001
                    pass
