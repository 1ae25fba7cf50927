"""A pod's need (``scheduler.need``) pinned where a mutation run found no test
(``scripts/mutation``): each pod's whole ``Need`` (the error's text, its memory and count
beside it, not only whether it is one), the MIG profiles a pod asks for, the edges of the
annotations' ranges, the resources a reader is made with. Table-driven; each row names what
it pins.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from omaticaya_py.scheduler.need import (
    MAX_GPU_COUNT,
    MAX_MEMORY_MIB,
    Need,
    mig_resource_prefix,
    need_reader,
    parse_need,
    pod_need,
)

MEM, COUNT = "omaticaya.io/gpu-memory-mib", "omaticaya.io/gpu-count"
GPU, MIG, R = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "omaticaya.io/gpu-memory"


def c(name: str = "c", limits: dict[str, Any] | None = None,
      requests: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A container asking for ``limits`` and ``requests``."""
    res = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    return {"name": name, "resources": res, **extra}


def pod(app: list[Any] = (), init: list[Any] = (), **annotations: Any) -> dict[str, Any]:  # type: ignore[assignment]
    """A pod of ``app`` and ``init`` containers; ``annotations`` by short name (``mem``,
    ``count``) or in full."""
    names = {"mem": MEM, "count": COUNT}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                         "annotations": {names.get(k, k): v for k, v in annotations.items()}},
            "spec": {"initContainers": list(init), "containers": list(app)}}  # fmt: skip


def bad(what: str, value: str, expected: str, kind: str = "container", name: str = "c") -> str:
    return f"pod {kind} {name!r} asks for {what}={value!r}: expected a whole number of {expected}"


def not_memory(value: str) -> str:
    return (f"pod annotation {MEM}={value!r} is not a memory size: expected MiB as a whole "
            "number (30720) or a quantity (30Gi, 1.5Gi)")  # fmt: skip


def bad_count(value: str) -> str:
    return f"pod annotation {COUNT}={value!r} is not a whole number from 1 to {MAX_GPU_COUNT}"


