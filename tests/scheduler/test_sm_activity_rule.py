"""Issue 40 on the extender's side: SM activity (``sm_active_pct``) and utilisation in a Node's
telemetry, and the memory need of docs/scheduling.md's "What a memory need means".

The extender has no idle, busy or utilisation rule: its filter judges memory, health and
liveness, and ``binpack``/``spread`` rank by free memory (``scheduler.fit``). So a GPU with a
resident but idle kernel (utilisation 100, SM activity 1) is judged exactly as an idle one with
the same free memory, and whatever an untrusted Node writes in either field (absent, low, high,
negative, over 100, text, not a number) changes no verdict and no score and never raises. These
tables pin that: a rule that starts reading activity must come with its own table here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omaticaya_py.scheduler import ExtenderSettings, parse_node
from omaticaya_py.scheduler.protocol import handle_filter, handle_prioritize

P = "omaticaya.io/"
READ_AT = "2026-01-01T00:00:00Z"
NOW = 1767225600.0 + 10  # READ_AT + 10 s
HEALTHY = {P + "gpu.health": "Healthy"}


def tele(*gpus: dict[str, Any]) -> str:
    return json.dumps({"read_at": READ_AT, "health": "Healthy", "gpus": list(gpus)})


def gpu(free: int, **kw: Any) -> dict[str, Any]:
    return {"index": 0, "memory_free_mib": free, "health": "Healthy", **kw}


def judged(
    nodes: dict[str, str], mib: int, strategy: str = "binpack"
) -> tuple[Any, dict[str, int]]:
    settings = ExtenderSettings(_env_file=None, placement_policy=strategy)  # type: ignore[call-arg]
    states = {
        name: parse_node(name, HEALTHY, {P + "telemetry": raw}) for name, raw in nodes.items()
    }
    args = {"Pod": {"metadata": {"annotations": {P + "gpu-memory-mib": str(mib)}}},
            "NodeNames": list(nodes)}  # fmt: skip
    result = handle_filter(args, settings, states.get, now=NOW)
    scores = {s["Host"]: s["Score"] for s in handle_prioritize(args, settings, states.get, now=NOW)}
    return result, scores


# (id, the GPU's activity fields): none of them changes the extender's answer
ACTIVITY = [
    ("absent (GPM unsupported)", {}),
    ("utilisation only, busy", {"utilization_pct": 100.0}),
    ("resident idle kernel: utilisation 100, SM activity 1", {"utilization_pct": 100.0, "sm_active_pct": 1.0}),
    ("busy: both high", {"utilization_pct": 99.0, "sm_active_pct": 94.9}),
    ("idle: both 0", {"utilization_pct": 0.0, "sm_active_pct": 0.0}),
    ("SM activity negative", {"utilization_pct": 100.0, "sm_active_pct": -5}),
    ("SM activity over 100", {"utilization_pct": 100.0, "sm_active_pct": 250}),
    ("SM activity text", {"utilization_pct": 100.0, "sm_active_pct": "idle"}),
    ("SM activity a list", {"sm_active_pct": [1]}),
    ("SM activity 1e400", {"sm_active_pct": 1e400}),
    ("SM activity NaN", {"sm_active_pct": float("nan")}),
    ("utilisation text", {"utilization_pct": "busy", "sm_active_pct": 3.0}),
    ("utilisation negative", {"utilization_pct": -1, "sm_active_pct": 3.0}),
]  # fmt: skip


@pytest.mark.parametrize("strategy", ["binpack", "spread"])
@pytest.mark.parametrize("fields", [c[1] for c in ACTIVITY], ids=[c[0] for c in ACTIVITY])
def test_activity_changes_no_verdict_and_no_score(fields, strategy):
    plain = {"a": tele(gpu(40960)), "b": tele(gpu(20480)), "c": tele(gpu(10240))}
    with_activity = {**plain, "a": tele(gpu(40960, **fields)), "c": tele(gpu(10240, **fields))}
    for mib in (1024, 15000, 30000, 50000):
        assert judged(with_activity, mib, strategy) == judged(plain, mib, strategy), mib


def test_a_resident_idle_kernel_ranks_as_an_idle_gpu():
    """Equal free memory: the busy-looking GPU (utilisation 100, SM activity 1) and the idle
    one tie under both strategies; memory alone decides."""
    nodes = {"kernel": tele(gpu(30000, utilization_pct=100.0, sm_active_pct=1.0)),
             "idle": tele(gpu(30000, utilization_pct=0.0, sm_active_pct=0.0))}  # fmt: skip
    for strategy in ("binpack", "spread"):
        _, scores = judged(nodes, 20000, strategy)
        assert scores == {"kernel": 10, "idle": 10}, scores


# ------------------------------------------------- item 5: the need against NVML's free ----

# (id, the GPU's NVML free MiB, the pod's need MiB, fits): docs/scheduling.md's worked
# example: peak 18,000 + context 529 + workspaces 300 = 18,829 MiB, asked as 19Gi
NEED_CASES = [
    ("need counts the context: 18,829 on 18,500 free fails", 18500, 18829, False),
    ("the same on 18,829 free fits (need <= free)", 18829, 18829, True),
    ("19Gi asked, 19,456 free fits", 19456, 19456, True),
    ("19Gi asked, 19,455 free fails", 19455, 19456, False),
    ("the H100's fresh-process free 81,079 holds 80,503 + 529", 81079, 80503 + 529, True),
]  # fmt: skip


@pytest.mark.parametrize(("free", "need", "fits"), [c[1:] for c in NEED_CASES],
                         ids=[c[0] for c in NEED_CASES])  # fmt: skip
def test_the_need_is_compared_with_nvml_free(free, need, fits):
    result, _ = judged({"n": tele(gpu(free))}, need)
    assert ("n" in result["NodeNames"]) is fits, result
