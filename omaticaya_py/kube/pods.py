"""Pods in one list+watch cache (an informer), for the scheduler extender's in-flight placements."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines as _watch_lines

from .errors import KubeError, KubeUnavailable, wrap
from .session import ApiSession

__all__ = ["PodCache"]

V = TypeVar("V")


def pod_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod document ("" when it has neither)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return ""
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class PodCache(Generic[V]):
    """An informer-style cache of the pods that match ``field_selector`` (every namespace): one
    LIST, then a WATCH from its resourceVersion, in a daemon thread; readers never call the API.

    Each pod document goes through ``transform(pod, previous)`` once per event (``previous``:
    the value stored for that pod before, or ``None``): a value is stored under
    ``namespace/name``, ``None`` drops the pod (not interesting, or finished). A pod whose
    ``transform`` raises is dropped, counted in ``skipped`` and passed to ``on_skip(key, exc)``;
    the others and the watch go on. ``version`` grows with every change (readers cache derived
    indexes by it). An expired watch (410) lists again; other failures are wrapped in
    ``KubeError``, passed to ``on_error`` and retried with exponential backoff, keeping the last
    known pods. RBAC: ``list`` and ``watch`` on ``pods``.
    """

    def __init__(
        self,
        transform: Callable[[Mapping[str, Any], V | None], V | None],
        *,
        field_selector: str = "",
        kubeconfig: str | None = None,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        watch_timeout_s: int = 300,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        on_error: Callable[[KubeError], None] | None = None,
        on_skip: Callable[[str, Exception], None] | None = None,
    ) -> None:
        self._transform = transform
        self._field_selector = field_selector
        self._on_skip = on_skip
        self._on_error = on_error
        self._timeout_s = timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
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
        self.version = 0
        self.lists = 0
        self.events = 0
        self.skipped = 0
        self.last_error: KubeError | None = None

    @property
    def synced(self) -> bool:
        """True once the first LIST has been stored."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        return self._synced.wait(timeout_s)

    @property
    def requests(self) -> Any:
        """API requests by ``(verb, result)`` (the session's accounting)."""
        return self._session.requests

    def snapshot(self) -> dict[str, V]:
        """A copy of every stored value by ``namespace/name``."""
        with self._lock:
            return dict(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def start(self) -> PodCache[V]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pod-cache", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # shutdown(), not close(): closing the reader blocks on the lock of the read in
            # progress in the watch thread (a quiet watch: up to watch_timeout_s); shutting the
            # socket down ends that read now
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

    # -- the loop ------------------------------------------------------------------------

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
                else:
                    err = KubeUnavailable(
                        f"list/watch pods: unexpected {type(exc).__name__}: {exc}", verb="watch"
                    )
                    err.__cause__ = exc
                    need_list = True
                self.last_error = err
                if self._on_error is not None:
                    self._on_error(err)
                failures += 1
                delay = min(self._backoff_max_s, self._backoff_s * 2 ** min(failures, 10))
                self._stop.wait(random.uniform(delay / 2, delay))

    def _value(self, obj: Any, previous: Mapping[str, V]) -> tuple[str, V | None]:
        key = pod_key(obj) if isinstance(obj, Mapping) else ""
        try:
            return key, self._transform(obj, previous.get(key))
        except Exception as exc:  # noqa: BLE001 - one hostile pod must not stop the others
            self.skipped += 1
            if self._on_skip is not None:
                try:
                    self._on_skip(key, exc)
                except Exception:  # noqa: BLE001, S110
                    pass
            return key, None

    def _query(self) -> dict[str, str]:
        return {"fieldSelector": self._field_selector} if self._field_selector else {}

    def _list(self) -> None:
        response = self._session.call(
            "list", "pods", lambda: self._session.http("GET", "/api/v1/pods", query=self._query())
        )
        try:
            body = json.loads(response.data)
        except ValueError as exc:
            raise KubeUnavailable(f"list pods: bad JSON: {exc}", verb="list") from exc
        items: dict[str, V] = {}
        for item in body.get("items") or []:
            key, value = self._value(item, self._items)
            if value is not None:
                items[key] = value
        with self._lock:
            self._items = items
            self.version += 1
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion", "")
        self.lists += 1
        self._synced.set()

    def _watch(self) -> bool:
        """One WATCH until the server ends it. Returns True when a new LIST is needed."""
        try:
            self._response = self._session.http(
                "GET",
                "/api/v1/pods",
                query={
                    **self._query(),
                    "watch": "true",
                    "resourceVersion": self.resource_version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": str(int(self._watch_timeout_s)),
                },
                timeout=(self._timeout_s, self._watch_timeout_s + self._timeout_s),
                stream=True,
            )
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
                        f"watch pods: {code} {obj.get('message', '')}".strip(),
                        status=code, verb="watch",
                    )  # fmt: skip
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    self.resource_version = meta["resourceVersion"]
                if kind in ("ADDED", "MODIFIED"):
                    key, value = self._value(obj, self._items)
                    with self._lock:
                        if value is None:
                            self._items.pop(key, None)
                        else:
                            self._items[key] = value
                        self.version += 1
                elif kind == "DELETED":
                    with self._lock:
                        self._items.pop(pod_key(obj), None)
                        self.version += 1
                self.events += 1
            return False
        except ApiException as exc:
            if exc.status == 410:
                return True
            raise wrap(exc, "watch", "pods") from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            if self._stop.is_set():
                return False
            raise wrap(exc, "watch", "pods") from exc
        finally:
            response, self._response = self._response, None
            if response is not None:
                try:
                    response.release_conn()
                except Exception:  # noqa: BLE001
                    pass
