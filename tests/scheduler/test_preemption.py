"""Preemption by GPU memory (``scheduler.victims``, ``scheduler.preempt``): which pods go, as
tables over the pure rules, and the ``/preempt`` verb over Nodes rendered by core from synthetic
snapshots with per-GPU pod attribution, as an agent publishes them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest
from starlette.testclient import TestClient

from omaticaya_py.core.schema import parse_node
from omaticaya_py.scheduler import create_app
from omaticaya_py.scheduler.fit import Reason, ReasonText, reason_text
from omaticaya_py.scheduler.inflight import Placement
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.preempt import Candidate, PreemptOptions, preempt
from omaticaya_py.scheduler.victims import (
    EXACT_POOL,
    GpuRoom,
    PodOnNode,
    Preemptor,
    choose_victims,
    node_after,
    pod_on_node,
    unresolvable,
)
from tests.helpers import PREFIX
from tests.scheduler.preemption_support import (  # the names moved out, for this file's tests
    GIB,  # noqa: F401
    NEED,  # noqa: F401
    NODES,  # noqa: F401
    NOW,  # noqa: F401
    ON_NODE,  # noqa: F401
    Gpu,  # noqa: F401
    extender,  # noqa: F401
    gpu_node,  # noqa: F401
    gpu_pod,  # noqa: F401
    holder_books,  # noqa: F401
    kept,  # noqa: F401
    meta_args,  # noqa: F401
    pod_doc,  # noqa: F401
    pods,  # noqa: F401
    reader,  # noqa: F401
)

if TYPE_CHECKING:
    from omaticaya_py.scheduler.deadline import Deadline



# ------------------------------------------------------------------ builders ----












def room(index: int, free: int, *holders: tuple[str, int | None], total: int | None = 81559,
         healthy: bool = True) -> GpuRoom:  # fmt: skip
    return GpuRoom(index, free, healthy, total, tuple(holders))




def placed(name: str, mib: int, gpus: tuple[int, ...] = (0,), **kw: Any) -> Placement:
    """The ledger's placement of pod ``a/<name>`` on ``gpus`` of node ``n``."""
    return Placement(f"a/{name}", f"uid-{name}", "n", mib, len(gpus), gpus=gpus, **kw)


# ------------------------------------------------------------ choose_victims ----

LOW = 0

