"""Preemption on nodes kube-scheduler does not offer (issue 48 item 6): where its own count fits
(``nvidia.com/gpu`` free, the GPU memory not) its dry run names no victim and drops the node
("expected at least one victim pod on node"), so ``/preempt`` adds the nodes the pod's filter
failed for room alone (``victims.RoomSought``) and chooses their victims itself.

The node ``counted`` is the multi-GPU trace's case: four low-priority 30 GiB pods on GPUs 1, 2,
5 and 6, GPUs 3 and 7 free by count with 9 and 3 GiB free, GPUs 0 and 4 held by pods of the
preemptor's priority (never victims)."""

from __future__ import annotations

from typing import Any

import pytest

from omaticaya_py.core.schema import parse_node
from omaticaya_py.kube import KubeTooManyRequests
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.fit import Reason, reason_text
from omaticaya_py.scheduler.preempt import Candidate, PreemptOptions, node_view, preempt
from omaticaya_py.scheduler.room_sought import ROOM_KEEP_S, RoomSought
from omaticaya_py.scheduler.unasked import (
    ASK_WAIT_S,
    UnaskedEdges,
    UnaskedPreemption,
    not_eligible,
    pick_node,
)
from tests.helpers import PREFIX
from tests.scheduler.preemption_support import NOW, gpu_node, gpu_pod, kept, meta_args, pod_doc

GIB = 1024
LOWS = ("low/p1", "low/p2", "low/p5", "low/p6")
#: the trace's node: per GPU (free MiB, holders)
COUNTED = [
    (40_000, [("hi/r0", 40_000)]),
    (50_000, [(LOWS[0], 30 * GIB)]),
    (50_000, [(LOWS[1], 30 * GIB)]),
    (9 * GIB, []),
    (40_000, [("hi/r4", 40_000)]),
    (50_000, [(LOWS[2], 30 * GIB)]),
    (50_000, [(LOWS[3], 30 * GIB)]),
    (3 * GIB, []),
]
NODES = {
    "counted": gpu_node("counted", COUNTED),
    # full by count, as kube-scheduler offers it: its one low pod's GPU frees too little
    "full": gpu_node("full", [(1_000, [("low/f", 10_000)])]),
    # no lower-priority pod holds anything: nothing to evict
    "bare": gpu_node("bare", [(1_000, [])]),
    # an unhealthy GPU: eviction cannot help (unresolvable, never recorded)
    "sick": gpu_node("sick", [(1_000, [("low/s", 80_000)])], unhealthy=[0]),
}
ON_NODE = {
    "counted": [pod_doc("hi/r0", 1000, node="counted"), pod_doc("hi/r4", 1000, node="counted"),
                *(pod_doc(k, 0, node="counted", started=i) for i, k in enumerate(LOWS))],
    "full": [pod_doc("low/f", 0, node="full")],
    "bare": [],
    "sick": [pod_doc("low/s", 0, node="sick")],
}  # fmt: skip


def extender() -> Extender:
    cache = {
        n: parse_node(n, d["metadata"]["labels"], d["metadata"]["annotations"], PREFIX)
        for n, d in NODES.items()
    }
    s = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]
    ext = Extender(s, cache.get, clock=lambda: NOW)
    ext.monotonic = lambda: 100.0
    return ext


def reader(read: list[str]) -> Any:
    def read_node(node: str, deadline: Any = None) -> Candidate:
        read.append(node)
        return node_view(NODES[node], {"items": ON_NODE[node]}, PREFIX)

    return read_node


def preempt_after_filter(names: list[str], offered: dict[str, list[str]],
                         filtered: bool = True) -> tuple[dict[str, list[str]], Extender, list[str]]:  # fmt: skip
    """kube-scheduler's cycle: the filter over ``names`` (the nodes its in-tree filters
    passed), then ``/preempt`` with the candidates its dry run ``offered``."""
    ext, read = extender(), []
    if filtered:
        result = ext.filter({"Pod": gpu_pod(), "NodeNames": names})
        assert result["NodeNames"] == [], result
    return kept(preempt(ext, meta_args(gpu_pod(), **offered), reader(read))), ext, read


def test_a_node_whose_count_fits_gets_the_victim_its_gpu_memory_needs():
    got, ext, read = preempt_after_filter(["counted", "bare", "sick"], {"full": []})
    # one 30 GiB pod's GPU then holds 60 GiB; of four equal ones, the newest goes (p6)
    assert got == {"counted": ["uid-p6"]}
    assert read == ["full", "counted", "bare"], "the offered first; the unhealthy never read"
    counts = {k[1:]: n for k, n in ext.decisions.counts.items() if k[0] == "preempt"}
    assert counts == {("kept", "added"): 1, ("dropped", "too-little"): 2}


