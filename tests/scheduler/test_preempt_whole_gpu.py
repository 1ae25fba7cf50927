"""Preemption for whole-GPU pods (issue 37, the preemption item): a GPU whose holder stays is
taken, whatever its memory shows, so the victims on a node are exactly the pods whose eviction
frees GPUs that then hold the preemptor, by the filter's own fit rule.

Every case goes through the ``/preempt`` verb (``scheduler.preempt.preempt``) over Nodes
rendered by core with the kubelet's per-GPU holders, as an agent publishes them, and is checked
against the filter itself: the node fails the filter before, passes it once the victims are
gone (their holders and memory off their GPUs, the node rendered again), and fails it when any
one victim the extender chose stays. A node where no eviction makes room is dropped (no
victims). The preemptor asks for whole GPUs either as devices (``nvidia.com/gpu``: exclusive)
or by the memory annotation alone; on whole GPUs the rule is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from omaticaya_py.core.model.sharing import Sharing, unit_id
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.publish.render_telemetry import telemetry_annotation
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import parse_node
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.inflight import Placement
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.preempt import Candidate, node_view, preempt
from tests.helpers import H100_TOTAL_MIB, PREFIX, gpu, settings, snapshot
from tests.scheduler.preemption_support import NOW, holder_books, kept, meta_args, pod_doc

if TYPE_CHECKING:
    from omaticaya_py.scheduler.deadline import Deadline

GIB = 1024
NEED_MIB = 60 * GIB  # 61440 MiB on each GPU
PRIORITY = 1000  # the preemptor's
LOW, MID, EQUAL, HIGH = 0, 10, PRIORITY, 2000
UNIT = 1024  # MiB per unit of a shared GPU
SHARED_RESOURCE = "omaticaya.io/gpu-memory"


# ------------------------------------------------------------------ builders ----


@dataclass(frozen=True)
class G:
    """One GPU: ``free`` MiB by the live reading, the containers the kubelet gave it whole
    (``holders``: ``(namespace/name, MiB its processes use or None: not known)``), or, when
    ``shared``, a shared GPU with the ``slices`` held (``(namespace/name, units)``)."""

    free: int
    holders: Sequence[tuple[str, int | None]] = ()
    slices: Sequence[tuple[str, int]] = ()
    total: int = H100_TOTAL_MIB
    shared: bool = False


def node_doc(name: str, gpus: Sequence[G]) -> dict[str, Any]:
    """A v1.Node as an agent writes it (labels and telemetry rendered by core), the ``shared``
    GPUs shared (``OMATICAYA_SHARED_GPUS``), the others whole."""
    shared = ",".join(str(i) for i, g in enumerate(gpus) if g.shared) or "none"
    s = settings(shared_gpus=shared)
    readings, attribution = [], {}
    for i, g in enumerate(gpus):
        reading = gpu(
            i, memory_free_mib=g.free, memory_total_mib=g.total, memory_used_mib=g.total - g.free,
            process_count=len(g.holders),
        )  # fmt: skip
        devices, pods, unknown = holder_books(i, reading.uuid, g.holders)
        first = 0
        for key, units in g.slices:
            ns, pod = key.split("/")
            ids = tuple(unit_id(reading.uuid, k) for k in range(first, first + units))
            devices.append(ContainerDevices(ns, pod, "main", SHARED_RESOURCE, ids))
            first += units
        attribution[reading.uuid] = GpuAttribution(
            reading.uuid, tuple(devices), tuple(pods), unknown_pids=tuple(unknown)
        )
        readings.append(reading)
    snap = snapshot(*readings)
    health = assess(snap)
    labels = render(snap, health, s, with_telemetry=False).labels
    annotations, _ = telemetry_annotation(
        snap, health, PREFIX, attribution=attribution, sharing=Sharing.of(s)
    )
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def evicted(gpus: Sequence[G], gone: set[str]) -> list[G]:
    """The GPUs once the pods ``gone`` (namespace/name) are evicted: their holdings off, the
    memory their processes used free again (what the agent reads after)."""
    out = []
    for g in gpus:
        freed = sum(mib or 0 for key, mib in g.holders if key in gone)
        out.append(G(g.free + freed, [h for h in g.holders if h[0] not in gone],
                     [s for s in g.slices if s[0] not in gone], g.total, g.shared))  # fmt: skip
    return out


def preemptor(count: int = 1, *, exclusive: bool = True, mib: int = NEED_MIB) -> dict[str, Any]:
    """The pending pod: ``count`` GPUs of ``mib`` each, as devices (``nvidia.com/gpu``) or by
    the annotations alone."""
    annotations = {f"{PREFIX}/gpu-memory-mib": str(mib)}
    resources: dict[str, Any] = {}
    if exclusive:
        resources = {"limits": {"nvidia.com/gpu": str(count)}}
    else:
        annotations[f"{PREFIX}/gpu-count"] = str(count)
    return {
        "metadata": {"uid": "uid-preemptor", "namespace": "ml", "name": "preemptor",
                     "annotations": annotations},
        "spec": {"priority": PRIORITY, "containers": [{"name": "main", "resources": resources}]},
    }  # fmt: skip


@dataclass
class Cluster:
    """Nodes (v1.Node documents) and the pods bound to each (v1.Pod documents)."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, name: str, gpus: Sequence[G], on_node: Sequence[tuple[str, int]]) -> None:
        self.nodes[name] = node_doc(name, gpus)
        self.pods[name] = [pod_doc(k, p, node=name, started=i) for i, (k, p) in enumerate(on_node)]

    def extender(self, **kw: Any) -> Extender:
        cache = {
            n: parse_node(n, d["metadata"]["labels"], d["metadata"]["annotations"], PREFIX)
            for n, d in self.nodes.items()
        }
        s = ExtenderSettings(_env_file=None, **kw)  # type: ignore[call-arg]
        return Extender(s, cache.get, clock=lambda: NOW)

    def read(self, node: str, deadline: Deadline | None = None) -> Candidate:
        return node_view(self.nodes[node], {"items": self.pods[node]}, PREFIX)