VICTIM_CASES = [
    # (id, gpus, pods, kwargs, expected victims or None)
    ("the holder of a GPU that then fits goes",
     [room(0, 10_000, ("a/x", 70_000))], pods(("a/x", LOW)), {}, ("uid-x",)),
    ("already fits: nobody goes",
     [room(0, 70_000), room(1, 1_000, ("a/x", 80_000))], pods(("a/x", LOW)), {}, ()),
    ("a GPU its holder keeps has no room, whatever its memory shows: the holder goes",
     [room(0, 70_000, ("a/x", 10_000))], pods(("a/x", LOW)), {}, ("uid-x",)),
    ("a GPU taken by a holder that stays is no room for a second GPU: both go",
     [room(0, 70_000, ("a/x", 10_000)), room(1, 1_000, ("a/y", 80_000))],
     pods(("a/x", LOW), ("a/y", LOW)), {"need": Need(60 * GIB, 2)}, ("uid-x", "uid-y")),
    ("a holder the telemetry does not name never goes: its GPU stays taken",
     [room(0, 70_000, ("", 10_000))], [], {}, None),
    ("a GPU smaller than the need: dropped, whatever it holds",
     [room(0, 1_000, ("a/x", 39_000), total=40_960)], pods(("a/x", LOW)), {}, None),
    ("holders whose memory is unknown free nothing: dropped",
     [room(0, 1_000, ("a/x", None), ("a/y", None))], pods(("a/x", LOW), ("a/y", LOW)), {}, None),
    ("holders whose memory is unknown free their GPU: both go when its free memory holds it",
     [room(0, 70_000, ("a/x", None), ("a/y", None))], pods(("a/x", LOW), ("a/y", LOW)), {},
     ("uid-x", "uid-y")),
    ("a holder of equal priority is never a victim: dropped",
     [room(0, 10_000, ("a/x", 70_000))], pods(("a/x", 1000)), {}, None),
    ("a terminating holder is never a victim: dropped",
     [room(0, 10_000, ("a/x", 70_000))], [PodOnNode("uid-x", "a/x", LOW, going=True)], {}, None),
    ("pods on a GPU that cannot fit stay; the ones on the GPU that can go",
     [room(0, 10_000, ("a/x", 30_000), ("a/z", 40_000)), room(1, 1_000, ("a/y", 5_000))],
     pods(("a/x", LOW), ("a/y", LOW), ("a/z", LOW)), {}, ("uid-x", "uid-z")),
    ("of two GPUs that would each do, the lower-priority holder goes",
     [room(0, 1_000, ("a/hi", 70_000)), room(1, 1_000, ("a/lo", 70_000))],
     pods(("a/hi", 50), ("a/lo", 10)), {}, ("uid-lo",)),
    ("same priority: the earlier pod (older) is spared",
     [room(0, 1_000, ("a/old", 70_000)), room(1, 1_000, ("a/new", 70_000))],
     pods(("a/old", LOW), ("a/new", LOW)), {}, ("uid-new",)),
    ("an unhealthy GPU never counts",
     [room(0, 10_000, ("a/x", 70_000), healthy=False)], pods(("a/x", LOW)), {}, None),
    ("a victim's reservation (placed, not in the telemetry yet) frees its memory",
     [room(0, 70_000)], pods(("a/r", LOW)), {"reserved": [placed("r", 30_000)]}, ("uid-r",)),
    ("an exclusive reservation takes its GPU whole: its pod goes",
     [room(0, 80_000)], pods(("a/r", LOW)),
     {"reserved": [placed("r", 10_000, exclusive=True)]}, ("uid-r",)),
    ("a reservation on another GPU leaves a GPU with room: nobody goes",
     [room(0, 80_000), room(1, 80_000)], pods(("a/r", LOW)),
     {"reserved": [placed("r", 10_000, exclusive=True)]}, ()),
    ("a reservation of slices is on a shared GPU, never a whole one: nobody goes",
     [room(0, 70_000)], pods(("a/r", LOW)), {"reserved": [placed("r", 0, slices=(30,))]}, ()),
    ("the preemptor's own reservation never counts",
     [room(0, 70_000)], [], {"reserved": [placed("preemptor", 30_000)]}, ()),
    ("a reservation of a pod not on the node list is not a victim: dropped",
     [room(0, 70_000)], [], {"reserved": [placed("ghost", 30_000)]}, None),
    ("two GPUs needed: a holder on each goes",
     [room(0, 1_000, ("a/x", 70_000)), room(1, 1_000, ("a/y", 70_000)), room(2, 1_000)],
     pods(("a/x", LOW), ("a/y", LOW)), {"need": Need(60 * GIB, 2)}, ("uid-x", "uid-y")),
    ("the scheduler's named victims stay (its own filters need them), GPU victims added",
     [room(0, 10_000, ("a/x", 70_000))], pods(("a/x", LOW), ("a/cpu", LOW)),
     {"named": ["uid-cpu"]}, ("uid-cpu", "uid-x")),
    ("a named victim that is not a lower-priority pod on the node: dropped",
     [room(0, 70_000)], pods(("a/x", 2000)), {"named": ["uid-x"]}, None),
    ("a named victim not on the node at all: dropped",
     [room(0, 70_000)], [], {"named": ["uid-gone"]}, None),
    ("a holder no longer bound to the node (an earlier victim, not read since): its GPU is on "
     "its way, nobody else goes",
     [room(0, 2_000, ("a/gone", 75_000)), room(1, 1_000, ("a/x", 80_000))], pods(("a/x", LOW)),
     {}, ()),
    ("a holder no longer bound frees a GPU of two: one more victim, not two",
     [room(0, 2_000, ("a/gone", 75_000)), room(1, 1_000, ("a/x", 80_000)),
      room(2, 1_000, ("a/y", 80_000))], pods(("a/x", LOW), ("a/y", LOW)),
     {"need": Need(60 * GIB, 2)}, ("uid-y",)),
    # the fewest victims (issue 48): the reprieve kube-scheduler uses would spare the
    # priority-500 holder first and evict both priority-100 pods sharing GPU 0
    ("one pod of priority 500 goes rather than two of priority 100",
     [room(0, 10_000, ("a/lo1", 35_000), ("a/lo2", 35_000)), room(1, 1_000, ("a/mid", 79_000))],
     pods(("a/lo1", 100), ("a/lo2", 100), ("a/mid", 500)), {}, ("uid-mid",)),
    ("of two single pods that would do, the lower priority goes",
     [room(0, 1_000, ("a/b", 79_000)), room(1, 1_000, ("a/a", 79_000)),
      room(2, 10_000, ("a/c", 35_000), ("a/d", 35_000))],
     pods(("a/a", 200), ("a/b", 100), ("a/c", 10), ("a/d", 10)), {}, ("uid-b",)),
]


