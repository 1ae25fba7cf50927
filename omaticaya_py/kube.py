"""Kubernetes edge: the only module that imports the ``kubernetes`` client.

``NodeClient`` reads the agent's own Node, sends JSON merge patches
(``application/merge-patch+json``) to its metadata, and posts Events about it; ``NodeCache``
lists and watches every Node for the scheduler extender. Configuration comes from the in-cluster
service account (``KUBERNETES_SERVICE_HOST`` set) or from ``KUBECONFIG`` / ``~/.kube/config``.

Failures are raised as this module's own exceptions (``KubeError`` and subclasses, the client's
exception chained as ``__cause__``) so that the rest of the agent never handles library types.
Transient failures (connection refused or reset, timeouts, 429, 5xx, and 409 for a PATCH or
PUT, never for a create) are retried here with exponential backoff and full jitter by tenacity,
honouring ``Retry-After``; a 401 reloads the credentials once (a rotated service-account token);
403 and 404 are not retried.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

import tenacity
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config
from kubernetes.watch.watch import iter_resp_lines as _watch_lines

from .patch import MergePatch, NodeMeta

__all__ = [
    "parse_quantity",
    "KubeError",
    "KubeUnavailable",
    "KubeForbidden",
    "NodeNotFound",
    "KubeRejected",
    "NodeClient",
    "NodeCache",
]

MERGE_PATCH = "application/merge-patch+json"
_NODE_PATH = "/api/v1/nodes/{name}"
_TRANSIENT_STATUS = frozenset({409, 429, 500, 502, 503, 504})


def parse_quantity(text: str) -> Any:
    """A Kubernetes resource quantity (``30Gi``, ``1.5Gi``, ``30G``, ``512Mi``, ``100m``) as a
    ``decimal.Decimal`` in base units, by the official client's parser
    (``kubernetes.utils.parse_quantity``). Raises ``ValueError`` for text that is not a
    quantity."""
    from kubernetes.utils.quantity import parse_quantity as parse

    try:
        return parse(text)
    except (ValueError, ArithmeticError) as exc:
        raise ValueError(f"not a quantity: {text!r}") from exc


class KubeError(RuntimeError):
    """A Kubernetes API request failed. ``status`` is the HTTP status (``None`` when no answer
    came back); ``verb`` names the operation (``get``, ``patch``, ``create``)."""

    def __init__(self, message: str, *, status: int | None = None, verb: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.verb = verb
        self.retry_after_s: float | None = None


class KubeUnavailable(KubeError):
    """No answer, a timeout, or a transient status (409, 429, 5xx) after the retries."""


class KubeForbidden(KubeError):
    """401/403: the credentials are wrong or RBAC does not allow the request."""


class NodeNotFound(KubeError):
    """404: the Node does not exist (deleted, or ``NODE_NAME`` is wrong)."""


class KubeRejected(KubeError):
    """Any other 4xx: the API server refused the request (a bug, not a fault to retry)."""


def _retry_after_s(exc: ApiException) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _wrap(exc: Exception, verb: str, what: str) -> KubeError:
    if isinstance(exc, ApiException):
        status = exc.status
        reason = (exc.reason or "").strip()
        detail = ""
        try:
            detail = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        message = f"{verb} {what}: HTTP {status} {reason}" + (f": {detail}" if detail else "")
        kind: type[KubeError]
        if status == 404:
            kind = NodeNotFound
        elif status in (401, 403):
            kind = KubeForbidden
            if status == 403:
                message += " (RBAC: the agent needs get and patch on nodes, create/patch on events)"
        elif status in _TRANSIENT_STATUS or not status or status >= 500:  # 0: no answer (TLS)
            kind = KubeUnavailable
        else:
            kind = KubeRejected
        err = kind(message, status=status, verb=verb)
        err.retry_after_s = _retry_after_s(exc)
        return err
    return KubeUnavailable(f"{verb} {what}: {type(exc).__name__}: {exc}", verb=verb)


#: verbs whose 409 (Conflict) is worth another attempt: an update that raced another writer
_RETRY_CONFLICT_VERBS = frozenset({"patch", "put", "update"})


def _transient(exc: BaseException) -> bool:
    """Whether tenacity tries again: no answer, 429, 5xx; a 409 only for a PATCH or PUT. A 409
    on a create (POST) means the object exists (an earlier attempt succeeded and its answer was
    lost): another POST would only say so again."""
    if not isinstance(exc, KubeUnavailable):
        return False
    return exc.status != 409 or exc.verb in _RETRY_CONFLICT_VERBS


class _Wait(tenacity.wait.wait_base):
    """Exponential backoff with full jitter, but never shorter than a ``Retry-After``."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.backoff = tenacity.wait_random_exponential(multiplier=initial_s, max=max_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        retry_after = getattr(exc, "retry_after_s", None) or 0.0
        return max(float(retry_after), self.backoff(retry_state))


