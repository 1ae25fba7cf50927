"""In-flight placements and the staleness policy: the pure rules, table-driven, and the pod
parsing (untrusted input), the extender wiring and its metrics."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.inflight import Placement, adjust, pending
from omaticaya_py.scheduler.ledger import Ledger, PodProblems, placement_from_pod
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.nodeview import node_policy, view_from_object, with_policy
from tests.extender import judge_state

NOW = 1_800_000_000.0
P = "omaticaya.io"


def node(*free: int, read_age_s: float = 5, expires_in_s: float | None = 30, name: str = "n",
         unhealthy: tuple[int, ...] = (), policy: str | None = None) -> NodeGpuState:  # fmt: skip
    gpus = tuple(GpuInfo(i, f, i not in unhealthy) for i, f in enumerate(free))
    read_at = NOW - read_age_s
    state = NodeGpuState(
        name=name, known=True, health="Healthy", read_at=read_at,
        expires_at=None if expires_in_s is None else read_at + expires_in_s,
        gpus=gpus, free_total_mib=sum(g.free_mib for g in gpus if g.healthy),
    )  # fmt: skip
    if policy is None:
        return state
    return with_policy(state, {f"scheduler.{P}/stale-policy": policy}, P)


def placed(mib: int, count: int = 1, *, age_s: float = 1, started_age_s: float | None = None,
           baseline: int | None = None, uid: str = "") -> Placement:  # fmt: skip
    uid = uid or f"uid-{mib}-{count}-{age_s}-{started_age_s}-{baseline}"
    return Placement(
        key=f"ns/{uid}", uid=uid, node="n", memory_mib=mib, count=count,
        placed_at=NOW - age_s,
        started_at=None if started_age_s is None else NOW - started_age_s,
        # a baseline is per GPU (the in-flight rule's drops are judged on each GPU's own
        # reading): the one GPU of ``node``
        gpus=(0,) if baseline is not None else (),
        baselines=(baseline,) if baseline is not None else (),
    )  # fmt: skip


# ----------------------------------------------------------------------------- adjust ----


@pytest.mark.parametrize(
    ("free", "placements", "left"),
    [
        ((70000,), [], (70000,)),
        ((70000,), [placed(30720)], (39280,)),
        ((70000,), [placed(30720), placed(30720, age_s=2)], (8560,)),
        ((70000,), [placed(30720)] * 3, (0,)),  # clamped, never negative
        # GPU by GPU: each pod takes the freest GPU left
        ((70000, 40000), [placed(30720)], (39280, 40000)),
        ((70000, 40000), [placed(30720), placed(30720, age_s=2)], (39280, 9280)),
        # a 2-GPU pod takes from two GPUs
        ((70000, 40000, 10000), [placed(30000, 2)], (40000, 10000, 10000)),
    ],
)
def test_adjust_takes_each_pending_pod_from_the_freest_gpus(free, placements, left):
    out = adjust(node(*free), placements)
    assert tuple(g.free_mib for g in out.gpus) == left
    assert out.free_total_mib == sum(left)


def test_adjust_leaves_unhealthy_gpus_alone():
    out = adjust(node(70000, 80000, unhealthy=(1,)), [placed(30000)])
    assert [(g.free_mib, g.healthy) for g in out.gpus] == [(40000, True), (80000, False)]
    assert out.free_total_mib == 40000


# ---------------------------------------------------------------------------- pending ----


@pytest.mark.parametrize(
    ("case", "state", "placements", "still"),
    [
        ("fresh placement counts", node(70000), [placed(30000)], 1),
        ("past settle_s: dropped", node(70000), [placed(30000, age_s=61)], 0),
        ("not started: counts", node(70000), [placed(30000, baseline=70000)], 1),
        # started 3 s ago, read 5 s ago: the reading predates the pod
        ("read before start", node(40000, read_age_s=5),
         [placed(30000, started_age_s=3, baseline=70000)], 1),
        ("read after start, memory shown", node(40000, read_age_s=1),
         [placed(30000, started_age_s=3, baseline=70000)], 0),
        ("read after start, memory not shown", node(70000, read_age_s=1),
         [placed(30000, started_age_s=3, baseline=70000)], 1),
        ("no baseline (learned after a restart): waits for settle_s", node(40000, read_age_s=1),
         [placed(30000, started_age_s=3)], 1),
        # two pods with the same baseline, only one's memory shows: one still counts
        ("two pods, one shown", node(40000, read_age_s=1),
         [placed(30000, started_age_s=3, baseline=70000, uid="a"),
          placed(30000, started_age_s=2, baseline=70000, uid="b")], 1),
        # the first was in use when the second was reserved (its baseline 40000): the
        # second's own drop shows it, as the device plugin's book (which had let the first go
        # by then) judges it
        ("two pods, the first in use before the second", node(10000, read_age_s=1),
         [placed(30000, started_age_s=3, baseline=70000, uid="a"),
          placed(30000, started_age_s=2, baseline=40000, uid="b")], 0),
        ("two pods, both shown", node(10000, read_age_s=1),
         [placed(30000, started_age_s=3, baseline=70000, uid="a"),
          placed(30000, started_age_s=2, baseline=70000, uid="b")], 0),
        ("no state: everything counts", None, [placed(30000)], 1),
    ],
)  # fmt: skip
def test_pending(case, state, placements, still):
    assert len(pending(placements, state, now=NOW, settle_s=60)) == still, case


def test_pending_leaves_out_the_pod_being_scheduled():
    p = placed(30000, uid="me")
    assert pending([p], node(70000), now=NOW, settle_s=60, exclude_uid="me") == []


# ------------------------------------------------------------------------------ judge ----


NEED = Need(30720)


def _judge(state, **kw) -> Any:
    kw.setdefault("fail_open", False)
    return judge_state(state, NEED, now=NOW, ttl_s=300, grace_s=60, prefix=P, **kw)


def test_in_flight_pods_take_the_room_with_their_own_reason():
    assert _judge(node(70000), inflight=[placed(30720)]).ok
    v = _judge(node(70000), inflight=[placed(30720), placed(30720, age_s=2)])
    assert not v.ok
    assert v.reason.startswith("node(s) had room taken by in-flight pods: pod needs a GPU with")
    v = _judge(node(20000), inflight=[placed(30720)])
    assert v.reason == "node(s) had no room: pod needs a GPU with 30720 MiB free (omaticaya.io)"


def test_the_verdict_carries_the_adjusted_free_memory():
    assert _judge(node(70000, 40000), inflight=[placed(30000)]).free_mib == 80000


STALE = dict(read_age_s=500, expires_in_s=30)


@pytest.mark.parametrize(
    ("case", "state", "kw", "ok", "fits"),
    [
        ("stale, default: reject", node(70000, **STALE), {}, False, False),
        ("stale, reject", node(70000, **STALE), {"stale_policy": "reject"}, False, False),
        ("stale, allow: judged as fresh", node(70000, **STALE), {"stale_policy": "allow"},
         True, True),
        ("stale, allow, no room: fails on room", node(20000, **STALE),
         {"stale_policy": "allow"}, False, False),
        ("stale, score-zero", node(70000, **STALE), {"stale_policy": "score-zero"}, True, False),
        ("stale, fail_open: score-zero", node(70000, **STALE), {"fail_open": True}, True, False),
        ("stale, no expires_at", node(70000, read_age_s=500, expires_in_s=None),
         {"stale_policy": "score-zero"}, True, False),
        ("stale, node says allow", node(70000, **STALE, policy="allow"), {}, True, True),
        ("stale, node says reject over allow", node(70000, **STALE, policy="reject"),
         {"stale_policy": "allow"}, False, False),
        ("unknown, default: reject", NodeGpuState(name="n"), {}, False, False),
        ("unknown, allow", NodeGpuState(name="n"), {"unknown_policy": "allow"}, True, False),
        ("unknown, score-zero", None, {"unknown_policy": "score-zero"}, True, False),
        ("unknown does not follow the stale policy", None, {"stale_policy": "allow"},
         False, False),
        ("fresh ignores the policies", node(70000), {"stale_policy": "reject"}, True, True),
    ],
)  # fmt: skip
def test_staleness_policy(case, state, kw, ok, fits):
    v = _judge(state, **kw)
    assert (v.ok, v.fits) == (ok, fits), (case, v)
    if not ok and state is not None and state.known and state.read_at and "stale" in case:
        assert "stale GPU telemetry" in v.reason or "no room" in v.reason


@pytest.mark.parametrize(
    ("value", "policy"),
    [("allow", "allow"), (" Score-Zero ", "score-zero"), ("reject", "reject"), ("yes", None),
     (7, None), (None, None)],
)  # fmt: skip
def test_node_policy_annotation(value, policy):
    annotations = {} if value is None else {f"scheduler.{P}/stale-policy": value}
    assert node_policy(annotations, P) == policy
    assert node_policy("not a mapping", P) is None


def test_view_from_object_reads_the_override():
    doc = {"metadata": {"name": "x", "annotations": {f"scheduler.{P}/stale-policy": "allow"}}}
    assert view_from_object(doc, P).policy == "allow"


# ------------------------------------------------------------------- pod -> placement ----


def pod(node_name: Any = "n", *, mib: str | None = "30720", uid: Any = "u1", phase: str = "Pending",
        scheduled_at: str | None = "2027-01-15T08:00:00Z", started: str | None = None,
        deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": uid}
    if mib is not None:
        meta["annotations"] = {f"{P}/gpu-memory-mib": mib}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T08:00:05Z"
    status: dict[str, Any] = {"phase": phase}
    if scheduled_at:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at}
        ]
    if started:
        status["startTime"] = started
    return {"metadata": meta, "spec": {"nodeName": node_name}, "status": status}


def _from(doc, previous=None):
    return placement_from_pod(doc, previous, now=NOW)


def test_placement_from_a_bound_pod():
    # the server's clock 90 s behind the extender's (NOW is 2027-01-15T08:00:00Z)
    p = _from(pod(scheduled_at="2027-01-15T07:58:30Z", started="2027-01-15T08:00:02Z"))
    assert (p.key, p.uid, p.node, p.memory_mib, p.count) == ("ns/p", "u1", "n", 30720, 1)
    # its age starts on the extender's clock when it first saw the pod, not at PodScheduled's
    # lastTransitionTime (the server's clock)
    assert p.placed_at == NOW
    assert p.started_at == datetime(2027, 1, 15, 8, 0, 2, tzinfo=timezone.utc).timestamp()
    # its GPUs are not known: no per-GPU baseline, so only the kubelet's books show it
    assert p.gpus == () and p.baselines == ()


def test_placement_keeps_its_first_time():
    first = _from(pod(scheduled_at=None))
    again = _from(pod(scheduled_at=None, started="2027-01-15T08:00:02Z"), first)
    assert again.placed_at == first.placed_at == NOW
    assert again.started_at is not None


@pytest.mark.parametrize(
    "doc",
    [pod(""), pod(None), pod(mib=None), pod(mib="lots"), pod(phase="Failed"),
     pod(phase="Succeeded"), pod(deleting=True)],
)  # fmt: skip
def test_pods_that_hold_no_placement(doc):
    assert _from(doc) is None


@pytest.mark.parametrize("doc", [pod(["n"]), pod(uid=5), pod("x" * 300), "not a pod"])
def test_bad_pods_raise_value_error_to_be_skipped(doc):
    with pytest.raises(ValueError):
        _from(doc)


def test_pod_problems_log_once_and_count():
    problems = PodProblems()
    for _ in range(3):
        problems.skipped("ns/p", ValueError("bad"))
    assert problems.counts == {"skipped: ValueError": 3}


# -------------------------------------------------------------------- the extender ----


def test_extender_counts_bound_pods_in_filter_and_prioritize():
    states = {"a": node(70000, name="a"), "b": node(40000, name="b")}
    ext = Extender(ExtenderSettings(_env_file=None), states.get, clock=lambda: NOW)  # type: ignore[call-arg]
    ext.ledger = Ledger()
    ext.ledger.pod_changed("ns/x", None, Placement("ns/x", "x", "a", 30000, 1, NOW - 1))
    args = {
        "Pod": {"metadata": {"uid": "new", "annotations": {f"{P}/gpu-memory-mib": "30000"}}},
        "NodeNames": ["a", "b"],
    }
    # binpack: a has 40000 left after the bound pod, b 40000: equal scores, the first wins
    assert [h["Score"] for h in ext.prioritize(args)] == [10, 10]
    out = ext.filter(args)
    assert out["NodeNames"] == ["a"] and "another was chosen" in out["FailedNodes"]["b"]
    ext.ledger.pod_changed("ns/y", None, Placement("ns/y", "y", "a", 30000, 1, NOW - 1))
    args["Pod"]["metadata"]["uid"] = "other"
    out = ext.filter(args)
    assert out["NodeNames"] == ["b"]
    assert "in-flight" in out["FailedNodes"]["a"]
    # settle_s 0 turns the accounting (and the narrowing) off
    ext.settings = ExtenderSettings(_env_file=None, settle_s=0)  # type: ignore[call-arg]
    assert ext.filter(args)["NodeNames"] == ["a", "b"]


def test_the_extender_reserves_the_pod_on_the_one_node_it_narrowed_to():
    states = {"a": node(70000, name="a"), "b": node(20000, name="b")}
    ext = Extender(ExtenderSettings(_env_file=None), states.get, clock=lambda: NOW)  # type: ignore[call-arg]
    ext.ledger = ledger = Ledger()
    pod = {"metadata": {"uid": "p1", "namespace": "ns", "name": "p1",
                        "annotations": {f"{P}/gpu-memory-mib": "30000"}}}  # fmt: skip
    assert ext.filter({"Pod": pod, "NodeNames": ["a", "b"]})["NodeNames"] == ["a"]
    assert [p.key for p in ledger.on_node("a")] == ["ns/p1"]
    assert ledger.on_node("b") == ()
    # the next pods of the burst see the first one's need on a
    pod2 = {"metadata": {"uid": "p2", "annotations": {f"{P}/gpu-memory-mib": "30000"}}}
    pod3 = {"metadata": {"uid": "p3", "annotations": {f"{P}/gpu-memory-mib": "30000"}}}
    assert ext.filter({"Pod": pod2, "NodeNames": ["a"]})["NodeNames"] == ["a"]
    out = ext.filter({"Pod": pod3, "NodeNames": ["a"]})
    assert out["NodeNames"] == [] and "in-flight" in out["FailedNodes"]["a"]


class FakePods:
    def __init__(self, values: dict[str, Placement]) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)


def test_metrics_count_in_flight_pods_and_skipped_ones():
    from prometheus_client import generate_latest

    from omaticaya_py.scheduler.app import NodeProblems
    from omaticaya_py.scheduler.metrics import MetricSources, metrics_registry

    class Nodes:
        synced, lists, events, skipped = True, 1, 0, 0

        def __len__(self) -> int:
            return 0

        def health(self) -> tuple[bool, str]:
            return True, "ok"

    pods = FakePods({"ns/x": placed(30000, uid="x")})
    pods.synced, pods.events = True, 4  # type: ignore[attr-defined]
    problems = PodProblems()
    problems.skipped("ns/bad", ValueError("spec.nodeName is not a Node name"))
    text = generate_latest(metrics_registry(MetricSources(Nodes(), NodeProblems(), pods, problems))).decode()
    assert "omaticaya_extender_inflight_pods 1.0" in text
    assert "omaticaya_extender_pod_cache_synced 1.0" in text
    assert 'omaticaya_extender_pods_skipped_total{problem="skipped: ValueError"} 1.0' in text


def test_every_decision_is_counted_in_the_metrics():
    from prometheus_client import generate_latest

    from omaticaya_py.scheduler.app import NodeProblems
    from omaticaya_py.scheduler.metrics import MetricSources, metrics_registry

    states = {"a": node(70000, name="a"), "b": node(20000, name="b"),
              "c": node(70000, name="c", **STALE)}  # fmt: skip
    ext = Extender(ExtenderSettings(_env_file=None), states.get, clock=lambda: NOW)  # type: ignore[call-arg]
    args = {"Pod": {"metadata": {"annotations": {f"{P}/gpu-memory-mib": "30000"}}},
            "NodeNames": ["a", "b", "c"]}  # fmt: skip
    ext.filter(args)
    ext.prioritize(args)
    ext.filter({"Pod": {}, "NodeNames": ["a"]})  # no need: not a decision
    assert ext.decisions.counts == {
        ("filter", "passed", ""): 1,
        ("filter", "failed", "no-room"): 1,
        ("filter", "failed", "stale"): 1,
        ("prioritize", "scored", ""): 1,
        ("prioritize", "zero", ""): 2,
    }

    class Nodes:
        synced, lists, events, skipped = True, 1, 0, 0

        def __len__(self) -> int:
            return 3

        def health(self) -> tuple[bool, str]:
            return True, "ok"

    text = generate_latest(metrics_registry(MetricSources(Nodes(), NodeProblems(), decisions=ext.decisions)))
    assert (
        'omaticaya_extender_decisions_total{reason="stale",result="failed",verb="filter"} 1.0'
        in text.decode()
    )