@pytest.mark.parametrize(
    "gpus,on_node,kw,expected", [c[1:] for c in VICTIM_CASES], ids=[c[0] for c in VICTIM_CASES]
)
def test_choose_victims(gpus, on_node, kw, expected):
    # the case's dict is VICTIM_CASES' own: read it, never pop from it (a second run in one
    # process would lose "need")
    need = kw.get("need", NEED)
    rest = {k: v for k, v in kw.items() if k != "need"}
    choice = choose_victims(Preemptor(need, 1000, "uid-preemptor"), gpus, on_node, **rest)
    assert choice.victims == expected, choice.reason
    assert (choice.reason != "") == (expected is None)


def test_the_node_after_eviction_keeps_a_gpu_taken_while_a_holder_stays():
    gpus = [room(0, 70_000, ("a/x", 10_000), ("a/y", None)), room(1, 1_000, ("a/z", 80_000)),
            room(2, 30_000, healthy=False)]  # fmt: skip
    assert [(g.free_mib, g.assigned) for g in node_after(gpus).gpus] == [
        (0, True), (0, True), (30_000, False)]  # fmt: skip
    # x goes, y stays: GPU 0 still taken; z goes: GPU 1 free with z's memory
    after = node_after(gpus, {"a/x", "a/z"})
    assert [(g.free_mib, g.assigned) for g in after.gpus] == [
        (0, True), (81_000, False), (30_000, False)]  # fmt: skip
    assert after.free_total_mib == 81_000  # healthy GPUs only
    # both go: GPU 0 free with x's known memory (y's unknown adds nothing)
    assert node_after(gpus, {"a/x", "a/y"}).gpus[0].free_mib == 80_000


# ----------------------------------------------------------------- pod input ----

POD_CASES = [
    ("priority absent reads 0", pod_doc("a/x", None), PodOnNode("uid-x", "a/x", 0)),
    ("a terminating pod is going", pod_doc("a/x", 5, deletionTimestamp="2025-01-01T00:00:00Z"),
     PodOnNode("uid-x", "a/x", 5, going=True)),
    ("not an object", ["a"], ValueError),
    ("no uid", {"metadata": {"namespace": "a", "name": "x"}}, ValueError),
    ("a priority that is not a whole number", {**pod_doc("a/x"), "spec": {"priority": "high"}},
     ValueError),
    ("a priority that is a boolean", {**pod_doc("a/x"), "spec": {"priority": True}}, ValueError),
]


@pytest.mark.parametrize("doc,expected", [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES])
def test_pod_on_node(doc, expected):
    if expected is ValueError:
        with pytest.raises(ValueError):
            pod_on_node(doc)
    else:
        assert pod_on_node(doc) == expected