NEEDS = [
    # devices alone (no memory annotation)
    ("devices alone: a plain init container's GPUs count", pod([c(limits={GPU: 1})],
     [c("i", limits={GPU: 2})]), Need(0, 2, exclusive=True)),
    ("devices alone: a malformed GPU count", pod([c(limits={GPU: "1.5"})]),
     Need(0, 1, bad(GPU, "1.5", "GPUs"))),
    ("devices alone: a malformed MIG count", pod([c(limits={MIG: "1.5"})]),
     Need(0, 1, bad(MIG, "1.5", "MIG devices"))),
    ("devices alone: MIG asked by an init container only", pod([c()], [c("i", limits={MIG: 1})]),
     Need(0, 1, exclusive=True, profile="1g.10gb")),
    ("devices alone: MIG asked by requests only", pod([c(requests={MIG: 2})]),
     Need(0, 2, exclusive=True, profile="1g.10gb")),
    ("devices alone: other resources beside MIG are no profile",
     pod([c(limits={MIG: 1, "cpu": "1", "ephemeral-storage": "1Gi"})]),
     Need(0, 1, exclusive=True, profile="1g.10gb")),
    ("devices alone: the MIG prefix alone names no profile", pod([c(limits={"nvidia.com/mig-": 1})]),
     None),
    ("devices alone: the MIG prefix alone beside a profile",
     pod([c(limits={"nvidia.com/mig-": 1, MIG: 1})]), Need(0, 1, exclusive=True, profile="1g.10gb")),
    # the memory annotation
    ("memory: 64 characters (spaces around) are read", pod([c()], mem=" " * 59 + "30720"),
     Need(30720)),
    ("memory: 65 characters are not", pod([c()], mem=" " * 60 + "30720"),
     Need(0, 1, not_memory(" " * 40 + "..."))),
    ("memory: not a size, the whole need", pod([c()], mem="lots"), Need(0, 1, not_memory("lots"))),
    ("memory: 1 EiB exactly", pod([c()], mem=str(MAX_MEMORY_MIB)), Need(MAX_MEMORY_MIB)),
    ("memory: over 1 EiB", pod([c()], mem=str(MAX_MEMORY_MIB + 1)),
     Need(0, 1, f"pod annotation {MEM}='{MAX_MEMORY_MIB + 1}' asks for more than 1 EiB")),
    ("memory, a malformed GPU count", pod([c(limits={GPU: "x"})], mem="1000"),
     Need(1000, 1, bad(GPU, "x", "GPUs"))),
    # the count annotation
    ("count: the most GPUs a pod may ask for", pod([c()], mem="1000", count=str(MAX_GPU_COUNT)),
     Need(1000, MAX_GPU_COUNT)),
    ("count: one more", pod([c()], mem="1000", count=str(MAX_GPU_COUNT + 1)),
     Need(1000, 1, bad_count(str(MAX_GPU_COUNT + 1)))),
    ("count: differs from the GPUs asked for", pod([c(limits={GPU: 2})], mem="1000", count="3"),
     Need(1000, 3, f"pod annotation {COUNT}='3' differs from the 2 {GPU} its containers ask for: "
                   "the kubelet hands it 2 GPUs")),
    # MIG with the memory annotation
    ("MIG: a plain init container's devices count", pod([c(limits={MIG: 1})],
     [c("i", limits={MIG: 2})], mem="5000"), Need(5000, 2, exclusive=True, profile="1g.10gb")),
    ("MIG: the count differs, the MIG resource named",
     pod([c(limits={MIG: 1})], mem="5000", count="3"),
     Need(5000, 3, f"pod annotation {COUNT}='3' differs from the 1 {MIG} its containers ask for: "
                   "the kubelet hands it 1 GPUs")),
    ("MIG: a malformed count", pod([c(limits={MIG: "1.5"})], mem="5000"),
     Need(5000, 1, bad(MIG, "1.5", "MIG devices"))),
    ("MIG: two profiles are not judged here", pod([c(limits={MIG: 1, "nvidia.com/mig-2g.20gb": 1})],
     mem="5000"), None),
    ("MIG: a profile asked 0 times is no profile", pod([c(limits={MIG: 0})], mem="5000"),
     Need(5000)),
    ("devices alone: asked by an init container only", pod([c()], [c("i", limits={GPU: 2})]),
     Need(0, 2, exclusive=True)),
    # slices
    ("slices: a malformed count of units", pod([c(limits={R: "1.5"})]),
     Need(0, 1, f"pod container 'c' asks for {R}='1.5': expected a whole number of units from 0 "
                "to 1048576")),
    ("slices: a plain init container reused: placed by its own units",
     pod([c("a", limits={R: 15}), c("b", limits={R: 10})], [c("i", limits={R: 20})]),
     Need(0, 1, slices=(25,), firsts=(20,))),
    # slices beside whole GPUs
    ("slices, a malformed GPU count", pod([c(limits={R: 5, GPU: "1.5"})]),
     Need(0, 0, bad(GPU, "1.5", "GPUs"))),
    ("slices and GPUs, no memory asked", pod([c(limits={R: 5, GPU: 1})]),
     Need(0, 1, slices=(5,), exclusive=True)),
    ("slices and GPUs with memory", pod([c(limits={R: 5, GPU: 2})], mem="1000"),
     Need(1000, 2, slices=(5,), exclusive=True)),
    ("slices and GPUs of an init container", pod([c(limits={R: 5})], [c("i", limits={GPU: 2})]),
     Need(0, 2, slices=(5,), exclusive=True)),
    ("slices and GPUs, the memory annotation malformed", pod([c(limits={R: 5, GPU: 1})], mem="x"),
     Need(0, 1, not_memory("x"))),
]  # fmt: skip


@pytest.mark.parametrize(("case", "doc", "need"), NEEDS, ids=[n[0] for n in NEEDS])
def test_each_pod_gets_its_whole_need(case, doc, need):
    assert pod_need(doc) == need, case


def test_the_gpu_resource_reaches_the_annotation_rule():
    doc = pod([c(limits={"example.com/gpu": 2})], mem="1000")
    assert pod_need(doc, gpu_resource="example.com/gpu") == Need(1000, 2, exclusive=True)
    assert parse_need(doc) == Need(1000)


def test_a_resource_without_a_domain_has_mig_resources_without_one():
    assert mig_resource_prefix("nvidia.com/gpu") == "nvidia.com/mig-"
    assert mig_resource_prefix("gpu") == "mig-"


def test_a_reader_reads_with_the_settings_prefix_and_resources():
    read = need_reader(SimpleNamespace(prefix="example.com", shared_resource="example.com/mem",
                                       device_plugin_resource="example.com/gpu"))  # fmt: skip
    whole = pod([c(limits={"example.com/gpu": 2})], **{"example.com/gpu-memory-mib": "1000"})
    assert read(whole) == Need(1000, 2, exclusive=True)
    sliced = pod([c(limits={"example.com/mem": 5})])
    assert read(sliced) == Need(0, 1, slices=(5,), resource="example.com/mem")
    assert read(pod([c(limits={GPU: 1, R: 5})], mem="1000")) is None
