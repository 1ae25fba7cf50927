"""What other test files share of test_chart_rbac.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

NODE = "rbac-node"


#: RBAC changes reach the authorizer through an informer: allow this long for the binding.
PROPAGATION_S = 20.0


def _exists_ok(fn: Callable[[], Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        fn()
    except ApiException as exc:
        if exc.status != 409:
            raise


def _apply(admin_client: Any, docs: list[dict[str, Any]]) -> None:
    """Create each rendered manifest; one that exists already (409) is fine."""
    from kubernetes import utils

    for doc in docs:
        try:
            utils.create_from_dict(admin_client, doc)
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise


def _status(fn: Callable[[], Any]) -> int:
    from kubernetes.client.exceptions import ApiException

    try:
        fn()
    except ApiException as exc:
        if exc.status not in (403, 404):
            print(f"HTTP {exc.status}: {exc.body}")
        return exc.status
    return 200


def _event_name() -> str:
    return f"{NODE}.omaticaya.{datetime.now(timezone.utc):%Y%m%d%H%M%S%f}"


def _core_event(namespace: str) -> dict:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": _event_name(), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE},
        "reason": "GpuUnhealthy",
        "message": "RBAC test",
        "type": "Warning",
        "source": {"component": "omaticaya", "host": NODE},
        "reportingComponent": "omaticaya",
        "reportingInstance": NODE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