class NodeClient:
    """Reads and patches one Node (``/api/v1/nodes/{node_name}``) and posts its Events.

    - ``kubeconfig``: path, else in-cluster config when ``KUBERNETES_SERVICE_HOST`` is set in
      ``environ`` (service-account ``token_file`` and ``ca_file``; a rotated token file is
      re-read before the next request), else the default kubeconfig.
    - ``timeout_s``: per request; ``attempts`` and ``backoff_s``/``backoff_max_s`` bound the
      retries of one call; ``sleep`` is tenacity's sleep (tests pass a no-op).
    - ``requests`` counts requests by ``(verb, result)``, result being the HTTP status or
      ``"error"`` for no answer (read by the metrics collector).
    Raises ``KubeError`` subclasses; a bad or missing configuration raises ``KubeError``.
    """

    def __init__(
        self,
        node_name: str,
        *,
        kubeconfig: str | None = None,
        environ: Mapping[str, str] | None = None,
        token_file: str = incluster_config.SERVICE_TOKEN_FILENAME,
        ca_file: str = incluster_config.SERVICE_CERT_FILENAME,
        timeout_s: float = 10.0,
        attempts: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        sleep: Callable[[float], None] = tenacity.nap.sleep,
    ) -> None:
        self.node_name = node_name
        self.timeout_s = timeout_s
        self._kubeconfig = kubeconfig
        self._environ = os.environ if environ is None else environ
        self._token_file = token_file
        self._ca_file = ca_file
        self._token_stamp: tuple[int, int] | None = None
        self.requests: Counter[tuple[str, str]] = Counter()
        #: set by ``begin_shutdown``: no more retries, requests bounded by the deadline
        self.stopping = threading.Event()
        self._deadline_s: float | None = None
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transient),
            stop=tenacity.stop_after_attempt(attempts) | tenacity.stop_when_event_set(self.stopping),
            wait=_Wait(backoff_s, backoff_max_s),
            sleep=sleep,
            reraise=True,
        )
        self._api = self._connect()

    # -- configuration -------------------------------------------------------------------

    def _connect(self) -> client.ApiClient:
        cfg = client.Configuration()
        try:
            if self._kubeconfig is None and self._environ.get("KUBERNETES_SERVICE_HOST"):
                incluster_config.InClusterConfigLoader(
                    token_filename=self._token_file,
                    cert_filename=self._ca_file,
                    environ=self._environ,
                ).load_and_set(cfg)
                self._token_stamp = self._stamp()
                cfg.refresh_api_key_hook = self._reload_rotated_token
            else:
                config.load_kube_config(config_file=self._kubeconfig, client_configuration=cfg)
        except (config.ConfigException, OSError, ValueError) as exc:
            raise KubeError(f"no Kubernetes configuration: {exc}") from exc
        cfg.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0)
        # The ApiClient alone (not CoreV1Api): the typed API class costs ~21 MiB of RSS for three
        # requests whose answers we read as plain JSON anyway.
        return client.ApiClient(cfg)

    def _stamp(self) -> tuple[int, int]:
        st = os.stat(self._token_file)
        return (st.st_mtime_ns, st.st_size)

    def _reload_rotated_token(self, cfg: client.Configuration) -> None:
        """Before each request: re-read the service-account token when its file changed.

        The kubelet rotates projected tokens by swapping the file; the client's own loader
        would keep the old token for up to a minute."""
        try:
            stamp = self._stamp()
            if stamp == self._token_stamp:
                return
            with open(self._token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError:
            return  # keep the token we have; a 401 will say so
        if token:
            cfg.api_key["BearerToken"] = "bearer " + token
            self._token_stamp = stamp

    @property
    def server(self) -> str:
        """The API server URL in use."""
        return str(self._api.configuration.host)

    def begin_shutdown(self, deadline_s: float) -> None:
        """From now on, each call makes one attempt (no retries: tenacity stops when
        ``stopping`` is set), and a request's timeout is cut to what is left until
        ``deadline_s`` (``time.monotonic()`` seconds); past it, a call raises
        ``KubeUnavailable`` without a request. Safe to call from a signal handler."""
        self._deadline_s = deadline_s
        self.stopping.set()

    def _timeout(self, timeout: Any) -> Any:
        """The request timeout: ``timeout`` or ``timeout_s``, cut to the shutdown deadline."""
        timeout = timeout or self.timeout_s
        if self._deadline_s is None:
            return timeout
        left = self._deadline_s - time.monotonic()
        if left <= 0:
            raise KubeUnavailable("shutdown deadline passed: request not sent")
        if isinstance(timeout, tuple):
            return tuple(min(t, left) for t in timeout)
        return min(timeout, left)

    # -- requests ------------------------------------------------------------------------

    def _call(self, verb: str, what: str, fn: Callable[[], Any]) -> Any:
        reloaded = False

        def attempt() -> Any:
            nonlocal reloaded
            try:
                response = fn()
            except ApiException as exc:
                self.requests[(verb, str(exc.status))] += 1
                if exc.status == 401 and not reloaded:  # credentials replaced: reload once
                    reloaded = True
                    self._api = self._connect()
                    return attempt()
                raise _wrap(exc, verb, what) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                self.requests[(verb, "error")] += 1
                raise _wrap(exc, verb, what) from exc
            self.requests[(verb, str(response.status))] += 1
            return response

        return self._retrying(attempt)

    @staticmethod
    def _meta(response: Any) -> NodeMeta:
        body = json.loads(response.data)
        meta = body.get("metadata", {})
        return NodeMeta(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
        )

    def _http(
        self,
        method: str,
        path: str,
        *,
        path_params: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: Any = None,
        stream: bool = False,
    ) -> Any:
        """One request through the official client's ``ApiClient`` (its serialisation, auth,
        TLS and token refresh); returns the urllib3 response, its body already read unless
        ``stream``. A non-2xx status raises the client's ``ApiException``, as its typed API
        does. ``self._api`` is looked up per call: a 401 swaps in fresh credentials."""
        api = self._api
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = api.param_serialize(
            method,
            path,
            path_params=path_params,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        answer = api.call_api(*params, _request_timeout=self._timeout(timeout))
        raw = answer.response
        if not 200 <= answer.status < 300:
            text = raw.data.decode("utf-8", "replace")
            exc = ApiException(status=answer.status, reason=answer.reason, body=text)
            exc.headers = raw.headers  # Retry-After
            raise exc
        if not stream:
            _ = raw.data  # read now, so that the connection goes back to the pool
        return raw

    def get_node(self) -> NodeMeta:
        """GET the Node; returns its name, uid, labels and annotations.

        Raises ``NodeNotFound``, ``KubeForbidden``, ``KubeUnavailable``, ``KubeRejected``."""
        response = self._call(
            "get",
            f"node {self.node_name}",
            lambda: self._http("GET", _NODE_PATH, path_params={"name": self.node_name}),
        )
        return self._meta(response)

    def patch_node(self, patch: MergePatch) -> NodeMeta:
        """PATCH the Node with a JSON merge patch (RFC 7386) and return the Node as stored.

        Raises as ``get_node``."""
        response = self._call(
            "patch",
            f"node {self.node_name}",
            lambda: self._http(
                "PATCH",
                _NODE_PATH,
                path_params={"name": self.node_name},
                body=patch,
                content_type=MERGE_PATCH,
            ),
        )
        return self._meta(response)

    def create_node_event(
        self, *, node_uid: str, reason: str, message: str, warning: bool, namespace: str = "default"
    ) -> None:
        """POST a core/v1 Event about the Node (as the kubelet does, in ``namespace``).

        ``reason`` is CamelCase (``GpuUnhealthy``), ``warning`` picks type Warning or Normal;
        reporting component ``omaticaya``, instance the Node name. A 409 (AlreadyExists: the
        Event's name is unique to this call, so an earlier attempt of it got through) counts as
        posted; it is never retried. Raises ``KubeError`` otherwise."""
        now = datetime.now(timezone.utc)
        stamp = now.strftime("%Y%m%d%H%M%S%f")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.node_name}.omaticaya.{stamp}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": node_uid or self.node_name,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "omaticaya", "host": self.node_name},
            "reportingComponent": "omaticaya",
            "reportingInstance": self.node_name,
            "firstTimestamp": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "lastTimestamp": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "count": 1,
        }
        try:
            self._call(
                "create",
                f"event {reason} on node {self.node_name}",
                lambda: self._http(
                    "POST",
                    "/api/v1/namespaces/{namespace}/events",
                    path_params={"namespace": namespace},
                    body=body,
                    content_type="application/json",
                ),
            )
        except KubeError as err:
            if err.status != 409:
                raise

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._api.close()


