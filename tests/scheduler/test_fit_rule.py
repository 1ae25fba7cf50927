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

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.cache import Verdicts
from omaticaya_py.scheduler.fit import (
    TEXTS,
    Reason,
    ReasonText,
    reason_text,
)
from omaticaya_py.scheduler.need import Need
from tests.scheduler.fit_rule_support import (
    NOW,
    World,
    context_st,
    need_st,
    node_st,
    placement_of,
    placement_st,
)

SCHEDULER = Path(__file__).resolve().parents[2] / "omaticaya_py" / "scheduler"
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
        w.ledger.reserve(replace(placement_of(100 + j, p), placed_at=w.mono, bound=False))
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
