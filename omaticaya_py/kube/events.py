"""Posting one core/v1 Event (``post_event``): the Node's (``NodeClient``) and a pod's
(``PodClient``) Events are the same document about a different object."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .errors import KubeConflict
from .session import ApiSession

__all__ = ["EventNote", "post_event"]


@dataclass(frozen=True, slots=True)
class EventNote:
    """What an Event says: ``reason``, CamelCase (``GpuUnhealthy``); ``message``, cut at 1,024
    characters when posted; ``warning``, type Warning (else Normal)."""

    reason: str
    message: str
    warning: bool


def post_event(
    session: ApiSession,
    *,
    namespace: str,
    involved: dict[str, Any],
    note: EventNote,
    reporter: str,
    what: str,
) -> None:
    """POST a core/v1 Event about ``involved`` (its ``involvedObject``: apiVersion, kind, name,
    uid, and for a namespaced object its namespace) in ``namespace``, saying ``note`` (its
    reason, message and type: ``EventNote``).

    Reporting component ``omaticaya``, instance and source
    host ``reporter`` (the Node's name). The Event's name is ``<object>.omaticaya.<time in µs>``
    (at most 253 characters), unique to this call, so a 409 (AlreadyExists: an earlier attempt
    of it got through) counts as posted and is never retried. ``what`` names the call in errors
    (``event GpuUnhealthy on node gpu-1``). Raises ``KubeError`` otherwise (a 403 says the
    agent needs create on events in ``namespace``)."""
    now = datetime.now(timezone.utc)
    stamp = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{involved['name']}.omaticaya.{now.strftime('%Y%m%d%H%M%S%f')}"[-253:],
            "namespace": namespace,
        },
        "involvedObject": involved,
        "reason": note.reason,
        "message": note.message[:1024],
        "type": "Warning" if note.warning else "Normal",
        "source": {"component": "omaticaya", "host": reporter},
        "reportingComponent": "omaticaya",
        "reportingInstance": reporter,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        session.call(
            "create",
            what,
            lambda: session.http(
                "POST", "/api/v1/namespaces/{namespace}/events",
                path_params={"namespace": namespace}, body=body,
                content_type="application/json",
            ),  # fmt: skip
            rbac=f"the agent needs create on events in {namespace}",
        )
    except KubeConflict:
        pass
