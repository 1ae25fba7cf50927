"""The extender at fleet scale (issue 51 item 3): what makes a request over thousands of names
cheap must not change one answer.

- ``cache.Verdicts`` judges the fresh, unreserved nodes of a large request in bulk (columns of
  ``nodeview.Facts``, made when the Node cache stores a Node): random worlds (the generators of
  ``test_fit_rule``: fresh, stale, ahead, unhealthy, Lease-judged nodes, reservations of every
  kind) judged with the bulk path forced on every request give ``fit.judge_each``'s answer,
  fitting nodes in the order asked, before and after the world moves on.
- The bulk path skips ``fit.usable`` for the nodes it takes: on every such node ``usable``
  finds nothing, for every request context.
- A first request over every name of a large cache makes no record per node.
- ``fit.scores`` finds the steps of its sums by bisection: the same sums as the float formula
  per node, in every case drawn and on every integer of small ranges.
- The filter's best node is picked in C when no link ranks the nodes: the first asked of the
  equals, as the key over every node picked it.
"""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import repeat
from operator import add, mul, sub, truediv
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler import Extender, ExtenderSettings, cache, fit
from omaticaya_py.scheduler.cache import Verdicts
from omaticaya_py.scheduler.fit import JudgingContext, judge_each, scores
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.nodeview import FREE_SLOTS, NodeView, with_policy
from omaticaya_py.scheduler.records import build_record, fresh_window
from tests.scheduler.fit_rule_support import (
    NOW,
    World,
    context_st,
    need_st,
    node_st,
    placement_of,
    placement_st,
)

# the bulk path's own needs (GPU memory on a few GPUs), more often than need_st draws them
bulk_need_st = st.one_of(
    need_st,
    st.builds(Need, st.integers(1, 80).map(lambda g: g * 1000), st.integers(1, FREE_SLOTS + 1)),
)


def _same(got: Any, want: Any) -> None:
    """The same verdicts; fitting nodes and unscored passes in the same order."""
    assert got == want
    assert list(got[0].items()) == list(want[0].items())
    assert got[1] == want[1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(node_st, min_size=1, max_size=12),
       placements=st.lists(placement_st, max_size=6), need=bulk_need_st, context=context_st,
       later_s=st.sampled_from([0.0, 1.0, 25.0, 31.0, 61.0, 400.0]),
       more=st.lists(placement_st, max_size=2))  # fmt: skip
def test_the_bulk_path_answers_as_the_rule_does(nodes, placements, need, context, later_s, more):
    w = World(nodes, placements)
    # nodes made as the Node cache makes them (with_policy), and as tests make them
    w.states = {n: with_policy(s, {}, "omaticaya.io", getattr(s, "seen", None)) if i % 2 else s
                for i, (n, s) in enumerate(w.states.items())}  # fmt: skip
    w.index.lookup = w.states.get
    with mock.patch.object(cache, "BULK_MIN", 0):
        kept = Verdicts(w.index, need)
        _same(kept.judge(w.names, w.ctx(context)), w.uncached(need, w.ctx(context)))
        w.now += later_s
        w.mono += later_s
        for j, p in enumerate(more):
            w.ledger.reserve(replace(placement_of(100 + j, p), placed_at=w.mono, bound=False))
        _same(kept.judge(w.names, w.ctx(context)), w.uncached(need, w.ctx(context)))
        # a Node changed: a new object in the cache, judged again
        first = w.names[0]
        if w.states.get(first) is not None:
            w.states[first] = replace(w.states[first])
        _same(kept.judge(w.names, w.ctx(context)), w.uncached(need, w.ctx(context)))


