"""Every Node's metadata, by one LIST and then (optionally) the client's WATCH: for viewers
such as ``omaticaya top``, which need only ``list`` and ``watch`` on ``nodes``."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from ..core.patch import NodeMeta
from .errors import KubeError, KubeForbidden, KubeUnavailable, wrap
from .session import ApiSession

__all__ = ["NodeEvent", "NodeLister", "WatchExpired"]

#: (type, node): ``ADDED``, ``MODIFIED`` or ``DELETED`` and the Node's metadata
NodeEvent = tuple[str, NodeMeta]

_RBAC = "omaticaya top needs list and watch on nodes"


class WatchExpired(KubeError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class _ContextSession(ApiSession):
    """``ApiSession`` whose kubeconfig is read with a chosen context (kubectl's ``--context``)."""

    def __init__(self, *, context: str | None = None, **kwargs: Any) -> None:
        self._context = context
        super().__init__(**kwargs)

    def _connect(self) -> client.ApiClient:
        if not self._context:
            return super()._connect()
        cfg = client.Configuration()
        try:
            config.load_kube_config(
                config_file=self._kubeconfig, context=self._context, client_configuration=cfg
            )
        except (config.ConfigException, OSError, ValueError) as exc:
            raise KubeError(f"no Kubernetes configuration: {exc}") from exc
        cfg.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0)
        return client.ApiClient(cfg)


def _meta(node: Any) -> NodeMeta:
    """A Node's metadata from the client's model or a JSON document (untrusted: any type)."""
    if isinstance(node, Mapping):
        meta: Any = node.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        get = meta.get
    else:
        meta = getattr(node, "metadata", None)

        def get(key: str) -> Any:
            return getattr(meta, key, None)

    labels, annotations = get("labels"), get("annotations")
    return NodeMeta(
        name=str(get("name") or ""),
        uid=str(get("uid") or ""),
        labels=dict(labels) if isinstance(labels, Mapping) else {},
        annotations=dict(annotations) if isinstance(annotations, Mapping) else {},
    )


def _error(exc: Exception, verb: str) -> KubeError:
    if isinstance(exc, ApiException) and exc.status == 410:
        return WatchExpired(f"{verb} nodes: 410 Gone: list again", status=410, verb=verb)
    err = wrap(exc, verb, "nodes")
    if isinstance(err, KubeForbidden) and err.status == 403:
        return KubeForbidden(f"{verb} nodes: HTTP 403 Forbidden ({_RBAC})", status=403, verb=verb)
    return err


class NodeLister:
    """``list`` and ``watch`` of Nodes through the official client (``CoreV1Api.list_node``
    and ``kubernetes.watch.Watch``), as ``NodeMeta``. Configuration as ``ApiSession``, plus
    ``context`` (a kubeconfig context). Failures raise ``KubeError`` (a 410 on a watch:
    ``WatchExpired``)."""

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._session = _ContextSession(
            context=context, kubeconfig=kubeconfig, environ=environ, timeout_s=timeout_s
        )
        self._timeout_s = timeout_s

    @property
    def server(self) -> str:
        return self._session.server

    def list(
        self, label_selector: str | None = None, page_size: int = 500
    ) -> tuple[list[NodeMeta], str]:
        """Every Node matching ``label_selector``, and the list's resourceVersion: a paginated
        LIST (``limit`` = ``page_size``, then ``continue``), each page decoded and reduced to
        ``NodeMeta`` before the next is read."""
        api = client.CoreV1Api(self._session.api_client)
        kwargs: dict[str, Any] = {"_request_timeout": self._timeout_s, "_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if page_size > 0:
            kwargs["limit"] = page_size
        out: list[NodeMeta] = []
        while True:
            body = self._page(api, kwargs)
            items = body.get("items")
            meta = body.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            if isinstance(items, list):
                out += [_meta(n) for n in items if isinstance(n, dict)]
            token = meta.get("continue")
            if not token or not isinstance(token, str):
                return out, str(meta.get("resourceVersion") or "")
            kwargs["_continue"] = token

    def _page(self, api: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._session.call("list", "nodes", lambda: api.list_node(**kwargs))
        except KubeError as exc:
            if exc.status == 403:
                raise KubeForbidden(
                    f"list nodes: HTTP 403 Forbidden ({_RBAC})", status=403, verb="list"
                ) from exc
            raise
        try:
            body = json.loads(response.data)
        except ValueError as exc:
            raise KubeUnavailable(f"list nodes: bad JSON: {exc}", verb="list") from exc
        if not isinstance(body, dict):
            raise KubeUnavailable("list nodes: the answer is not a JSON object", verb="list")
        return body

    def watch(
        self,
        resource_version: str,
        label_selector: str | None = None,
        timeout_s: int = 30,
    ) -> Iterator[tuple[str, NodeMeta, str]]:
        """(type, node, resourceVersion) for each change after ``resource_version``, until the
        server ends the watch after ``timeout_s`` seconds (then the iterator ends)."""
        api = client.CoreV1Api(self._session.api_client)
        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "timeout_seconds": int(timeout_s),
            "_request_timeout": (self._timeout_s, timeout_s + self._timeout_s),
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        w = watch.Watch()
        try:
            for event in w.stream(api.list_node, **kwargs):
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, _meta(event.get("object")), str(w.resource_version or "")
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _error(exc, "watch") from exc
        except (ValueError, TypeError, AttributeError) as exc:  # an answer of another shape
            raise KubeUnavailable(f"watch nodes: {type(exc).__name__}: {exc}", verb="watch") from exc
        finally:
            w.stop()

    def close(self) -> None:
        self._session.close()
