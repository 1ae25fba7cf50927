"""The dev cluster's audit log read back: what the real kube-apiserver saw, to cross-check what a
client says it did (request counts, who sent a request, from which IP, with what answer).

``scripts/dev-cluster`` runs the API server with a ``Metadata``-level policy that omits the
``RequestReceived`` stage, in blocking mode; ``DevCluster.audit_lines()`` (tests/devcluster.py)
gives the log's lines, one JSON event each.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["audit_count", "audit_events"]


def audit_events(
    cluster: Any,
    *,
    since: int = 0,
    stage: str | None = "ResponseComplete",
    verb: str | None = None,
    resource: str | None = None,
    name: str | None = None,
    user: str | None = None,
) -> list[dict[str, Any]]:
    """The audit events from line ``since`` of ``cluster.audit_lines()`` on, oldest first, that
    match every filter given (``None``: any): the event's ``stage``, ``verb``, ``objectRef``'s
    ``resource`` and ``name``, and ``user.username``. A line that is not JSON (one the API server
    is still writing) is skipped. Take ``since`` as ``len(cluster.audit_lines())`` before an
    action to see only what came after it."""
    out = []
    for line in cluster.audit_lines()[since:]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        ref = event.get("objectRef") or {}
        if (
            (stage is None or event.get("stage") == stage)
            and (verb is None or event.get("verb") == verb)
            and (resource is None or ref.get("resource") == resource)
            and (name is None or ref.get("name") == name)
            and (user is None or (event.get("user") or {}).get("username") == user)
        ):
            out.append(event)
    return out


def audit_count(cluster: Any, *, verb: str, name: str, resource: str = "nodes") -> int:
    """How many ``verb`` requests on ``resource`` ``name`` completed (``ResponseComplete``)."""
    return len(audit_events(cluster, verb=verb, resource=resource, name=name))