# ---------------------------------------------------------------- unresolvable ----

def _state(name: str, gpus: Sequence[Gpu], **kw: Any):
    m = gpu_node(name, gpus, **kw)["metadata"]
    return parse_node(name, m["labels"], m["annotations"], PREFIX)


R = Reason
UNRESOLVABLE_CASES = [
    ("stale", ReasonText(R.STALE, "node(s) had stale GPU telemetry (read 600 s ago)"), True),
    ("unhealthy", ReasonText(R.UNHEALTHY, "node(s) had GPU health Unhealthy (omaticaya.io)"), True),
    ("no telemetry", ReasonText(R.NO_TELEMETRY, "node(s) had no GPU telemetry"), True),
    ("unknown to the cache", ReasonText(R.NOT_IN_CACHE, "node(s) not yet in the cache"), True),
    ("a bad pod annotation", ReasonText(R.BAD_POD, "pod annotation ... is not a memory"), True),
    ("no room on enough healthy GPUs: eviction may help",
     ReasonText(R.NO_ROOM, "node(s) had no room: pod needs a GPU with 61440 MiB free"), False),
    ("room taken by in-flight pods: may free",
     ReasonText(R.IN_FLIGHT, "node(s) had room taken by in-flight pods: ..."), False),
    ("another node chosen: may fit", ReasonText(R.OTHER_NODE, "node(s) fit, another ..."), False),
]  # fmt: skip


@pytest.mark.parametrize(
    "reason,hopeless", [c[1:] for c in UNRESOLVABLE_CASES], ids=[c[0] for c in UNRESOLVABLE_CASES]
)
def test_unresolvable(reason, hopeless):
    one = _state("one", [(1_000, ())])
    got = unresolvable(NEED, {"one": reason}, {"one": one}.get)
    assert got == ({"one": reason} if hopeless else {})


def test_no_room_on_gpus_smaller_than_the_need_is_unresolvable():
    small = _state("small", [(1_000, [("a/x", 39_000)])], total_mib=40_960)
    reason = reason_text(R.NO_ROOM, wanted="pod needs a GPU with 61440 MiB free", prefix=PREFIX)
    assert small.gpus[0].total_mib == 40_960
    assert unresolvable(NEED, {"small": reason}, {"small": small}.get) == {"small": reason}
    assert unresolvable(Need(40_000), {"small": reason}, {"small": small}.get) == {}


def test_no_room_with_too_few_healthy_gpus_is_unresolvable():
    two = _state("two", [(1_000, ()), (1_000, ())], unhealthy=[1])
    reason = reason_text(R.NO_ROOM, wanted="pod needs 2 GPUs with 61440 MiB free", prefix=PREFIX)
    assert unresolvable(Need(60 * GIB, 2), {"two": reason}, {"two": two}.get) == {"two": reason}
    assert unresolvable(Need(60 * GIB, 1), {"two": reason}, {"two": two}.get) == {}
    assert unresolvable(None, {"two": reason}, {"two": two}.get) == {}


# ------------------------------------------------------------------- the verb ----











def test_only_the_pod_whose_gpu_memory_makes_room_goes():
    ext = extender()
    read: list[str] = []
    result = preempt(ext, meta_args(gpu_pod(), fits=[], small=[], shared=[], sick=[]), reader(read))
    # fits: low/b's 80000 MiB on GPU 1 (1000 free) or low/a's 70000 on GPU 0 (10000 free) each
    # make room; a is older, so it is spared; idle holds no GPU memory
    assert kept(result) == {"fits": ["uid-b"]}
    assert result["NodeNameToMetaVictims"]["fits"]["NumPDBViolations"] == 0
    assert read == ["fits", "shared"], "unhealthy and too-small nodes are not read"
    counts = {k[1:]: n for k, n in ext.decisions.counts.items() if k[0] == "preempt"}
    # sick (unhealthy) and small (a 40 GiB GPU) are dropped without reading them
    assert counts == {("kept", ""): 1, ("dropped", "unresolvable"): 2,
                      ("dropped", "too-little"): 1}  # fmt: skip