def passes_filter(gpus: Sequence[G], pod: dict[str, Any]) -> bool:
    """Whether the filter passes ``pod`` on a node of ``gpus`` (a fresh extender: no ledger)."""
    c = Cluster()
    c.add("n", gpus, ())
    return c.extender().filter({"Pod": pod, "NodeNames": ["n"]})["NodeNames"] == ["n"]


# ------------------------------------------------------------ the bug, first ----


def test_a_gpu_whose_holder_stays_is_no_room_for_the_preemptor():
    """Issue 37: GPU 0's holder uses 10 GiB, so 71000 MiB show free, but the kubelet gave the
    GPU to it: it has no room while that pod stays. The preemptor needs both GPUs: evicting b
    alone (GPU 1) leaves GPU 0 taken, so both must go. Before the fix the extender counted
    GPU 0's free memory as room, named b alone, and the pod still did not fit."""
    gpus = [G(71_000, [("low/a", 10_000)]), G(10_000, [("low/b", 70_000)])]
    c = Cluster()
    c.add("two", gpus, [("low/a", LOW), ("low/b", LOW)])
    pod = preemptor(2)
    assert not passes_filter(gpus, pod)
    got = kept(preempt(c.extender(), meta_args(pod, two=[]), c.read))
    assert got == {"two": ["uid-a", "uid-b"]}
    assert not passes_filter(evicted(gpus, {"low/b"}), pod), "b alone does not make room"
    assert passes_filter(evicted(gpus, {"low/a", "low/b"}), pod)


def test_one_gpu_taken_by_a_light_holder_is_freed_by_evicting_it():
    """One GPU needed: GPU 0 is the device kube-scheduler counts as free (no holder) but has
    too little memory; GPU 1 shows 71000 MiB free but its holder keeps it. Before the fix the
    extender judged the pod already fitting and dropped the node; a goes."""
    gpus = [G(20_000), G(71_000, [("low/a", 10_000)])]
    c = Cluster()
    c.add("one", gpus, [("low/a", LOW)])
    ext = c.extender()
    assert kept(preempt(ext, meta_args(preemptor(), one=[]), c.read)) == {"one": ["uid-a"]}
    assert ext.decisions.counts.get(("preempt", "dropped", "fits-already")) is None


def test_a_victim_named_on_the_wrong_gpu_stays_and_the_one_that_makes_room_is_added():
    """kube-scheduler's dry run counts devices, not memory: it names b, whose GPU has too
    little memory even once b goes. b stays a victim (its in-tree filters need it gone), and
    the holder of the GPU that then holds the pod is added; before the fix GPU 0's free memory
    (its holder staying) was counted and b alone was named."""
    gpus = [G(71_000, [("low/a", 10_000)]), G(11_000, [("low/b", 20_000)])]
    c = Cluster()
    c.add("n", gpus, [("low/a", LOW), ("low/b", LOW)])
    got = kept(preempt(c.extender(), meta_args(preemptor(), n=["uid-b"]), c.read))
    assert got == {"n": ["uid-b", "uid-a"]}
    assert not passes_filter(evicted(gpus, {"low/b"}), preemptor())
    assert passes_filter(evicted(gpus, {"low/a", "low/b"}), preemptor())