def test_without_the_filter_of_this_pod_nothing_is_added():
    got, _, read = preempt_after_filter([], {"full": []}, filtered=False)
    assert got == {} and read == ["full"]


def test_the_offered_nodes_victims_stay_and_an_added_node_is_read_once():
    """A node kube-scheduler offers is never added again: its named victims stand."""
    got, _, read = preempt_after_filter(["counted"], {"counted": ["uid-p1"]})
    assert got == {"counted": ["uid-p1"]} and read == ["counted"]


def test_a_pod_that_fits_somewhere_forgets_its_earlier_filter():
    NODES["roomy"], ON_NODE["roomy"] = gpu_node("roomy", [(70_000, [])]), []
    try:
        ext = extender()
        assert ext.filter({"Pod": gpu_pod(), "NodeNames": ["counted"]})["NodeNames"] == []
        assert ext.room_sought.nodes("uid-preemptor", 100.0) == ("counted",)
        assert ext.filter({"Pod": gpu_pod(), "NodeNames": ["counted", "roomy"]})["NodeNames"]
        assert ext.room_sought.nodes("uid-preemptor", 100.0) == ()
    finally:
        del NODES["roomy"], ON_NODE["roomy"]


NO_ROOM = reason_text(Reason.NO_ROOM, wanted="pod needs a GPU with 61440 MiB free", prefix=PREFIX)
IN_FLIGHT = reason_text(Reason.IN_FLIGHT, wanted="pod needs a GPU with 61440 MiB free",
                        prefix=PREFIX)  # fmt: skip
STALE = reason_text(Reason.STALE, why="read 600 s ago", prefix=PREFIX)
OTHER = reason_text(Reason.OTHER_NODE, prefix=PREFIX)

SOUGHT_CASES = [
    # (id, failed, hopeless, read at (s after the record), expected nodes)
    ("no room and room in flight: in the filter's order",
     {"b": NO_ROOM, "a": IN_FLIGHT}, (), 0.0, ("b", "a")),
    ("stale, another node chosen: not for room", {"a": STALE, "b": OTHER}, (), 0.0, ()),
    ("no room on GPUs too small (unresolvable): left out", {"a": NO_ROOM, "b": NO_ROOM}, ("a",),
     0.0, ("b",)),
    ("within the keep", {"a": NO_ROOM}, (), ROOM_KEEP_S, ("a",)),
    ("past the keep: a later cycle's", {"a": NO_ROOM}, (), ROOM_KEEP_S + 0.1, ()),
    ("a clock behind the record", {"a": NO_ROOM}, (), -1.0, ()),
]  # fmt: skip


@pytest.mark.parametrize("failed,hopeless,after_s,expected", [c[1:] for c in SOUGHT_CASES],
                         ids=[c[0] for c in SOUGHT_CASES])  # fmt: skip
def test_room_sought(failed, hopeless, after_s, expected):
    book = RoomSought()
    book.record("u", failed, hopeless, 10.0)
    assert book.nodes("u", 10.0 + after_s) == expected
    assert book.nodes("other", 10.0) == ()


def test_room_sought_forgets_a_pod_that_passed_and_the_oldest_pod_past_its_bound():
    book = RoomSought(max_pods=2)
    book.record("", {"a": NO_ROOM}, (), 0.0)  # no uid: nothing to key on
    for uid in ("u1", "u2", "u3"):
        book.record(uid, {"a": NO_ROOM}, (), 0.0)
    assert [book.nodes(u, 0.0) for u in ("u1", "u2", "u3")] == [(), ("a",), ("a",)]
    book.record("u2", {}, (), 1.0)  # its next filter passed a node
    assert book.nodes("u2", 1.0) == ()
    with pytest.raises(ValueError, match="max_pods"):
        RoomSought(max_pods=0)


def test_room_sought_keeps_the_first_nodes_of_a_filter_only():
    book = RoomSought(max_nodes=2)
    book.record("u", {"a": NO_ROOM, "b": STALE, "c": NO_ROOM, "d": NO_ROOM}, (), 0.0)
    assert book.nodes("u", 0.0) == ("a", "c")