def test_whole_pods_without_node_cache_get_the_same_answer():
    args = {
        "Pod": gpu_pod(),
        "NodeNameToVictims": {n: {"Pods": [], "NumPDBViolations": 0} for n in NODES},
        "NodeNameToMetaVictims": None,
    }
    assert kept(preempt(extender(), args, reader())) == {"fits": ["uid-b"]}


def test_a_node_where_the_pod_already_fits_is_left_out():
    """A node without victims is an error to kube-scheduler 1.22+ and crashes 1.20's choice."""
    room_now = gpu_node("roomy", [(70_000, ()), (1_000, [("low/a", 80_000)])])
    NODES["roomy"], ON_NODE["roomy"] = room_now, [pod_doc("low/a", node="roomy")]
    try:
        ext = extender()
        assert kept(preempt(ext, meta_args(gpu_pod(), roomy=[]), reader())) == {}
    finally:
        del NODES["roomy"], ON_NODE["roomy"]
    assert ext.decisions.counts[("preempt", "dropped", "fits-already")] == 1


def test_a_pod_without_a_gpu_need_keeps_the_schedulers_choice():
    pod = {"metadata": {"uid": "u", "namespace": "a", "name": "cpu"}, "spec": {"priority": 9}}
    args = meta_args(pod, fits=["uid-a"], small=[])
    assert kept(preempt(extender(), args, reader())) == {"fits": ["uid-a"], "small": []}


def test_a_higher_priority_victim_is_never_chosen():
    assert kept(preempt(extender(), meta_args(gpu_pod(priority=0), fits=[]), reader())) == {}


BAD_ARGS = [
    ("a victim without a UID", {"Pods": [{"uid": "x"}]}),
    ("a victim that is not an object", {"Pods": ["uid-a"]}),
    ("Pods that is not a list", {"Pods": "uid-a"}),
]


@pytest.mark.parametrize("victims", [c[1] for c in BAD_ARGS], ids=[c[0] for c in BAD_ARGS])
def test_bad_victim_entries_drop_that_node_only(victims):
    ext = extender()
    args = {"Pod": gpu_pod(), "NodeNameToMetaVictims": {"small": victims, "fits": {"Pods": []}}}
    assert kept(preempt(ext, args, reader())) == {"fits": ["uid-b"]}
    assert ext.decisions.counts[("preempt", "dropped", "bad-victim")] == 1


def test_bad_pods_on_the_node_are_skipped_and_counted():
    ext = extender()
    bad = {"fits": [{"metadata": {"name": "no-uid"}}, "junk"]}
    assert kept(preempt(ext, meta_args(gpu_pod(), fits=[]), reader(bad=bad))) == {"fits": ["uid-b"]}
    assert ext.decisions.counts[("preempt", "dropped", "bad-pod-on-node")] == 2


def test_a_node_that_cannot_be_read_is_dropped_and_the_others_answered():
    ext = extender()
    read_node = reader()

    def flaky(node: str, deadline: Deadline | None = None) -> Candidate:
        if node == "shared":
            raise OSError("connection refused")
        return read_node(node, deadline)

    result = preempt(ext, meta_args(gpu_pod(), shared=[], gone=[], fits=[]), flaky)
    assert kept(result) == {"fits": ["uid-b"]}
    assert ext.decisions.counts[("preempt", "dropped", "read-failed")] == 1
    assert ext.decisions.counts[("preempt", "dropped", "unresolvable")] == 1  # not in the cache


def test_at_most_max_nodes_are_read():
    read: list[str] = []
    ext = extender()
    preempt(ext, meta_args(gpu_pod(), fits=[], shared=[], sick=[], held=[]), reader(read),
            PreemptOptions(max_nodes=1))  # fmt: skip
    assert read == ["fits"]
    assert ext.decisions.counts[("preempt", "dropped", "over-cap")] == 1


