"""The one fit rule (``scheduler.fit``): its reason codes, and its cache.

- Every ``Reason`` has one text (``TEXTS``) and every text its code; no other module of the
  scheduler writes a reason of its own; the metrics count by code.
- The kept verdicts (``cache.Verdicts`` over ``cache.NodeIndex``: records kept between
  requests, the liveness rule read as a window) are a cache in front of the rule, not a second
  judge: random Nodes (fresh, stale, ahead, unhealthy, without telemetry, judged by a Lease,
  with a policy override), random reservations (reserved, bound, shown, expired; whole GPUs and
  slices) and random pods, judged by the cache and by the rule without it (``fit.judge_each``:
  a record made per request, ``core.rules.liveness.node_liveness`` itself), give the same answer,
  for the filter and for prioritize, before and after the world moves on.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omaticaya_py.core.rules.liveness import LeaseState, Seen
from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.cache import NodeIndex, Verdicts
from omaticaya_py.scheduler.fit import (
    TEXTS,
    JudgingContext,
    Reason,
    ReasonText,
    judge_each,
    reason_text,
)
from omaticaya_py.scheduler.inflight import Placement, pending
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.nodeview import NodeView

SCHEDULER = Path(__file__).resolve().parents[2] / "omaticaya_py" / "scheduler"
NOW = 1_800_000_000.0
UNIT = 1024
FIELDS = {"prefix": "omaticaya.io", "wanted": "pod needs a GPU with 1 MiB free", "why": "x",
          "health": "Unhealthy"}  # fmt: skip


# ------------------------------------------------------------------------- reasons ----


@pytest.mark.parametrize("code", list(Reason))
def test_every_reason_code_has_one_text_that_carries_it(code: Reason) -> None:
    text = reason_text(code, **FIELDS)
    assert isinstance(text, ReasonText) and text.code is code and text.strip()
    assert "{" not in text  # every field the text names is one of the documented ones
    assert str(text) == TEXTS[code].format(**FIELDS)


def test_every_text_has_a_code_and_the_texts_tell_the_codes_apart() -> None:
    assert set(TEXTS) == set(Reason)
    texts = [reason_text(code, **FIELDS) for code in Reason]
    assert len(set(texts)) == len(texts)


def _reason_literals(path: Path) -> list[tuple[int, str]]:
    """String literals of ``path`` that read like a filter reason ("node(s) ...")."""
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.match(r"\s*node\(s\) ", n.value)]  # fmt: skip


def test_no_module_of_the_scheduler_writes_a_reason_of_its_own() -> None:
    """A reason is made from its code in one place (``reasons.TEXTS``): rewording one there cannot
    leave a copy elsewhere that a metric or a test would go on matching."""
    found = {p.name: _reason_literals(p) for p in SCHEDULER.glob("*.py")}
    assert {name: lits for name, lits in found.items() if lits and name != "reasons.py"} == {}
    assert len(found["reasons.py"]) >= len(Reason) - 1  # TEXTS itself (BAD_POD is the pod's own)


def test_the_decisions_count_failures_by_code_whatever_their_text() -> None:
    ext = Extender(ExtenderSettings(_env_file=None), {}.get, clock=lambda: NOW)  # type: ignore[call-arg]
    pod = {"metadata": {"name": "p", "namespace": "ns",
                        "annotations": {"omaticaya.io/gpu-memory-mib": "1024"}}}  # fmt: skip
    ext.filter({"Pod": pod, "NodeNames": ["a", "b"]})
    assert ext.decisions.counts == {("filter", "failed", "not-in-cache"): 2}


# ----------------------------------------------------------- the cache = the rule ----

LEASE = "omaticaya/omaticaya-node-{}"
#: the monotonic clock at the first request: reservations age on it (``records.ages_s``)
MONO = 0.0

#: how a generated node's agent stands: (read age s, expires in s from read, Lease)
AGENTS = {
    "fresh": (5.0, 330.0, None),
    "stale": (600.0, 330.0, None),
    "no expiry, fresh": (100.0, None, None),
    "no expiry, stale": (400.0, None, None),
    "ahead of the clock": (-400.0, 330.0, None),
    "Lease held": (5.0, 330.0, "held"),
    "Lease lapsed": (5.0, 330.0, "lapsed"),
    "Lease released": (5.0, 330.0, "released"),
    "Lease missing": (5.0, 330.0, "missing"),
}

gpus_st = st.lists(st.tuples(st.integers(0, 80) .map(lambda g: g * 1000), st.booleans()),
                   min_size=0, max_size=4)  # fmt: skip
shared_st = st.lists(st.tuples(st.integers(0, 80).map(lambda g: g * 1000),
                               st.one_of(st.none(), st.integers(-2, 80)), st.booleans()),
                     min_size=0, max_size=3)  # fmt: skip

node_st = st.fixed_dictionaries({
    "agent": st.sampled_from(sorted(AGENTS)),
    "kind": st.sampled_from(["ok", "ok", "ok", "unknown", "problem", "no telemetry",
                             "Unhealthy", "Unknown", None, "missing"]),
    "gpus": gpus_st,
    "shared": shared_st,
    "policy": st.sampled_from([None, None, "reject", "allow", "score-zero"]),
    "seen": st.sampled_from([None, (0.0, True), (0.0, False), (-500.0, True)]),
    "lease_seen": st.sampled_from([None, (0.0, True), (-30.0, False), (-90.0, True)]),
})  # fmt: skip

placement_st = st.fixed_dictionaries({
    "node": st.integers(0, 4),
    "mib": st.integers(0, 40).map(lambda g: g * 1000),
    "count": st.integers(1, 2),
    "slices": st.sampled_from([(), (), (4,), (8, 2)]),
    "gpus": st.sampled_from([(), (0,), (1,), (0, 1), (7,)]),
    "bound": st.booleans(),
    "age_s": st.sampled_from([0.0, 10.0, 40.0, 70.0]),
    "started": st.sampled_from([None, -20.0, 20.0]),
    "baseline": st.sampled_from([None, 80000, 160000]),
    "exclusive": st.booleans(),
})  # fmt: skip

need_st = st.one_of(
    st.builds(Need, st.integers(0, 80).map(lambda g: g * 1000), st.integers(1, 3),
              exclusive=st.booleans()),
    st.builds(lambda units: Need(0, 1, slices=units), st.sampled_from([(4,), (40,), (8, 8), (1, 30)])),
    st.just(Need(0, 1, "pod annotation omaticaya.io/gpu-memory-mib='x' is not a memory size")),
)  # fmt: skip

context_st = st.fixed_dictionaries({
    "stale_policy": st.sampled_from([None, "reject", "allow", "score-zero"]),
    "unknown_policy": st.sampled_from([None, "reject", "allow", "score-zero"]),
    "fail_open": st.booleans(),
    "scoring": st.booleans(),
    "leases": st.booleans(),
})  # fmt: skip


def _node(i: int, spec: dict[str, Any]) -> NodeGpuState | None:
    kind = spec["kind"]
    if kind == "missing":
        return None
    name = f"n{i}"
    if kind == "unknown":
        return NodeGpuState(name=name)
    read_age, valid, lease = AGENTS[spec["agent"]]
    gpus = tuple(GpuInfo(k, free, healthy) for k, (free, healthy) in enumerate(spec["gpus"]))
    shared = tuple(GpuInfo(10 + k, free, healthy, units_left=units)
                   for k, (free, units, healthy) in enumerate(spec["shared"]))  # fmt: skip
    seen = Seen(*spec["seen"]) if spec["seen"] is not None else None
    return NodeView(
        name=name, known=True,
        health=kind if kind in ("Unhealthy", "Unknown", None) else "Healthy",
        read_at=None if kind == "no telemetry" else NOW - read_age,
        expires_at=None if valid is None else NOW - read_age + valid,
        gpus=gpus, free_total_mib=sum(g.free_mib for g in gpus if g.healthy),
        problem="bad telemetry" if kind == "problem" else None,
        lease=LEASE.format(i) if lease is not None else None,
        shared=shared, share_unit_mib=UNIT if shared else None,
        free_live_total_mib=sum(g.free_mib for g in gpus if g.healthy),
        policy=spec["policy"], seen=seen,
    )  # fmt: skip


def _lease(spec: dict[str, Any]) -> LeaseState | None:
    lease = AGENTS[spec["agent"]][2]
    if lease in (None, "missing"):
        return None
    renewed = NOW - (200.0 if lease == "lapsed" else 5.0)
    seen = Seen(*spec["lease_seen"]) if spec["lease_seen"] is not None else None
    return LeaseState("" if lease == "released" else "agent", renewed, 40.0, seen)


def _placement(j: int, p: dict[str, Any]) -> Placement:
    started = None if p["started"] is None else NOW + p["started"]
    return Placement(f"ns/p{j}", f"u{j}", f"n{p['node']}", 0 if p["slices"] else p["mib"],
                     0 if p["slices"] else p["count"], placed_at=MONO - p["age_s"],
                     started_at=started, gpus=p["gpus"],
                     bound=p["bound"], slices=p["slices"], exclusive=p["exclusive"])  # fmt: skip


class World:
    """Nodes, their Leases and a ledger, judged with and without the cache."""

    def __init__(self, nodes: list[dict[str, Any]], placements: list[dict[str, Any]]) -> None:
        self.names = [f"n{i}" for i in range(len(nodes))]
        self.states = {f"n{i}": s for i, spec in enumerate(nodes)
                       if (s := _node(i, spec)) is not None}  # fmt: skip
        self.leases = {LEASE.format(i): lease for i, spec in enumerate(nodes)
                       if (lease := _lease(spec)) is not None}  # fmt: skip
        self.ledger = Ledger(settle_s=60, assume_s=30)
        for j, p in enumerate(placements):
            placed = _placement(j, p)
            if placed.bound:
                self.ledger.pod_changed(placed.key, None, placed)
            else:
                self.ledger.reserve(placed)
        self.index = NodeIndex(self.states.get, self.ledger, settle_s=60, ttl_s=300, grace_s=60,
                               skew_s=300)  # fmt: skip
        self.now, self.mono = NOW, MONO

    def ctx(self, spec: dict[str, Any]) -> JudgingContext:
        return JudgingContext(
            self.now, 300, 60, now_mono=self.mono, max_skew_s=300,
            stale_policy=spec["stale_policy"], unknown_policy=spec["unknown_policy"],
            fail_open=spec["fail_open"], scoring=spec["scoring"],
            leases=self.leases.get if spec["leases"] else None,
        )  # fmt: skip

    def uncached(self, need: Need, ctx: JudgingContext) -> Any:
        def inflight(name: str, state: Any) -> Any:
            return pending(self.ledger.on_node(name), state, now=self.mono, settle_s=60,
                           assume_s=30)  # fmt: skip

        return judge_each([(n, self.states.get(n)) for n in self.names], need, ctx, inflight)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(node_st, min_size=1, max_size=5),
       placements=st.lists(placement_st, max_size=6), need=need_st, context=context_st,
       later_s=st.sampled_from([0.0, 1.0, 25.0, 31.0, 61.0, 400.0]),
       more=st.lists(placement_st, max_size=2))  # fmt: skip
def test_the_cache_answers_as_the_rule_does(nodes, placements, need, context, later_s, more):
    w = World(nodes, placements)
    kept = Verdicts(w.index, need)
    assert kept.judge(w.names, w.ctx(context)) == w.uncached(need, w.ctx(context))
    # the world moves on: time passes (windows and reservations end), pods are reserved
    w.now += later_s
    w.mono += later_s
    for j, p in enumerate(more):
        w.ledger.reserve(replace(_placement(100 + j, p), placed_at=w.mono, bound=False))
    assert kept.judge(w.names, w.ctx(context)) == w.uncached(need, w.ctx(context))


def test_a_precondition_added_to_the_rule_holds_on_the_cached_path(monkeypatch):
    """The kept verdicts' fast path (a node fresh by its window) calls the same ``usable`` as
    ``judge``: a precondition added there, as docs/development.md's recipe says, fails a node
    on both paths (before the split, the fast path had its own copy and answered "fits")."""
    from omaticaya_py.scheduler import fit

    spec = {"stale_policy": None, "unknown_policy": None, "fail_open": False, "scoring": False,
            "leases": False}  # fmt: skip
    node = {"agent": "fresh", "kind": "ok", "gpus": [(80000, True)], "shared": [],
            "policy": None, "seen": (0.0, True), "lease_seen": None}  # fmt: skip
    w = World([node], [])
    need = Need(1024, 1)
    kept = Verdicts(w.index, need)
    fits, _, failed = kept.judge(w.names, w.ctx(spec))
    assert fits == {"n0": 80000} and not failed
    refuse = fit.Verdict(False, reason_text(Reason.UNHEALTHY, health="Cordoned", prefix="x"))
    real = fit.usable
    monkeypatch.setattr(fit, "usable", lambda *a, **k: refuse if a[0] is not None else real(*a, **k))
    for judged in (Verdicts(w.index, need).judge(w.names, w.ctx(spec)),
                   w.uncached(need, w.ctx(spec))):  # fmt: skip
        assert judged[0] == {} and judged[2] == {"n0": refuse.reason}