# ------------------------------------------------------------------ the table ----

# (id, GPUs, pods on the node (namespace/name, priority), GPUs the preemptor needs,
#  victims expected (namespace/name, in the answer's order) or None: the node dropped)
CASES: list[tuple[str, list[G], list[tuple[str, int]], int, list[str] | None]] = [
    ("one GPU: its holder goes",
     [G(10_000, [("low/a", 70_000)])], [("low/a", LOW)], 1, ["low/a"]),
    ("one GPU its holder keeps with the memory free: still taken, the holder goes",
     [G(71_000, [("low/a", 10_000)])], [("low/a", LOW)], 1, ["low/a"]),
    ("one GPU, holder using nothing: taken all the same",
     [G(81_000, [("low/a", 0)])], [("low/a", LOW)], 1, ["low/a"]),
    ("one GPU with two holders whose memory is unknown: both go, the GPU's free memory holds it",
     [G(70_000, [("low/x", None), ("low/y", None)])], [("low/x", LOW), ("low/y", LOW)], 1,
     ["low/x", "low/y"]),
    ("several GPUs: the lowest-priority holder of a GPU that then holds it goes, alone",
     [G(10_000, [("low/a", 70_000)]), G(71_000, [("low/b", 10_000)]),
      G(1_000, [("low/c", 79_000)])],
     [("low/a", MID), ("low/b", 5), ("low/c", MID)], 1, ["low/b"]),
    ("several GPUs, one free but too full: the holder goes, not the free GPU's memory counted",
     [G(30_000), G(75_000, [("low/a", 5_000)]), G(60_000)], [("low/a", LOW)], 1, ["low/a"]),
    ("victim on the wrong GPU: the lower-priority pod's GPU is too full even freed, it stays",
     [G(11_000, [("low/lo", 10_000)]), G(10_000, [("low/mid", 70_000)])],
     [("low/lo", LOW), ("low/mid", MID)], 1, ["low/mid"]),
    ("victim on a GPU too small for the pod: it stays, the holder of a big one goes",
     [G(1_000, [("low/small", 39_000)], total=40_960), G(70_000, [("low/big", 10_000)])],
     [("low/small", LOW), ("low/big", MID)], 1, ["low/big"]),
    ("two GPUs needed, each held: both holders go",
     [G(71_000, [("low/a", 10_000)]), G(10_000, [("low/b", 70_000)])],
     [("low/a", LOW), ("low/b", LOW)], 2, ["low/a", "low/b"]),
    ("two GPUs needed, one free: the holder of the one that then fits goes",
     [G(80_000), G(71_000, [("low/a", 10_000)]), G(5_000, [("low/b", 20_000)])],
     [("low/a", MID), ("low/b", LOW)], 2, ["low/a"]),
    ("two victims on one GPU, the other GPU's holders spared",
     [G(10_000, [("low/x", None), ("low/y", None)]), G(70_000, [("low/z", None), ("low/w", None)])],
     [("low/x", LOW), ("low/y", LOW), ("low/z", LOW), ("low/w", LOW)], 1, ["low/z", "low/w"]),
    ("nothing helps: the freed GPU has too little memory (out-of-band use)",
     [G(1_000, [("low/a", 20_000)])], [("low/a", LOW)], 1, None),
    ("nothing helps: two GPUs needed, the other held by a higher-priority pod",
     [G(71_000, [("high/h", 10_000)]), G(10_000, [("low/b", 70_000)])],
     [("high/h", HIGH), ("low/b", LOW)], 2, None),
    ("nothing helps: holders whose memory is unknown on a full GPU",
     [G(1_000, [("low/x", None), ("low/y", None)])], [("low/x", LOW), ("low/y", LOW)], 1, None),
    ("lower priority only: a holder of equal priority stays, the lower one goes",
     [G(10_000, [("eq/e", 70_000)]), G(10_000, [("low/l", 70_000)])],
     [("eq/e", EQUAL), ("low/l", EQUAL - 1)], 1, ["low/l"]),
    ("lower priority only: every holder of equal or higher priority: dropped",
     [G(71_000, [("eq/e", 10_000)]), G(10_000, [("high/h", 70_000)])],
     [("eq/e", EQUAL), ("high/h", HIGH)], 1, None),
    ("lower priority only: two GPUs needed, the one low holder is not enough: dropped",
     [G(71_000, [("eq/e", 10_000)]), G(10_000, [("low/l", 70_000)])],
     [("eq/e", EQUAL), ("low/l", LOW)], 2, None),
    ("slices as bystanders: a shared GPU's room is never a whole GPU, its pods stay",
     [G(79_000, shared=True, slices=[("low/s1", 10), ("low/s2", 10)]),
      G(10_000, [("low/a", 70_000)])],
     [("low/s1", LOW), ("low/s2", LOW), ("low/a", MID)], 1, ["low/a"]),
    ("slices as bystanders: only a shared GPU and a higher-priority holder: dropped",
     [G(20_000, shared=True, slices=[("low/s1", 40), ("low/s2", 20)]),
      G(10_000, [("high/h", 70_000)])],
     [("low/s1", LOW), ("low/s2", LOW), ("high/h", HIGH)], 1, None),
]  # fmt: skip


