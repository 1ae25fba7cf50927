"""Multi-GPU pods on the three topology traces (issue 50 item 4): the extender's prediction
(the reservation in its ledger right after ``Extender.filter``) is the device plugin's choice
(``allocation.preferred`` over the kubelet's available list, with the reading's topology), and
a pod the extender passes is admitted with its memory free on every GPU it gets.

The node is one of the topology traces' (tests/data/*-topo-trace.json, replayed: its GPUs and
its ``NodeTopology``); each GPU's live free memory is drawn (idle, a few MiB less, within
a GiB, half used, nearly full) and the pods ask for 1, 2, 4 or 8 whole GPUs, with a
memory annotation or with ``nvidia.com/gpu`` alone. After each pod a reading follows or not, so
several pods may be judged in one window on a reading that shows none of them. The agent
publishes the topology in the telemetry (``links``); the extender's node state reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from omaticaya_py.core.allocation.placement import MEMORY_GRAIN_MIB
from omaticaya_py.core.model.topology import NodeTopology
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.schema import parse_node
from omaticaya_py.deviceplugin.allocation import DeviceState, preferred
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.ledger import Ledger, placement_from_pod
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import READ_AT, evaluate, settings, snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = ["hgx-h100-topo-trace.json", "pcie-nvlink-bridge-topo-trace.json",
          "workstation-4gpu-topo-trace.json"]  # fmt: skip
GPU = "nvidia.com/gpu"


def _pod(name: str, count: int, mib: int | None) -> dict[str, Any]:
    ann = ({} if mib is None else
           {"omaticaya.io/gpu-memory-mib": str(mib), "omaticaya.io/gpu-count": str(count)})  # fmt: skip
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": ann},
            "spec": {"schedulerName": "omaticaya-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {GPU: str(count)}}}]}}  # fmt: skip


@dataclass
class TopoNode:
    """One node of a topology trace with drawn free memory per GPU."""

    trace: str
    used_mib: list[int]
    listed: list[ContainerDevices] = field(default_factory=list)

    def __post_init__(self) -> None:
        first = TraceReader(DATA / self.trace, at_s=0).read()
        assert first.topology is not None, f"{self.trace} replays without topology"
        self.topology: NodeTopology = first.topology
        self.base = first.gpus
        s = ExtenderSettings(_env_file=None)
        self.ledger = Ledger(s.settle_s, s.assume_s)
        self.read_s = READ_AT.timestamp() - 2
        self.ext = Extender(s, lambda name: self.state if name == "n" else None,
                            clock=lambda: self.read_s + 5, monotonic=lambda: 0.0,
                            ledger=self.ledger)  # fmt: skip
        self.publish()

    def readings(self) -> list[Any]:
        out = []
        for g, used in zip(self.base, self.used_mib, strict=True):
            total = g.memory_total_mib
            free = max(0, total - used)
            out.append(replace(g, memory_free_mib=free, memory_used_mib=total - free,
                               xid_events=()) if hasattr(g, "xid_events") else
                       replace(g, memory_free_mib=free, memory_used_mib=total - free))  # fmt: skip
        return out

    def publish(self) -> None:
        self.read_s += 2
        gpus = self.readings()
        snap = replace(snapshot(*gpus, read_at=datetime.fromtimestamp(self.read_s, timezone.utc)),
                       topology=self.topology)  # fmt: skip
        by_gpu: dict[str, list[ContainerDevices]] = {}
        for h in self.listed:
            for d in h.device_ids:
                by_gpu.setdefault(d, []).append(h)
        att = {g.uuid: GpuAttribution(g.uuid, holders=tuple(by_gpu.get(g.uuid, ()))) for g in gpus}
        agent = settings()
        health, _ = evaluate(snap, agent)
        desired = render(snap, health, agent, attribution=att)
        self.state = parse_node("n", desired.labels, desired.annotations)
        self.states = {g.uuid: DeviceState(g.uuid, g.index, True, (), g.memory_free_mib)
                       for g in gpus}  # fmt: skip

    def held(self) -> set[str]:
        return {d for h in self.listed for d in h.device_ids}

    def arrive(self, name: str, count: int, mib: int | None) -> str:
        free = [u for u in self.states if u not in self.held()]
        if count > len(free):  # NodeResourcesFit
            return "pending"
        doc = _pod(name, count, mib)
        out = self.ext.filter({"Pod": doc, "NodeNames": ["n"]})
        if out.get("NodeNames") != ["n"]:
            return "pending"
        predicted = self.ledger.get(name)
        assert predicted is not None, f"{name}: passed with no reservation"
        chosen = preferred(self.states, free, [], count, self.topology)
        got = tuple(sorted(self.states[u].index for u in chosen))
        assert got == tuple(sorted(predicted.gpus)), (
            f"{name} ({count} GPUs, {mib} MiB): the extender predicted {sorted(predicted.gpus)}, "
            f"the plugin handed out {list(got)}")  # fmt: skip
        short = [self.states[u].index for u in chosen if (self.states[u].free_mib or 0) < (mib or 0)]
        assert not short, f"{name}: admitted on GPUs {short} without {mib} MiB free"
        self.listed.append(ContainerDevices("ns", name, "c", GPU, tuple(chosen)))
        started = datetime.fromtimestamp(self.read_s + 1, timezone.utc)
        bound = {**doc, "spec": {**doc["spec"], "nodeName": "n"},
                 "status": {"phase": "Running", "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")}}  # fmt: skip
        self.ledger.pod_changed(f"ns/{name}", None, placement_from_pod(bound, predicted, now=self.read_s + 5))
        return "admitted"


USED = st.sampled_from([0, 7, MEMORY_GRAIN_MIB - 1, MEMORY_GRAIN_MIB + 512, 40 * 1024, 78 * 1024])
PODS = st.lists(st.tuples(st.sampled_from([1, 2, 2, 4, 4, 8]),
                          st.sampled_from([None, None, 1024, 30 * 1024, 60 * 1024]),
                          st.booleans()), min_size=1, max_size=6)  # fmt: skip


@pytest.mark.parametrize("trace", TRACES)
@hsettings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_extender_predicts_the_plugins_connected_set(trace: str, data: st.DataObject) -> None:
    n = len(TraceReader(DATA / trace, at_s=0).read().gpus)
    used = data.draw(st.lists(USED, min_size=n, max_size=n), label="used MiB per GPU")
    node = TopoNode(trace, used)
    for k, (count, mib, reading) in enumerate(data.draw(PODS, label="pods")):
        outcome = node.arrive(f"p{k}", count, mib)
        note(f"p{k}: {count} GPUs, {mib} MiB -> {outcome}")
        if reading:
            node.publish()


@pytest.mark.parametrize("trace", TRACES)
def test_the_telemetry_carries_the_topology_the_extender_places_by(trace: str) -> None:
    """The agent's reading's topology, published and parsed back, scores every pair alike."""
    node = TopoNode(trace, [0] * len(TraceReader(DATA / trace, at_s=0).read().gpus))
    parsed = node.state.topology
    assert parsed is not None
    for a, b in node.topology.pairs:
        assert parsed.pair_score(a, b) == node.topology.pair_score(a, b), (a, b)
    assert parsed.islands() == node.topology.islands()