# -- a cache of every Node (list + watch), for the scheduler extender ------------------------

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

    Configuration as ``NodeClient`` (``kubeconfig``, in-cluster service account otherwise).
    RBAC: ``list`` and ``watch`` on ``nodes``.
    """

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
        # NodeClient brings the configuration, token rotation and request accounting; its
        # retries are kept to one attempt: this loop does its own backoff.
        self._client = NodeClient(
            "", kubeconfig=kubeconfig, environ=environ, timeout_s=timeout_s, attempts=1
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
        return self._client.server

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
            return False, "node cache thread is not running"
        if not self.synced:
            why = f" (last error: {self.last_error})" if self.last_error else ""
            return False, "node cache not synced yet" + why
        last = self._last_ok_s
        age = self._clock() - last if last is not None else float("inf")
        if age > self.stall_s:
            why = f"; last error: {self.last_error}" if self.last_error else ""
            return False, (
                f"node cache stalled: no successful list or watch for {age:.0f}s "
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
            self._thread = threading.Thread(target=self._run, name="node-cache", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (closes the open watch) and the HTTP connection pool."""
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing a half-dead socket
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._client.close()

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
                        f"list/watch nodes: unexpected {type(exc).__name__}: {exc}", verb="watch"
                    )
                    err.__cause__ = exc
                    need_list = True
                self._report(err)
                failures += 1
                delay = min(self._backoff_max_s, self._backoff_s * 2 ** min(failures, 10))
                self._stop.wait(random.uniform(delay / 2, delay))

    def _store(self, meta: dict[str, Any]) -> tuple[str, V | None]:
        """(name, transformed value), or (name, None) when ``transform`` raised: the Node is
        skipped (counted, reported to ``on_skip``), never the cache."""
        node = NodeMeta(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
        )
        try:
            return node.name, self._transform(node)
        except Exception as exc:  # noqa: BLE001 - one hostile Node must not stop the others
            self.skipped += 1
            if self._on_skip is not None:
                try:
                    self._on_skip(node.name, exc)
                except Exception:  # noqa: BLE001, S110 - a reporting hook must not either
                    pass
            return node.name, None

    def _list(self) -> None:
        response = self._client._call(
            "list", "nodes", lambda: self._client._http("GET", "/api/v1/nodes")
        )
        try:
            body = json.loads(response.data)
        except ValueError as exc:
            raise KubeUnavailable(f"list nodes: bad JSON: {exc}", verb="list") from exc
        items: dict[str, V] = {}
        for item in body.get("items") or []:
            name, value = self._store(item.get("metadata") or {})
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
        what = "nodes"
        try:
            self._response = self._client._http(
                "GET",
                "/api/v1/nodes",
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
                    name, value = self._store(meta)
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
            raise _wrap(exc, "watch", what) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            # (AttributeError: http.client's read on a response that stop() closed)
            if self._stop.is_set():
                return False
            raise _wrap(exc, "watch", what) from exc
        finally:
            response, self._response = self._response, None
            if response is not None:
                try:
                    response.release_conn()
                except Exception:  # noqa: BLE001
                    pass
