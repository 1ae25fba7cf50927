"""The burst bench's cluster and its judge: per-GPU free memory drawn from recorded traces,
Nodes as the agent writes them (``core.publish.render`` labels and the telemetry annotation), and the
exact packing check that says whether the pods bound to a node fit on its GPUs.

Pure apart from reading the trace files; nothing here talks to an API server.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

from bench.common import ROOT, bench_settings, load_raw, replicate, write_trace

__all__ = ["TRACES", "free_pool", "max_packed", "node_docs", "node_frees", "pending_with_room"]

MIB = 1024 * 1024
# the one-GPU H100 recording (idle, 30 GiB held, released: 48-79 GiB free) and the 8-GPU mixed
# load (3-79 GiB free per GPU)
TRACES = (
    ROOT / "tests" / "data" / "h100-trace.json",
    ROOT / "tests" / "data" / "multi-gpu-trace.json",
)


def free_pool(paths: Sequence[Path] = TRACES) -> list[int]:
    """Every per-GPU free memory (MiB, ``memory_bytes.free``) recorded in the traces' samples,
    in file order; readings that failed or lack the field are left out."""
    pool = []
    for path in paths:
        for sample in json.loads(Path(path).read_text(encoding="utf-8"))["samples"]:
            for g in sample.get("gpus") or []:
                free = (g.get("memory_bytes") or {}).get("free")
                if isinstance(free, int):
                    pool.append(free // MIB)
    return pool


def node_frees(nodes: int, gpus: int, pool: Sequence[int], seed: int = 24) -> list[list[int]]:
    """``nodes`` lists of ``gpus`` free MiB, each drawn from ``pool`` (seeded: every variant of
    one run, and every run, gets the same cluster)."""
    rng = random.Random(seed)
    return [[rng.choice(pool) for _ in range(gpus)] for _ in range(nodes)]


def node_docs(names: Sequence[str], frees: Sequence[Sequence[int]], group: str,
              refresh_s: float = 3600) -> list[dict[str, Any]]:  # fmt: skip
    """v1.Node bodies as the agent would write them: labels from ``core.publish.render`` and the
    telemetry annotation (read now, promising a rewrite within ``refresh_s``, so that nothing
    goes stale during a run) of an 8-H100 snapshot (the recorded trace's first sample) whose
    GPUs have ``frees`` MiB free; labelled ``bench=<group>``."""
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.publish.render_telemetry import telemetry_annotation
    from omaticaya_py.core.rules.health import assess
    from omaticaya_py.sources.replay import TraceReader

    width = max(len(f) for f in frees)
    base = TraceReader(write_trace(replicate(load_raw(), width), f"burst-{width}gpu")).read()
    settings = bench_settings(node_name="bench")
    docs = []
    for i, (name, node_free) in enumerate(zip(names, frees, strict=True)):
        gpus = []
        for g, free in zip(base.gpus, node_free, strict=False):
            total = g.memory_total_mib or 81559
            gpus.append(replace(g, memory_free_mib=free, memory_used_mib=total - free,
                                uuid=f"GPU-{i:08d}-0000-0000-0000-{g.index:012d}"))  # fmt: skip
        snap = replace(base, gpus=tuple(gpus), read_at=datetime.now(timezone.utc))
        health = assess(snap)
        labels = dict(render(snap, health, settings, with_telemetry=False).labels)
        labels.update({"kubernetes.io/hostname": name, "bench": group})
        annotations, _ = telemetry_annotation(snap, health, settings.prefix, refresh_s=refresh_s)
        annotations["node.alpha.kubernetes.io/ttl"] = "0"
        docs.append({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": name, "labels": labels, "annotations": annotations}})  # fmt: skip
    return docs


def max_packed(frees_mib: Sequence[int], needs_mib: Sequence[int]) -> int:
    """The most of these pods (one GPU each, ``needs_mib``) that fit together on GPUs with
    ``frees_mib`` free: exact (a search over assignments, GPUs with equal room merged)."""
    needs = tuple(sorted(needs_mib, reverse=True))
    if len(set(needs)) <= 1:  # one size (the bench's pods): each GPU holds free // need
        return min(len(needs), sum(f // needs[0] for f in frees_mib)) if needs else 0

    @cache
    def best(i: int, room: tuple[int, ...]) -> int:
        if i == len(needs):
            return 0
        top = best(i + 1, room)  # this pod left out
        for j, r in enumerate(room):
            if r >= needs[i] and (j == 0 or room[j - 1] != r):
                rest = tuple(sorted(room[:j] + (r - needs[i],) + room[j + 1 :]))
                top = max(top, 1 + best(i + 1, rest))
                if top == len(needs) - i:
                    break
        return top

    return best(0, tuple(sorted(frees_mib)))


def pending_with_room(frees: dict[str, Sequence[int]], bound: dict[str, list[int]],
                      pending: Sequence[int]) -> int:  # fmt: skip
    """How many of the ``pending`` pods (their need, MiB) some node could still hold beside the
    pods bound to it (``bound``: node -> needs), each counted pod taking its room (the first
    node that fits it). A node whose bound pods already do not fit holds none."""
    extra: dict[str, list[int]] = {n: [] for n in frees}
    count = 0
    for need in pending:
        for node, free in frees.items():
            pods = [*bound.get(node, []), *extra[node], need]
            if max_packed(free, pods) == len(pods):
                extra[node].append(need)
                count += 1
                break
    return count
