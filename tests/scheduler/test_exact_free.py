"""Never above the truth: the free memory the extender decides on is the least of the
telemetry's exact value and what the labels say (``core.schema.nodestate.parse_node``).

Pure tables over the agent's own render (``tests.helpers.evaluate``), hand-edited labels for
the untrusted cases, and the issue's case through the extender's filter: NVML free 10,900 ->
10,300 MiB leaves the labels at 10,240 (1,024 MiB steps) and, in Lease mode, the telemetry at
10,900; a pod asking 10,500 must be refused. The same on the real kube-apiserver, with an
agent replaying a small trace, is in ``tests/core/publish/test_telemetry_rewrite.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omaticaya_py.core.schema.nodestate import label_bounds, parse_node
from tests.helpers import evaluate, gpu, snapshot
from tests.scheduler.exact_free_support import (  # the names moved out, for this file's tests
    NOW,  # noqa: F401
    P,  # noqa: F401
    extender_verdict,  # noqa: F401
)


def node_of(*free_mib: int, mig: tuple[int, ...] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """``(labels, annotations)`` as the agent renders them for GPUs with ``free_mib`` free."""
    gpus = [gpu(i, memory_free_mib=f) for i, f in enumerate(free_mib)]
    _, desired = evaluate(snapshot(*gpus))
    annotations = dict(desired.annotations)
    if mig:  # mark GPUs as MIG on in the telemetry (given out as MIG devices, never whole)
        doc = json.loads(annotations[P + "telemetry"])
        for g in doc["gpus"]:
            if g["index"] in mig:
                g["mig_enabled"] = True
        annotations[P + "telemetry"] = json.dumps(doc)
    return dict(desired.labels), annotations


def with_labels(labels: dict[str, str], **changes: str | None) -> dict[str, str]:
    """``labels`` with ``gpu_0_memory_free_mib="..."``-style changes (``_`` -> ``.``/``-``;
    ``None`` removes the key)."""
    out = dict(labels)
    for name, value in changes.items():
        key = P + {
            "gpu0": "gpu-0.memory.free-mib",
            "gpu1": "gpu-1.memory.free-mib",
            "best": "gpu.memory.free-mib",
            "total": "gpu.memory.free-total-mib",
        }[name]
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def case(
    free: tuple[int, ...], labels_from: tuple[int, ...] | None = None, **changes: Any
) -> tuple[dict[str, str], dict[str, str]]:
    """The telemetry of a reading with ``free`` per GPU, under the labels of the reading
    ``labels_from`` (default: the same one), edited by ``changes``."""
    _, annotations = node_of(*free)
    labels, _ = node_of(*(labels_from or free))
    return with_labels(labels, **changes), annotations


BOUND_CASES = [
    # (id, (labels, annotations), per-GPU free, free total)
    ("the same reading: the labels, rounded down to 1 GiB, are lower", case((10900, 50000)),
     [10240, 49152], 59392),
    ("the issue's case: labels of 10,300 under telemetry of 10,900", case((10900,), (10300,)),
     [10240], 10240),
    ("telemetry already lower than the labels: the telemetry", case((10000,), (10900,)),
     [10000], 10000),
    ("no labels at all: the telemetry as it is", ({}, node_of(10900, 50000)[1]),
     [10900, 50000], 60900),
    ("per-GPU labels off: the node's best bounds every GPU",
     case((10900, 50000), gpu0=None, gpu1=None, best="20480"), [10900, 20480], 31380),
    ("a per-GPU label that is not a whole number bounds nothing",
     case((10900, 50000), gpu0="lots", best="90000", total="999999"), [10900, 49152], 60052),
    ("a negative label: nothing fits (never below 0)", case((10900,), gpu0="-5"), [0], 0),
    ("the free total label bounds the sum", case((10900, 50000), total="30720"),
     [10240, 49152], 30720),
]  # fmt: skip


@pytest.mark.parametrize(("node", "per_gpu", "total"), [c[1:] for c in BOUND_CASES],
                         ids=[c[0] for c in BOUND_CASES])  # fmt: skip
def test_free_is_the_least_of_telemetry_and_labels(node, per_gpu, total):
    labels, annotations = node
    state = parse_node("n", labels, annotations)
    assert [g.free_mib for g in state.gpus] == per_gpu
    assert state.free_total_mib == total
    assert state.problem is None


def test_a_mig_gpu_is_still_not_a_whole_gpu():
    labels, annotations = node_of(10900, 50000, mig=(1,))
    assert [(g.index, g.free_mib) for g in parse_node("n", labels, annotations).gpus] == [(0, 10240)]


def test_labels_only_nodes_are_unchanged():
    labels = with_labels({P + "gpu.health": "Healthy", P + "gpu.healthy-count": "2"},
                         best="8192", total="12288")  # fmt: skip
    assert [g.free_mib for g in parse_node("n", labels, {}).gpus] == [8192, 4096]


LABEL_BOUNDS = [
    ({}, ({}, None, None)),
    ({"gpu-0.memory.free-mib": "1024", "gpu-3.memory.free-mib": "0", "gpu.memory.free-mib": "1024",
      "gpu.memory.free-total-mib": "1024"}, ({0: 1024, 3: 0}, 1024, 1024)),
    ({"gpu-0.memory.free-mib": "1e3", "gpu-1.health": "Healthy", "gpu.memory.free-mib": ""},
     ({}, None, None)),
]  # fmt: skip


@pytest.mark.parametrize(("mine", "expected"), LABEL_BOUNDS)
def test_label_bounds(mine, expected):
    assert label_bounds(mine) == expected




def test_the_issues_case_is_refused_by_the_extender():
    labels, annotations = case((10900,), (10300,))
    # before: the telemetry's 10,900 decided, and the pod passed
    assert json.loads(annotations[P + "telemetry"])["gpus"][0]["memory_free_mib"] == 10900
    verdict = extender_verdict(labels, annotations, 10500)
    assert verdict is not None and "10500 MiB" in verdict
    assert extender_verdict(labels, annotations, 10240) is None  # what the labels promise fits
