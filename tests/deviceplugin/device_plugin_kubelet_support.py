"""What other test files share of test_device_plugin_kubelet.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from typing import Any


def admission_error(admin_api, name: str) -> str | None:
    pod = admin_api.read_namespaced_pod(name, "default")
    if pod.status.phase == "Running":
        raise AssertionError(f"pod {name} was admitted")
    return pod.status.reason if pod.status.phase == "Failed" else None


def container_id(admin_api, name: str) -> tuple[str, int]:
    (cs,) = admin_api.read_namespaced_pod(name, "default").status.container_statuses
    return cs.container_id, cs.restart_count


def _device_ids(value: Any) -> list[str]:
    """``DeviceIDs`` of a checkpoint entry: a list (v1.19-) or {numa node: [ids]} (v1.20+)."""
    if value is None:  # an entry the kubelet keeps without devices
        return []
    if isinstance(value, dict):
        return [d for ids in value.values() for d in ids]
    return list(value)
