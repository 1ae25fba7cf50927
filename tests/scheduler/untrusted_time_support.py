"""What other test files share of test_untrusted_time.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def put_lease(
    admin_api: Any,
    namespace: str,
    name: str,
    renew: datetime,
    *,
    holder: str = "agent-pod",
    duration_s: int = 40,
) -> None:
    """Create or update Lease ``namespace/name`` as an agent would (``renewTime`` = ``renew``),
    through the typed client as cluster admin; the namespace is created when missing."""
    from kubernetes import client

    api = client.CoordinationV1Api(admin_api.api_client)
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1LeaseSpec(holder_identity=holder or None, renew_time=renew,
                                lease_duration_seconds=duration_s),
    )  # fmt: skip
    try:
        admin_api.create_namespace({"metadata": {"name": namespace}})
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    try:
        current = api.read_namespaced_lease(name, namespace)
    except client.exceptions.ApiException as exc:
        if exc.status != 404:
            raise
        api.create_namespaced_lease(namespace, body)
        return
    body.metadata.resource_version = current.metadata.resource_version
    api.replace_namespaced_lease(name, namespace, body)
