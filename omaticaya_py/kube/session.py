"""A session with the Kubernetes API: configuration, credentials, requests and retries.

The only place that talks HTTP to the API server, through the official client's ``ApiClient``
(its serialisation, auth, TLS and token refresh). Configuration comes from the in-cluster
service account (``KUBERNETES_SERVICE_HOST`` set) or from ``KUBECONFIG`` / ``~/.kube/config``.
``NodeClient`` (one Node) and ``NodeCache`` (every Node) each hold one.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict, Unpack

import tenacity
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config

from .errors import KubeError, KubeUnavailable, RetryWait, is_transient, wrap

__all__ = ["ApiConfig", "ApiSession", "HttpRequest", "RetryPolicy"]


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """Where the configuration and credentials come from. ``kubeconfig``: a path, else the
    in-cluster configuration when ``KUBERNETES_SERVICE_HOST`` is set in ``environ`` (``None``:
    this process's; the service account's ``token_file`` and ``ca_file``; a rotated token file is
    re-read before the next request), else the default kubeconfig; ``context``: the
    kubeconfig's context to use (kubectl's ``--context``; ``None``: its current one)."""

    kubeconfig: str | None = None
    context: str | None = None
    environ: Mapping[str, str] | None = None
    token_file: str = incluster_config.SERVICE_TOKEN_FILENAME
    ca_file: str = incluster_config.SERVICE_CERT_FILENAME


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """One call's requests: ``timeout_s`` per request, seconds; at most ``attempts`` of it,
    waiting ``backoff_s`` to ``backoff_max_s`` seconds between (``errors.RetryWait``);
    ``sleep``, tenacity's sleep (tests pass a no-op)."""

    timeout_s: float = 10.0
    attempts: int = 4
    backoff_s: float = 0.2
    backoff_max_s: float = 5.0
    sleep: Callable[[float], None] = tenacity.nap.sleep


_CONFIG_NAMES = frozenset(f.name for f in fields(ApiConfig))
_RETRY_NAMES = frozenset(f.name for f in fields(RetryPolicy))


class HttpRequest(TypedDict, total=False):
    """The optional parts of one ``ApiSession.http`` request: ``path_params`` (the path's
    ``{name}`` parts), ``query`` (query parameters), ``body`` (serialised by the client),
    ``content_type`` (a patch's: merge, strategic or apply), ``timeout`` (seconds, or the
    client's ``(connect, read)``; default the session's) and ``stream`` (leave the body unread:
    a watch)."""

    path_params: dict[str, str] | None
    query: dict[str, str] | None
    body: Any
    content_type: str | None
    timeout: Any
    stream: bool


