"""What other test files share of test_extender.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from typing import Any

from tests.helpers import READ_AT, evaluate, gpu, snapshot

NOW = READ_AT.timestamp() + 10  # telemetry 10 s old


def agent_node(name: str, *free_mib: int | None, unhealthy: tuple[int, ...] = (), age_s: float = 10):
    """A v1.Node document labelled exactly as the agent renders it (free_mib per GPU)."""
    from datetime import timedelta

    readings = []
    for i, free in enumerate(free_mib):
        kw: dict[str, Any] = {"ecc_uncorrected_volatile": 1} if i in unhealthy else {}
        readings.append(gpu(i, memory_free_mib=free, **kw))
    snap = snapshot(*readings, read_at=READ_AT - timedelta(seconds=age_s - 10))
    _, desired = evaluate(snap)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **desired.labels},
            "annotations": dict(desired.annotations),
        },
    }