# -- preemption kube-scheduler never asks for (omaticaya_py.scheduler.unasked) -------------
#
# The single-node case of issue 48 item 6: where every node's count fits, kube-scheduler's dry
# run has no candidate and never calls /preempt; with OMATICAYA_EXTENDER_PREEMPT_UNASKED the
# extender evicts the victims /preempt would have named, itself.


class Unasked:
    """An ``UnaskedPreemption`` on ``extender()`` whose edges are the trace node's documents:
    ``preempt_over`` is the real ``preempt`` (the one rule), the pod read and the evictions
    recorded here."""

    def __init__(self, fresh: dict | None = None, refuse: Exception | None = None) -> None:
        self.ext, self.now = extender(), 100.0
        self.ext.monotonic = lambda: self.now
        self.fresh = gpu_pod() if fresh is None else fresh
        self.refuse = refuse
        self.on_node = {p["metadata"]["uid"]: f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                        for p in ON_NODE["counted"]}  # fmt: skip
        self.evicted: list[tuple[str, str, str]] = []
        self.told: list[tuple[str, str]] = []
        self.unasked = UnaskedPreemption(UnaskedEdges(
            self.preempt_over,
            lambda ns, name: self.fresh if self.fresh else None,
            lambda node: dict(self.on_node),
            self.evict,
            lambda ns, name, uid, reason, message: self.told.append((f"{ns}/{name}", reason)),
            self.ext.decisions.unasked,
        ), clock=lambda: self.now)  # fmt: skip
        self.ext.unasked = self.unasked

    def preempt_over(self, pod: Any, nodes: Any) -> tuple[dict, dict]:
        seen: dict = {}

        def read(node: str, deadline: Any = None) -> Candidate:
            view = reader([])(node, deadline)
            seen.update((p.uid, p) for p in view.pods)
            return view

        options = PreemptOptions(room_nodes=nodes, count=self.ext.decisions.unasked)
        return preempt(self.ext, {"Pod": pod, "NodeNameToMetaVictims": {}}, read, options), seen

    def evict(self, ns: str, name: str, uid: str) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.evicted.append((ns, name, uid))

    def filter(self) -> None:
        assert self.ext.filter({"Pod": gpu_pod(), "NodeNames": ["counted"]})["NodeNames"] == []

    def counts(self, per_node: bool = False) -> dict[tuple[str, str], int]:
        """The pods' outcomes (``per_node``: the nodes' too, as /preempt counts them); nothing
        ever under the ``preempt`` verb, which kube-scheduler's calls alone count."""
        assert not any(k[0] == "preempt" for k in self.ext.decisions.counts)
        return {k[1:]: n for k, n in self.ext.decisions.counts.items() if k[0] == "preempt-unasked"
                and (per_node or k[1] not in ("kept", "dropped"))}


def test_unasked_the_trace_node_alone_gets_its_one_victim_once_kube_scheduler_does_not_ask():
    u = Unasked()
    u.filter()
    assert u.unasked.waiting() == ["uid-preemptor"]
    u.now += ASK_WAIT_S - 0.1
    u.filter()  # kube-scheduler's retry: the wait runs from the first failure
    assert u.unasked.run_once() == 0 and u.evicted == []
    u.now += 0.1
    assert u.unasked.run_once() == 1
    # the fewest victims by /preempt's rule: one 30 GiB pod, the newest of four equal ones
    assert u.evicted == [("low", "p6", "uid-p6")]
    assert u.told == [("low/p6", "PreemptedForGpuMemory"), ("ml/preemptor", "GpuPreemption")]
    assert u.counts(per_node=True) == {("evicted", ""): 1, ("kept", "added"): 1}
    assert u.unasked.waiting() == []


def test_unasked_a_pod_kube_scheduler_asks_for_or_that_fits_is_left_to_it():
    u = Unasked()
    u.filter()
    u.unasked.asked("uid-preemptor")  # /preempt came: kube-scheduler's own preemption runs
    u.now += ASK_WAIT_S
    assert u.unasked.run_once() == 0 and u.unasked.waiting() == []
    u.unasked.filtered(gpu_pod(), ("counted",), u.now)
    u.unasked.filtered(gpu_pod(), (), u.now + 1)  # its next filter passed a node
    u.now += 2 * ASK_WAIT_S
    assert u.unasked.run_once() == 0 and u.evicted == [] and u.counts() == {}


