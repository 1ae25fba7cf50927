"""What other test files share of test_telemetry_rewrite.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.kube import NodeClient
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE, Clock
from tests.kube.lease_cluster_support import namespace  # noqa: F401  (fixture)

MIB = 1024 * 1024


def small_trace(tmp_path: Path, frees: list[tuple[float, tuple[int, ...]]], name: str) -> Path:
    """The H100 recording's first sample held still, with ``(t, free MiB per GPU)`` steps: the
    GPUs copied from GPU 0 (own index and UUID), only their memory moving."""
    doc = json.loads(H100_TRACE.read_text())
    n = len(frees[0][1])
    dev0 = doc["devices"][0]
    doc["devices"] = [
        {**copy.deepcopy(dev0), "index": i, "uuid": uuid_of(dev0["uuid"], i)} for i in range(n)
    ]
    doc["device_count"] = n
    first = doc["samples"][0]["gpus"][0]
    samples = []
    for t, free in frees:
        gpus = []
        for i, f in enumerate(free):
            g = copy.deepcopy(first)
            g["index"] = i
            total = g["memory_bytes"]["total"]
            g["memory_bytes"] = {"total": total, "used": total - f * MIB, "free": f * MIB}
            g.pop("memory_v2_bytes", None)
            gpus.append(g)
        samples.append({**copy.deepcopy(doc["samples"][0]), "t": t, "gpus": gpus})
    doc.update(samples=samples, phases=[])
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def uuid_of(uuid0: str, index: int) -> str:
    return f"{uuid0[:-12]}{index:012d}"


def lease_agent(
    kubeconfig, node: str, lease_ns: str, trace: Path, clock: Clock,
    attribution: Attribution | None = None, **env: Any,
) -> Agent:  # fmt: skip
    """An agent in Lease mode (its Lease in ``lease_ns``) replaying ``trace`` on ``clock``."""
    settings = load_settings(node_name=node, **env)
    reader = TraceReader(trace, loop=False, window_s=1.0, clock=clock)
    client = NodeClient(node, kubeconfig=str(kubeconfig), sleep=lambda s: None)
    environ = {"POD_NAMESPACE": lease_ns, "POD_NAME": f"agent-{node}"}
    return Agent(
        settings, reader, NodeApi(client, environ=environ), clock=clock, attribution=attribution
    )