@settings(max_examples=300, deadline=None)
@given(nodes=st.lists(node_st, min_size=1, max_size=5), need=bulk_need_st, context=context_st)
def test_usable_finds_nothing_on_a_node_the_bulk_path_takes(nodes, need, context):
    """The bulk path takes a node only when it has ``Facts`` and is fresh by its window (or
    judged by no Lease): ``fit.usable`` on its fast path then has nothing to say, whatever the
    request's policies. A precondition added to ``usable`` that fails such a node must be
    added to ``nodeview.facts_of`` too, or this test fails."""
    w = World(nodes, [])
    ctx = replace(w.ctx(context), leases=None)
    for name in w.names:
        state = w.states.get(name)
        if state is None or getattr(state, "facts", None) is None:
            continue
        rec = build_record(state, (), w.index._windows, version=0, until=float("inf"))
        if fresh_window(rec, ctx) is None or need.error:
            continue
        assert fit.usable(rec, need, ctx, fresh=True) is None


def _views(n: int, seed: int = 3) -> dict[str, NodeGpuState]:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        gpus = tuple(GpuInfo(k, rng.randrange(0, 81559), rng.random() > 0.05) for k in range(8))
        state = NodeGpuState(
            name=f"node-{i:05d}", known=True, health="Healthy", read_at=NOW - rng.uniform(0, 60),
            expires_at=NOW + 270, gpus=gpus,
            free_total_mib=sum(g.free_mib for g in gpus if g.healthy),
        )  # fmt: skip
        out[state.name] = with_policy(state, {}, "omaticaya.io")
    return out


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_a_large_first_request_makes_no_record_per_node(policy):
    views = _views(3000)
    names = list(views)
    s = ExtenderSettings(_env_file=None, placement_policy=policy)  # type: ignore[call-arg]
    ext = Extender(s, views.get, clock=lambda: NOW, monotonic=lambda: 100.0)
    ext.ledger = Ledger(s.settle_s, s.assume_s)
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                        "annotations": {"omaticaya.io/gpu-memory-mib": "30000",
                                        "omaticaya.io/gpu-count": "2"}}}  # fmt: skip
    got = ext.filter({"Pod": pod, "NodeNames": names})
    narrowing = ext.narrowing()
    assert narrowing is not None
    assert narrowing.index.builds <= 2  # the node reserved on; no record for the others
    need = Need(30000, 2)
    ctx = JudgingContext.of(s, NOW, 100.0)
    fits, _, failed = judge_each([(n, views[n]) for n in names], need, ctx)
    sign = 1 if policy == "binpack" else -1
    best = min(fits, key=lambda n: sign * fits[n])  # the first asked of the equals
    assert got["NodeNames"] == [best]
    assert set(got["FailedNodes"]) == set(names) - {best}
    assert {n: r for n, r in got["FailedNodes"].items() if n in failed} == failed
    # prioritize of the same pod right after: the fitting nodes scored, the chosen one first
    ranked = {h["Host"]: h["Score"] for h in ext.prioritize({"Pod": pod, "NodeNames": names})}
    assert ranked == {**dict.fromkeys(names, 0), **scores(fits, policy), best: 10}


