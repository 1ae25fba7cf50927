"""The requests of a list+watch: one LIST of a collection, one streaming WATCH, its events, ending its read."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes.watch.watch import iter_resp_lines as _watch_lines

from .errors import KubeUnavailable
from .session import ApiSession

__all__ = [
    "end_read", "list_page", "list_pages", "open_watch", "release", "watch_events",
]


def list_page(
    session: ApiSession, path: str, query: Mapping[str, str], what: str, rbac: str = ""
) -> tuple[list[Any], str, str]:
    """One page of a paginated LIST (``query`` carries ``limit`` and, after the first page,
    ``continue``): ``(items, resourceVersion, continue token)``, the token ``""`` on the last
    page. ``what`` names the collection in errors, ``rbac`` what a 403 lacked. Raises
    ``KubeError`` types (``KubeUnavailable`` for a body that is not JSON; an expired token:
    status 410)."""
    response = session.call(
        "list", what, lambda: session.http("GET", path, query=dict(query)), rbac=rbac
    )
    try:
        body = json.loads(response.data)
    except ValueError as exc:
        raise KubeUnavailable(f"list {what}: bad JSON: {exc}", verb="list") from exc
    meta = body.get("metadata") or {}
    token = meta.get("continue") or ""
    return list(body.get("items") or []), meta.get("resourceVersion", ""), str(token)


def list_pages(
    session: ApiSession,
    path: str,
    query: Mapping[str, str],
    what: str,
    page_size: int,
    rbac: str = "",
) -> Iterator[tuple[list[Any], str]]:
    """A paginated LIST (``limit`` = ``page_size``, then ``continue``; ``page_size`` 0: one
    request): ``(items, resourceVersion)`` per page, each page read only when the previous one
    was consumed. Raises as ``list_page``."""
    query = dict(query)
    if page_size > 0:
        query["limit"] = str(page_size)
    while True:
        items, version, token = list_page(session, path, query, what, rbac)
        yield items, version
        if not token:
            return
        query["continue"] = token


def open_watch(
    session: ApiSession,
    path: str,
    query: Mapping[str, str],
    resource_version: str,
    *,
    timeout_s: float,
    watch_timeout_s: int,
) -> Any:
    """A WATCH of ``path`` from ``resource_version`` (bookmarks on), which the server ends
    after ``watch_timeout_s`` seconds; the client's read timeout ends a dead one ``timeout_s``
    later. Returns the streaming urllib3 response; raises what ``ApiSession.http`` raises
    (``ApiException`` for a non-2xx answer, urllib3/OS errors for no answer)."""
    return session.http(
        "GET",
        path,
        query={
            **query,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(int(watch_timeout_s)),
        },
        timeout=(timeout_s, watch_timeout_s + timeout_s),
        stream=True,
    )


def watch_events(
    response: Any, stopped: Callable[[], bool] = lambda: False
) -> Iterator[tuple[Any, Any]]:
    """``(type, object)`` of each event line of a WATCH response (blank lines skipped;
    ``object`` is ``{}`` when absent), until the server ends it or ``stopped()`` is true when a
    line arrives. Raises ``ValueError`` on a line that is not JSON, and what reading the
    response raises."""
    for line in _watch_lines(response):
        if stopped():
            return
        if not line.strip():
            continue
        event = json.loads(line)
        yield event.get("type"), event.get("object") or {}


def end_read(response: Any) -> None:
    """End the read in progress on ``response`` (``None``: no WATCH open) in another thread,
    now: ``shutdown()`` of its socket, not ``close()`` (closing the reader blocks on the lock
    of that read: on a quiet watch, up to the watch timeout); a response without ``shutdown``
    is closed in a thread of its own. Never raises."""
    if response is None:
        return
    try:
        if hasattr(response, "shutdown"):
            response.shutdown()
        else:
            threading.Thread(target=response.close, daemon=True).start()
    except Exception:  # noqa: BLE001 - a half-dead socket
        pass


def release(response: Any) -> None:
    """Give the connection of a finished WATCH (``None``: none) back to the pool; never raises."""
    if response is None:
        return
    try:
        response.release_conn()
    except Exception:  # noqa: BLE001
        pass