UNASKED_SKIPS = [
    # (id, the pod as read fresh, counted reason)
    ("bound meanwhile", {**gpu_pod(), "spec": {"priority": 1000, "nodeName": "counted"}}, "bound"),
    ("being deleted", {**gpu_pod(), "metadata": {**gpu_pod()["metadata"],
                                                 "deletionTimestamp": "2026-12-07T10:00:00Z"}},
     "going"),
    ("preemptionPolicy Never", {**gpu_pod(), "spec": {"priority": 1000,
                                                      "preemptionPolicy": "Never"}}, "never"),
    ("nominated by kube-scheduler's own preemption (its victims leaving: it does not ask)",
     {**gpu_pod(), "status": {"nominatedNodeName": "counted"}}, "nominated"),
    ("deleted", {}, "gone"),
    ("another pod of that name", {**gpu_pod(), "metadata": {**gpu_pod()["metadata"],
                                                            "uid": "uid-next"}}, "gone"),
    ("no lower-priority pod to evict", gpu_pod(priority=0), "no-victims"),
]  # fmt: skip


@pytest.mark.parametrize("fresh,why", [c[1:] for c in UNASKED_SKIPS],
                         ids=[c[0] for c in UNASKED_SKIPS])  # fmt: skip
def test_unasked_skips(fresh, why):
    u = Unasked(fresh=fresh)
    u.filter()
    u.now += ASK_WAIT_S
    assert u.unasked.run_once() == 0
    assert u.evicted == [] and u.told == []
    assert u.counts() == {("skipped", why): 1}


def test_unasked_nothing_more_is_evicted_while_the_victims_are_leaving():
    """The victim terminating is never a victim again, but its GPU still reads as held: a
    second round must not charge the node another pod."""
    u = Unasked()
    u.filter()
    u.now += ASK_WAIT_S
    assert u.unasked.run_once() == 1
    u.filter()
    u.now += ASK_WAIT_S
    assert u.unasked.run_once() == 0
    assert u.counts() == {("evicted", ""): 1, ("skipped", "holding"): 1}
    # gone from the node: the telemetry still names it on GPU 6, so its room is on its way
    del u.on_node["uid-p6"]
    ON_NODE["counted"] = [p for p in ON_NODE["counted"] if p["metadata"]["uid"] != "uid-p6"]
    try:
        u.filter()
        u.now += ASK_WAIT_S
        assert u.unasked.run_once() == 0
    finally:
        ON_NODE["counted"].append(pod_doc(LOWS[3], 0, node="counted", started=3))
    assert u.evicted == [("low", "p6", "uid-p6")]
    assert u.counts()[("skipped", "no-victims")] == 1


def test_unasked_a_disruption_budget_that_refuses_is_obeyed():
    u = Unasked(refuse=KubeTooManyRequests("Cannot evict pod as it would violate the pod's "
                                           "disruption budget.", status=429))  # fmt: skip
    u.filter()
    u.now += ASK_WAIT_S
    assert u.unasked.run_once() == 0
    assert u.told == [] and u.counts() == {("refused", "pdb"): 1}
    # not held: its next failed filter tries again
    u.filter()
    u.now += ASK_WAIT_S
    u.refuse = None
    assert u.unasked.run_once() == 1


#: victim uid -> priority, for PICKS
PRIO = {"hi": 500, "lo": 100, "lo2": 100, "zero": 0, "zero2": 0}
PICKS = [
    # (id, victims per node, in the answer's order; the pick), as kube-scheduler picks
    ("the least important most important victim", {"a": ["hi"], "b": ["lo", "lo2"]},
     ("b", ("lo", "lo2"))),
    ("then the lowest priority sum", {"a": ["lo", "lo2"], "b": ["lo", "zero"]},
     ("b", ("lo", "zero"))),
    ("then the fewest victims", {"a": ["zero", "zero2"], "b": ["zero"]}, ("b", ("zero",))),
    ("a tie: the answer's order", {"a": ["zero"], "b": ["zero2"]}, ("a", ("zero",))),
    ("an unknown priority reads 0", {"a": ["lo"], "b": ["unknown"]}, ("b", ("unknown",))),
    ("none", {}, None),
    ("a node without victims is no pick", {"a": []}, None),
]  # fmt: skip


@pytest.mark.parametrize("victims,expected", [c[1:] for c in PICKS], ids=[c[0] for c in PICKS])
def test_pick_node(victims, expected):
    assert pick_node(meta_args({}, **victims), PRIO) == expected
    assert pick_node({"NodeNameToMetaVictims": "bad"}) is None


def test_not_eligible_reads_untrusted_documents():
    assert not_eligible(None) == "" and not_eligible({"spec": []}) == ""
    assert not_eligible({"spec": {"nodeName": "n"}}) == "bound"
