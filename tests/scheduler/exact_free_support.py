"""What other test files share of test_exact_free.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from omaticaya_py.scheduler import ExtenderSettings
from omaticaya_py.scheduler.protocol import handle_filter
from tests.helpers import READ_AT

P = "omaticaya.io/"


NOW = READ_AT.timestamp() + 10


def extender_verdict(
    labels: dict[str, str], annotations: dict[str, str], need_mib: int, count: int = 1,
    now: float | None = NOW,
) -> str | None:
    """The extender's filter on one Node (``None``: it passes, else the reason it fails) for a
    pod asking ``count`` GPUs with ``need_mib`` free each (``now``: epoch seconds, ``None``:
    the wall clock)."""
    node = {"metadata": {"name": "n", "labels": labels, "annotations": annotations}}
    asks = {P + "gpu-memory-mib": str(need_mib), P + "gpu-count": str(count)}
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u-1", "annotations": asks}}
    args = {"Pod": pod, "Nodes": {"metadata": {}, "items": [node]}, "NodeNames": None}
    result = handle_filter(args, ExtenderSettings(_env_file=None), now=now)  # type: ignore[call-arg]
    if [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["n"]:
        return None
    return result["FailedNodes"]["n"]