class ApiSession:
    """Requests to the API server with retries and accounting.

    - ``config``: where the configuration and credentials come from (``ApiConfig``);
    - ``retries``: the per-request timeout and the retries of one call (``RetryPolicy``);
    - ``named``: any field of either, by name (``ApiSession(kubeconfig=..., attempts=1)``),
      over ``config`` and ``retries``; another name raises ``TypeError``.
    - ``requests`` counts requests by ``(verb, result)``, result being the HTTP status or
      ``"error"`` for no answer (read by the metrics collector).
    A bad or missing configuration raises ``KubeError``.
    """

    def __init__(self, config: ApiConfig | None = None, retries: RetryPolicy | None = None,
                 **named: Any) -> None:  # fmt: skip
        config, retries = _with_fields(config or ApiConfig(), retries or RetryPolicy(), named)
        self.timeout_s = retries.timeout_s
        self._kubeconfig = config.kubeconfig
        self._context = config.context or None
        self._environ = os.environ if config.environ is None else config.environ
        self._token_file = config.token_file
        self._ca_file = config.ca_file
        self._token_stamp: tuple[int, int] | None = None
        self.requests: Counter[tuple[str, str]] = Counter()
        #: set by ``begin_shutdown``: no more retries, requests bounded by the deadline
        self.stopping = threading.Event()
        self._deadline_s: float | None = None
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            stop=tenacity.stop_after_attempt(retries.attempts)
            | tenacity.stop_when_event_set(self.stopping),
            wait=RetryWait(retries.backoff_s, retries.backoff_max_s),
            sleep=retries.sleep,
            reraise=True,
        )
        self._api = self._connect()

    # -- configuration -------------------------------------------------------------------

    def _connect(self) -> client.ApiClient:
        cfg = client.Configuration()
        try:
            in_cluster = self._kubeconfig is None and self._context is None
            if in_cluster and self._environ.get("KUBERNETES_SERVICE_HOST"):
                incluster_config.InClusterConfigLoader(
                    token_filename=self._token_file,
                    cert_filename=self._ca_file,
                    environ=self._environ,
                ).load_and_set(cfg)
                self._token_stamp = self._stamp()
                cfg.refresh_api_key_hook = self._reload_rotated_token  # type: ignore[assignment]  # typed None
            else:
                config.load_kube_config(
                    config_file=self._kubeconfig, context=self._context, client_configuration=cfg
                )
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

    def call(
        self, verb: str, what: str, fn: Callable[[], Any], *, rbac: str = "", retry: bool = True
    ) -> Any:
        """``fn()`` (one or more ``http`` requests) with the retries and accounting: counted in
        ``requests`` by ``(verb, status)``; transient failures retried (``retry`` False: one
        attempt, for a caller that tries again on its own schedule: an eviction a
        PodDisruptionBudget refuses with 429 is asked again next tick, not within this call); a
        401 reloads the credentials once. Raises ``KubeError`` subclasses (``what`` names the
        object; ``rbac``, what the request needs, is said in a 403's message: see
        ``errors.wrap``)."""
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
                raise wrap(exc, verb, what, rbac) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                self.requests[(verb, "error")] += 1
                raise wrap(exc, verb, what) from exc
            self.requests[(verb, str(response.status))] += 1
            return response

        return self._retrying(attempt) if retry else attempt()

    def http(self, method: str, path: str, **request: Unpack[HttpRequest]) -> Any:
        """One request through the official client's ``ApiClient`` (its serialisation, auth,
        TLS and token refresh), ``request`` as ``HttpRequest`` says; returns the urllib3
        response, its body already read unless ``stream``. A non-2xx status raises the
        client's ``ApiException``, as its typed API does. ``self._api`` is looked up per call:
        a 401 swaps in fresh credentials."""
        api = self._api
        headers = {"Accept": "application/json"}
        if content_type := request.get("content_type"):
            headers["Content-Type"] = content_type
        params = api.param_serialize(
            method,
            path,
            path_params=request.get("path_params"),
            query_params=list((request.get("query") or {}).items()),
            header_params=headers,
            body=request.get("body"),
            auth_settings=["BearerToken"],
        )
        answer = api.call_api(*params, _request_timeout=self._timeout(request.get("timeout")))
        raw = answer.response
        if not 200 <= answer.status < 300:
            text = raw.data.decode("utf-8", "replace")
            exc = ApiException(status=answer.status, reason=answer.reason, body=text)
            exc.headers = raw.headers  # Retry-After
            raise exc
        if not request.get("stream", False):
            _ = raw.data  # read now, so that the connection goes back to the pool
        return raw

    @property
    def api_client(self) -> client.ApiClient:
        """The official client's ``ApiClient`` in use (replaced after a 401 reload)."""
        return self._api

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._api.close()


def _with_fields(config: ApiConfig, retries: RetryPolicy,
                 named: Mapping[str, Any]) -> tuple[ApiConfig, RetryPolicy]:  # fmt: skip
    """``config`` and ``retries`` with the fields ``named`` gives replaced. Raises
    ``TypeError`` for a name that is neither's field."""
    unknown = sorted(set(named) - _CONFIG_NAMES - _RETRY_NAMES)
    if unknown:
        raise TypeError(f"ApiSession: unexpected keyword argument(s): {', '.join(unknown)}")
    config = replace(config, **{k: v for k, v in named.items() if k in _CONFIG_NAMES})
    retries = replace(retries, **{k: v for k, v in named.items() if k in _RETRY_NAMES})
    return config, retries
