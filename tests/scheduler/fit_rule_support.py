"""The random worlds of the fit rule's cache tests (tests/scheduler/test_fit_rule.py) and of
the bulk path's (tests/scheduler/test_extender_scale_bulk.py): random Nodes (fresh, stale,
ahead, unhealthy, without telemetry, judged by a Lease, with a policy override), random
reservations and random pods, judged with and without the cache."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from omaticaya_py.core.rules.liveness import LeaseState, Seen
from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.cache import NodeIndex
from omaticaya_py.scheduler.fit import JudgingContext, judge_each
from omaticaya_py.scheduler.inflight import Placement, pending
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.nodeview import NodeView

NOW = 1_800_000_000.0
UNIT = 1024
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


def node_of(i: int, spec: dict[str, Any]) -> NodeGpuState | None:
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


def lease_of(spec: dict[str, Any]) -> LeaseState | None:
    lease = AGENTS[spec["agent"]][2]
    if lease in (None, "missing"):
        return None
    renewed = NOW - (200.0 if lease == "lapsed" else 5.0)
    seen = Seen(*spec["lease_seen"]) if spec["lease_seen"] is not None else None
    return LeaseState("" if lease == "released" else "agent", renewed, 40.0, seen)


def placement_of(j: int, p: dict[str, Any]) -> Placement:
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
                       if (s := node_of(i, spec)) is not None}  # fmt: skip
        self.leases = {LEASE.format(i): lease for i, spec in enumerate(nodes)
                       if (lease := lease_of(spec)) is not None}  # fmt: skip
        self.ledger = Ledger(settle_s=60, assume_s=30)
        for j, p in enumerate(placements):
            placed = placement_of(j, p)
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
