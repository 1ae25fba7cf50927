"""What other test files share of test_product_install.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from typing import Any

from tests.charts.helm_install_support import (  # noqa: F401 - cluster and tools are fixtures
    CHART,
    NAMESPACE,
    PREFIX,
    RELEASE,
    Kube,
    cluster,
    tools,
    values_file,
    wait_for,
)

STACK = CHART.parent.parent / "examples" / "install" / "whole-stack.yaml"


SCHEDULER = "omaticaya-scheduler"


DEV_TAINT = {"key": "omaticaya.io/dev-kubelet", "operator": "Exists", "effect": "NoSchedule"}


def uuid(index: int) -> str:
    """The trace's GPU UUIDs (tests/data/multi-gpu-trace.json)."""
    return f"GPU-{index:08d}-7fda-b7ae-a94e-630097a14ca4"


def running(p: dict[str, Any]) -> bool:
    return any(c.get("state", {}).get("running") for c in p["status"].get("containerStatuses") or [])


def unschedulable(p: dict[str, Any]) -> str | None:
    """The scheduler's message on a Pending pod it could not place, else ``None``."""
    for c in p["status"].get("conditions") or []:
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def extender_reason(message: str | None) -> bool:
    """The extender's reasons for a node without room: none, or taken by pods it placed that
    the telemetry does not show yet (kube-scheduler retries the pod, and the reason follows)."""
    return message is not None and ("had no room" in message or "room taken by in-flight" in message)