def _float_scores(free: dict[str, int], policy: str) -> dict[str, int]:
    """``fit.scores``' sums as computed per node before the steps (issue 24's formula)."""
    lo, hi = min(free.values()), max(free.values())
    if hi == lo:
        return dict.fromkeys(free, 10)
    frac = map(truediv, map(sub, free.values(), repeat(lo)), repeat(hi - lo))
    if policy == "binpack":
        frac = map(sub, repeat(1.0), frac)
    return dict(zip(free, map(add, repeat(1), map(round, map(mul, frac, repeat(9)))), strict=True))


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_scores_by_steps_are_the_per_node_sums(policy):
    for lo in (0, 7, 81_000):
        for span in range(1, 60):  # every integer of the range: each step's edge included
            free = {f"n{f}": lo + f for f in range(span + 1)}
            assert scores(free, policy) == _float_scores(free, policy)
    rng = random.Random(5)
    for _ in range(400):
        span = rng.choice([1, 9, 18, 81_559, 8 * 81_559, 10**12, 2**53 + 5])
        base = rng.choice([0, 1, 10**9])
        free = {f"n{i}": base + rng.randint(0, span) for i in range(rng.choice([2, 5, 300]))}
        free |= {f"e{j}": base + span * j // 18 for j in range(19)}  # halfway points
        got = scores(free, policy)
        assert got == _float_scores(free, policy) and list(got) == list(free)
    # not whole MiB: computed per node as before
    assert scores({"a": 0.5, "b": 2, "c": 1.25}, policy) == _float_scores(
        {"a": 0.5, "b": 2, "c": 1.25}, policy)  # type: ignore[dict-item]


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_the_best_node_is_the_first_asked_of_equals(policy):
    free = [50_000, 20_000, 70_000, 20_000, 70_000, 50_000] * 10
    views = {}
    for i, mib in enumerate(free):
        state = NodeGpuState(name=f"n{i:02d}", known=True, health="Healthy", read_at=NOW - 5,
                             expires_at=NOW + 300, gpus=(GpuInfo(0, mib, True),),
                             free_total_mib=mib)  # fmt: skip
        views[state.name] = with_policy(state, {}, "omaticaya.io")
    names = list(views)[::-1]
    s = ExtenderSettings(_env_file=None, placement_policy=policy)  # type: ignore[call-arg]
    ext = Extender(s, views.get, clock=lambda: NOW, monotonic=lambda: 1.0)
    ext.ledger = Ledger(s.settle_s, s.assume_s)
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                        "annotations": {"omaticaya.io/gpu-memory-mib": "10000"}}}  # fmt: skip
    got = ext.filter({"Pod": pod, "NodeNames": names})["NodeNames"]
    sign = 1 if policy == "binpack" else -1
    want = min(names, key=lambda n: sign * views[n].free_total_mib)
    assert got == [want] and want == ("n57" if policy == "binpack" else "n58")


def test_facts_are_made_with_the_view_and_not_compared():
    state = NodeGpuState(name="a", known=True, health="Healthy", read_at=NOW, expires_at=NOW + 9,
                         gpus=(GpuInfo(0, 5, True), GpuInfo(1, 9, True), GpuInfo(2, 7, False)),
                         free_total_mib=14)  # fmt: skip
    view = with_policy(state, {}, "omaticaya.io")
    assert view.facts is not None
    assert view.facts.free_desc == (9, 5) + (-1,) * (FREE_SLOTS - 2) and view.facts.healthy == 2
    assert view.facts.valid_s == 9.0 and view.facts.mono_base_s == float("inf")
    assert replace(view) == view and replace(view).facts == view.facts
    assert NodeView(name="b").facts is None  # no telemetry: judged one by one
    assert with_policy(replace(state, expires_at=None), {}, "x").facts is None


@pytest.mark.parametrize("flagged", [{"node-00003": "x", "node-00007": "y", "gone": "z"},
                                     frozenset({"node-00003"}), None])
def test_the_bulk_path_tells_of_problems_as_the_rule_does(flagged):
    """Nodes with a problem on record (``Extender.flagged``) that judge well are told so
    (``on_problem(name, None, "")``), on the bulk path as on the node-by-node one; with no
    record kept (``None``: every name may have one) every node judged is told."""
    views = _views(40)
    names = list(views)

    class Everything:
        def __contains__(self, item: object) -> bool:
            return True

    def told(bulk_min: int) -> list[tuple[str, str | None]]:
        calls: list[tuple[str, str | None]] = []
        index = cache.NodeIndex(views.get, None, settle_s=60, ttl_s=300, grace_s=60, skew_s=300)
        ctx = JudgingContext(NOW, 300, 60, now_mono=1.0, on_problem=lambda n, p, d: calls.append((n, p)))
        with mock.patch.object(cache, "BULK_MIN", bulk_min):
            Verdicts(index, Need(1000, 1)).judge(names, ctx, Everything() if flagged is None else flagged)
        return sorted(calls)

    assert told(0) == told(10**9)
    want = names if flagged is None else sorted(n for n in flagged if n in views)
    assert told(0) == [(n, None) for n in sorted(want)]