def _uids(keys: Sequence[str]) -> list[str]:
    return [f"uid-{k.split('/')[1]}" for k in keys]


@pytest.mark.parametrize("exclusive", [True, False], ids=["devices", "annotation"])
@pytest.mark.parametrize(
    "gpus,on_node,count,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_victims_are_exactly_the_pods_whose_eviction_makes_room(gpus, on_node, count, expected,
                                                                exclusive):  # fmt: skip
    pod = preemptor(count, exclusive=exclusive)
    c = Cluster()
    c.add("n", gpus, on_node)
    ext = c.extender()
    assert not passes_filter(gpus, pod), "the case is a node the filter fails"
    got = kept(preempt(ext, meta_args(pod, n=[]), c.read))
    if expected is None:
        assert got == {}
        (outcome,) = {k[1:] for k in ext.decisions.counts if k[0] == "preempt"}
        assert outcome[0] == "dropped" and outcome[1] in ("too-little", "no-fit"), outcome
        everyone = {k for k, p in on_node if p < PRIORITY}
        assert not passes_filter(evicted(gpus, everyone), pod), "no eviction makes room"
        return
    assert got == {"n": _uids(expected)}
    # the same fit rule over the node after the victims go: it fits, and each victim is needed
    assert passes_filter(evicted(gpus, set(expected)), pod)
    for spared in expected:
        assert not passes_filter(evicted(gpus, set(expected) - {spared}), pod), spared


def test_an_exclusive_reservation_takes_its_gpu_whole_and_its_pod_goes():
    """A pod placed by the filter on GPU 1 with ``nvidia.com/gpu`` (the ledger's exclusive
    placement), not in the telemetry yet: GPU 1's 80 GiB show free, yet the device plugin
    hands it to that pod. The filter fails the preemptor there; evicting the pod frees it.
    Before the fix its reservation took only its 10 GiB and the node was dropped as fitting
    already."""
    c = Cluster()
    c.add("held", [G(1_000, [("low/a", 80_000)]), G(80_000)], [("low/a", LOW), ("low/r", LOW)])
    ext = c.extender(settle_s=600)
    ext.ledger = Ledger(600)
    ext.ledger.pod_changed("low/r", None, Placement(
        "low/r", "uid-r", "held", 10_000, 1, placed_at=NOW, gpus=(1,), bound=True, exclusive=True,
    ))  # fmt: skip
    pod = preemptor()
    assert ext.filter({"Pod": pod, "NodeNames": ["held"]})["NodeNames"] == []
    # r is newer than a, and either frees a GPU: the older pod is spared
    assert kept(preempt(ext, meta_args(pod, held=[]), c.read)) == {"held": ["uid-r"]}


def test_a_shared_reservation_of_memory_still_counts_on_a_freed_gpu():
    """An annotation-only pod's reservation (not exclusive) takes its memory from GPU 0 and
    stays: evicting a frees GPU 0's device, but 81000 - 30000 MiB is too little; b's GPU is
    the one to free."""
    c = Cluster()
    c.add("n", [G(1_000, [("low/a", 80_000)]), G(5_000, [("low/b", 76_000)])],
          [("low/a", LOW), ("low/b", MID), ("high/m", HIGH)])  # fmt: skip
    ext = c.extender(settle_s=600)
    ext.ledger = Ledger(600)
    ext.ledger.pod_changed("high/m", None, Placement(
        "high/m", "uid-m", "n", 30_000, 1, placed_at=NOW, gpus=(0,), bound=True,
    ))  # fmt: skip
    assert kept(preempt(ext, meta_args(preemptor(), n=[]), c.read)) == {"n": ["uid-b"]}