def test_a_bad_pod_annotation_keeps_no_node():
    pod = gpu_pod()
    pod["metadata"]["annotations"][f"{PREFIX}/gpu-memory-mib"] = "lots"
    assert kept(preempt(extender(), meta_args(pod, fits=[]), reader())) == {}


def test_the_filter_names_the_nodes_preemption_cannot_help():
    ext = extender()
    result = ext.filter({"Pod": gpu_pod(), "NodeNames": ["fits", "sick", "nowhere"]})
    assert set(result["FailedNodes"]) == {"fits", "sick", "nowhere"}
    assert set(result["FailedAndUnresolvableNodes"]) == {"sick", "nowhere"}
    assert result["FailedAndUnresolvableNodes"]["sick"] == result["FailedNodes"]["sick"]


def test_http_preempt_answers_with_go_field_names_and_never_a_500():
    ext = extender()

    def broken(args: Any) -> Any:
        raise RuntimeError("boom")

    with TestClient(create_app(ext, preempt=lambda a: preempt(ext, a, reader()))) as c:
        r = c.post("/preempt", content=json.dumps(meta_args(gpu_pod(), fits=[])))
        assert r.status_code == 200
        assert r.json() == {"NodeNameToMetaVictims": {"fits": {"Pods": [{"UID": "uid-b"}],
                                                               "NumPDBViolations": 0}}}  # fmt: skip
        assert c.post("/preempt", content=b"[1]").status_code == 400
    with TestClient(create_app(ext, preempt=broken)) as c:
        r = c.post("/preempt", json=meta_args(gpu_pod(), fits=[]))
        assert (r.status_code, r.json()) == (200, {"NodeNameToMetaVictims": {}})
    with TestClient(create_app(ext)) as c:
        assert c.post("/preempt", json={}).status_code in (404, 405)


def test_a_victims_reservation_in_the_ledger_frees_its_gpu():
    """A pod bound to the node and reserved on GPU 1 by the ledger, not yet in the telemetry:
    evicting it gives GPU 1 back (70000 free less its 30000 reservation: no room without)."""
    from omaticaya_py.scheduler.ledger import Ledger

    NODES["held"] = gpu_node("held", [(1_000, ()), (70_000, ())])
    ON_NODE["held"] = [pod_doc("low/r", node="held"), pod_doc("low/s", node="held")]
    try:
        ext = extender(settle_s=600)
        ext.ledger = Ledger(600)
        ext.ledger.pod_changed("low/r", None, Placement(
            "low/r", "uid-r", "held", 30_000, 1, placed_at=NOW, gpus=(1,), bound=True,
        ))  # fmt: skip
        assert ext.filter({"Pod": gpu_pod(), "NodeNames": ["held"]})["NodeNames"] == []
        assert kept(preempt(ext, meta_args(gpu_pod(), held=[]), reader())) == {"held": ["uid-r"]}
    finally:
        del NODES["held"], ON_NODE["held"]


def test_a_pool_larger_than_the_exact_search_is_trimmed_as_kube_scheduler_trims():
    """Over ``EXACT_POOL`` pods the fewest are not searched (2^n checks): the reprieve spares
    the most important first, so both priority-100 pods on GPU 0 go, not the priority-500 one."""
    filler = [room(2 + i, 1_000, (f"a/f{i}", 10_000)) for i in range(EXACT_POOL)]
    gpus = [room(0, 10_000, ("a/lo1", 35_000), ("a/lo2", 35_000)),
            room(1, 1_000, ("a/mid", 79_000)), *filler]  # fmt: skip
    on_node = pods(("a/lo1", 100), ("a/lo2", 100), ("a/mid", 500),
                   *((f"a/f{i}", 10) for i in range(EXACT_POOL)))  # fmt: skip
    choice = choose_victims(Preemptor(NEED, 1000, "uid-preemptor"), gpus, on_node)
    assert choice.victims == ("uid-lo1", "uid-lo2"), choice.reason
