"""The extender ranks a node by the best set of GPUs it can give (issue 50 item 4): a pod of
several whole GPUs goes where that many connected GPUs are free rather than where as many
scattered ones are, whatever the placement policy; other pods are ranked as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from omaticaya_py.core.model.topology import NodeTopology
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.schema import NodeGpuState, parse_node
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.fit import by_links, scores
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import pod_need
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import READ_AT, evaluate, settings, snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
NOW = READ_AT.timestamp() + 5


def _node(name: str, trace: str, held: set[int], used_mib: dict[int, int] | None = None,
          topology: bool = True) -> NodeGpuState:  # fmt: skip
    """The agent's render of a topology trace's node with GPUs ``held`` handed out."""
    first = TraceReader(DATA / trace, at_s=0).read()
    gpus = [replace(g, memory_free_mib=g.memory_total_mib - (used_mib or {}).get(g.index, 0))
            for g in first.gpus]  # fmt: skip
    snap = replace(snapshot(*gpus, read_at=READ_AT), topology=first.topology if topology else None)
    att = {g.uuid: GpuAttribution(g.uuid, holders=(
        (ContainerDevices("ns", f"held-{g.index}", "c", "nvidia.com/gpu", (g.uuid,)),)
        if g.index in held else ())) for g in gpus}  # fmt: skip
    agent = settings()
    health, _ = evaluate(snap, agent)
    desired = render(snap, health, agent, attribution=att)
    return replace(parse_node(name, desired.labels, desired.annotations), name=name)


def _pod(name: str, count: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": {}},
            "spec": {"schedulerName": "omaticaya-scheduler", "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(count)}}}]}}  # fmt: skip


def _extender(states: dict[str, NodeGpuState], policy: str) -> Extender:
    s = ExtenderSettings(_env_file=None, placement_policy=policy)
    return Extender(s, states.get, clock=lambda: NOW, monotonic=lambda: 0.0,
                    ledger=Ledger(s.settle_s, s.assume_s))  # fmt: skip


BRIDGE = "pcie-nvlink-bridge-topo-trace.json"


def _two_nodes() -> dict[str, NodeGpuState]:
    # "pairs": GPUs 0-3 held, two bridged pairs (4-5, 6-7) free;
    # "scattered": one GPU of each pair held (0, 2, 4, 6), GPUs 1, 3, 5, 7 free, no two bridged
    return {"pairs": _node("pairs", BRIDGE, {0, 1, 2, 3}),
            "scattered": _node("scattered", BRIDGE, {0, 2, 4, 6})}  # fmt: skip


@pytest.mark.parametrize("policy", ["spread", "binpack"])
@pytest.mark.parametrize(("count", "best"), [(2, "pairs"), (4, "pairs")])
def test_a_pod_of_several_gpus_goes_where_they_are_connected(policy, count, best):
    states = _two_nodes()
    ext = _extender(states, policy)
    # kube-scheduler asks about the scattered node first: order alone would pick it
    out = ext.filter({"Pod": _pod("p", count), "NodeNames": ["scattered", "pairs"]})
    assert out["NodeNames"] == [best], out
    fresh = _extender(_two_nodes(), policy)  # no reservation of "p" in its books
    ranked = {h["Host"]: h["Score"] for h in
              fresh.prioritize({"Pod": _pod("q", count), "NodeNames": ["scattered", "pairs"]})}  # fmt: skip
    assert ranked[best] > ranked["scattered"], ranked


def test_one_gpu_is_ranked_by_the_policy_as_before():
    states = _two_nodes()
    need = pod_need(_pod("one", 1))
    assert need is not None and not by_links(need)
    out = _extender(states, "spread").filter({"Pod": _pod("one", 1),
                                              "NodeNames": ["scattered", "pairs"]})  # fmt: skip
    assert out["NodeNames"] == ["scattered"]  # equal free memory: the first asked about


def test_a_node_without_topology_ranks_below_a_connected_one():
    states = {"blind": _node("blind", BRIDGE, set(), topology=False),
              "pairs": _node("pairs", BRIDGE, {0, 1, 2, 3})}  # fmt: skip
    out = _extender(states, "spread").filter({"Pod": _pod("p", 2), "NodeNames": ["blind", "pairs"]})
    assert out["NodeNames"] == ["pairs"]


@pytest.mark.parametrize(
    ("free", "policy", "links", "expected"),
    [
        ({"a": 10, "b": 20}, "spread", None, {"a": 1, "b": 10}),
        ({"a": 10, "b": 20}, "spread", {"a": 500, "b": 500}, {"a": 1, "b": 10}),  # equal: by free
        ({"a": 10, "b": 20}, "spread", {"a": 500, "b": 100}, {"a": 10, "b": 1}),
        ({"a": 10, "b": 20}, "binpack", {"a": 100, "b": 500}, {"a": 1, "b": 10}),
        ({"a": 10, "b": 20, "c": 30}, "spread", {"b": 400}, {"a": 1, "b": 10, "c": 1}),
    ],
)
def test_scores_by_links_when_they_differ(free, policy, links, expected):
    assert scores(free, policy, links) == expected


def test_the_parsed_topology_is_what_the_ranking_reads():
    state = _node("pairs", BRIDGE, set())
    assert isinstance(state.topology, NodeTopology)
    assert state.topology.set_score([0, 1]) > state.topology.set_score([1, 2])
