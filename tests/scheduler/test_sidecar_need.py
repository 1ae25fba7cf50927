"""Sidecar containers hold their devices for the pod's life (issue 37): pure, table-driven.

A sidecar is an init container with ``restartPolicy: Always`` (GA in Kubernetes 1.29). A pod's
need (``need.parse_need``, ``need.parse_slices``) counts it as Kubernetes does
(``need.effective_request``: max(app containers + every sidecar, each plain init container +
the sidecars declared before it)); its slices of shared GPUs are grouped as the kubelet hands
the units out (``need.held_slices``: a sidecar's slice beside the app containers', a plain init
container's reused by the containers after it). Before the fix a pod of a 20-unit sidecar and a
5-unit app container passed the extender as 5 units, and the next 10-unit pod failed kubelet
admission (``UnexpectedAdmissionError``).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product
from typing import Any

import pytest

from omaticaya_py.core.schema import parse_node
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.container_asks import (
    MAX_UNITS,
    Asks,
    container_asks,
    effective_request,
    held_slices,
)
from omaticaya_py.scheduler.ledger import Ledger, placement_from_pod
from omaticaya_py.scheduler.need import Need, parse_need, parse_slices
from tests.helpers import READ_AT, evaluate, gpu, settings, snapshot

NOW = READ_AT.timestamp() + 10
R = "omaticaya.io/gpu-memory"
GPU = "nvidia.com/gpu"
MEM = "omaticaya.io/gpu-memory-mib"


def c(name: str, n: Any, resource: str = R, **extra: Any) -> dict[str, Any]:
    """A container asking for ``n`` of ``resource`` (``None``: for nothing)."""
    limits = {} if n is None else {resource: n}
    return {"name": name, "resources": {"limits": limits}, **extra}


def side(name: str, n: Any, resource: str = R) -> dict[str, Any]:
    """A sidecar: an init container with ``restartPolicy: Always``."""
    return c(name, n, resource, restartPolicy="Always")


def pod(init: list[Any] | Any, app: list[Any], uid: str = "u",
        annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid,
                         "annotations": annotations or {}},
            "spec": {"initContainers": init, "containers": app}}  # fmt: skip


# ------------------------------------------------------------------ slices: the need ----

# (case, initContainers, containers, the pod's slices, its effective request)
SLICE_CASES = [
    ("app containers only", [], [c("a", 20), c("b", 10)], (20, 10), 30),
    ("the issue's pod: a 20-unit sidecar beside a 5-unit app", [side("s", 20)], [c("a", 5)],
     (20, 5), 25),
    ("a sidecar asking as the API writes it (requests, a string)",
     [{"name": "s", "restartPolicy": "Always", "resources": {"requests": {R: "20"}}}],
     [c("a", 5)], (20, 5), 25),
    ("a sidecar alone, the app container asks for none", [side("s", 8)], [c("a", None)], (8,), 8),
    ("several sidecars and two apps", [side("s1", 4), side("s2", 6), side("s3", 0)],
     [c("a", 2), c("b", 3)], (4, 6, 2, 3), 15),
    ("a sidecar, then a plain init bigger than everything: the init's slice beside the sidecar's",
     [side("s", 10), c("i", 30)], [c("a", 5)], (10, 30), 40),
    ("a plain init before a sidecar, bigger than both: the sidecar and app reuse its units",
     [c("i", 30), side("s", 10)], [c("a", 5)], (30,), 30),
    ("a plain init before a sidecar, smaller: the sidecar reuses it and takes more on its GPU",
     [c("i", 8), side("s", 10)], [c("a", 5)], (10, 5), 15),
    ("a plain init smaller than the app: the app reuses it, nothing more",
     [c("i", 5)], [c("a", 10)], (10,), 10),
    ("a plain init of 20 then apps of 10 + 10: both on its GPU, which must hold 20",
     [c("i", 20)], [c("a", 10), c("b", 10)], (20,), 20),
    ("a plain init of 20 then apps of 15 + 10: both on its GPU, 25", [c("i", 20)],
     [c("a", 15), c("b", 10)], (25,), 25),
    ("plain inits around a sidecar, all on the first's GPU",
     [c("i1", 30), side("s", 10), c("i2", 35)], [c("a", 5)], (45,), 45),
    ("a sidecar uses up a plain init's units: the next plain init starts a GPU of its own",
     [c("i1", 10), side("s", 10), c("i2", 10)], [], (10, 10), 20),
    ("a plain init alone", [c("i", 12)], [], (12,), 12),
]  # fmt: skip


@pytest.mark.parametrize(("case", "init", "app", "slices", "total"), SLICE_CASES,
                         ids=[x[0] for x in SLICE_CASES])  # fmt: skip
def test_the_slices_a_pod_holds(case, init, app, slices, total):
    need = parse_need(pod(init, app))
    assert need is not None
    assert replace(need, firsts=(), slice_memory=()) == Need(0, 1, slices=slices), case
    memory = need.slice_memory or need.slices  # never more than held, per slice
    assert all(m <= n for m, n in zip(memory, slices, strict=True)), case
    assert need == parse_slices(pod(init, app))
    # each slice is placed by its first container's units (the plugin places that one)
    firsts = need.firsts or need.slices
    assert len(firsts) == len(slices), case
    assert all(f <= n for f, n in zip(firsts, slices, strict=True)), case
    asks = container_asks(pod(init, app), R)
    assert effective_request(asks.app, asks.init) == total == sum(slices), case


# the restartPolicy values that do not make a sidecar: the kubelet's IsRestartableInitContainer
# is ``== "Always"``; anything else (the API server refuses it) is a plain init container
NOT_ALWAYS = ["OnFailure", "Never", "always", "ALWAYS", " Always", "", None, 1, True, ["Always"],
              {"Always": 1}]  # fmt: skip


@pytest.mark.parametrize("policy", NOT_ALWAYS, ids=[repr(p) for p in NOT_ALWAYS])
def test_a_restart_policy_other_than_always_is_a_plain_init_container(policy):
    """A 20-unit init container then a 5-unit app: a sidecar holds both (25); a plain init's
    units are reused by the app (20)."""
    assert parse_need(pod([side("s", 20)], [c("a", 5)])) == Need(0, 1, slices=(20, 5))
    plain = c("i", 20, restartPolicy=policy)
    # one slice of 20 held, placed by the init's 20; once admitted only the app's 5 count in
    # memory (the plugin's init slice is superseded by the app's)
    assert parse_need(pod([plain], [c("a", 5)])) == Need(0, 1, slices=(20,), slice_memory=(5,))
    assert container_asks(pod([plain], [c("a", 5)]), R) == Asks(((20, False),), (5,))


# --------------------------------------------------------------- whole GPUs: the count ----

# (case, initContainers, containers, the count annotation or None, the need)
WHOLE_CASES = [
    ("app only", [], [c("a", 1, GPU)], None, Need(30000, 1, exclusive=True)),
    ("a 1-GPU sidecar beside a 1-GPU app: 2", [side("s", 1, GPU)], [c("a", 1, GPU)], None,
     Need(30000, 2, exclusive=True)),
    ("a 2-GPU sidecar beside a 1-GPU app, the annotation says 3", [side("s", 2, GPU)],
     [c("a", 1, GPU)], "3", Need(30000, 3, exclusive=True)),
    ("a sidecar only", [side("s", 1, GPU)], [c("a", None)], None, Need(30000, 1, exclusive=True)),
    ("a plain init of 2 then an app of 1: the app reuses one, 2", [c("i", 2, GPU)],
     [c("a", 1, GPU)], None, Need(30000, 2, exclusive=True)),
    ("a sidecar of 1, then a plain init of 2, then an app of 1: 3",
     [side("s", 1, GPU), c("i", 2, GPU)], [c("a", 1, GPU)], None,
     Need(30000, 3, exclusive=True)),
    ("a plain init of 2 before a sidecar of 1, app of 1: 2",
     [c("i", 2, GPU), side("s", 1, GPU)], [c("a", 1, GPU)], None,
     Need(30000, 2, exclusive=True)),
    ("a sidecar of another resource does not count", [side("s", 4, "example.com/fpga")],
     [c("a", 1, GPU)], None, Need(30000, 1, exclusive=True)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "init", "app", "count", "need"), WHOLE_CASES,
                         ids=[x[0] for x in WHOLE_CASES])  # fmt: skip
def test_whole_gpus_count_sidecars(case, init, app, count, need):
    ann = {MEM: "30000", **({"omaticaya.io/gpu-count": count} if count else {})}
    assert parse_need(pod(init, app, annotations=ann)) == need, case


def test_a_count_annotation_that_leaves_the_sidecar_out_is_an_error():
    ann = {MEM: "30000", "omaticaya.io/gpu-count": "1"}
    got = parse_need(pod([side("s", 1, GPU)], [c("a", 1, GPU)], annotations=ann))
    assert got is not None and got.error is not None
    assert "differs from the 2 nvidia.com/gpu" in got.error, got.error


# ------------------------------------------------------- malformed initContainers ----

# (case, initContainers): each asks for nothing; the app's 5 units are the pod's slices
IGNORED: list[tuple[str, Any]] = [
    ("not a list: a string", "s"),
    ("not a list: an object", side("s", 20)),
    ("not a list: null", None),
    ("entries that are not objects", ["s", 3, None, [side("s", 20)], True]),
    ("resources not an object", [{"name": "s", "restartPolicy": "Always", "resources": "20"}]),
    ("limits not an object", [{"name": "s", "restartPolicy": "Always",
                               "resources": {"limits": [R, 20]}}]),
    ("no resources", [{"name": "s", "restartPolicy": "Always"}]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "init"), IGNORED, ids=[x[0] for x in IGNORED])
def test_a_malformed_init_containers_entry_asks_for_nothing(case, init):
    assert parse_need(pod(init, [c("a", 5)])) == Need(0, 1, slices=(5,)), case
    ann = {MEM: "30000"}
    whole = parse_need(pod(init, [c("a", 1, GPU)], annotations=ann))
    assert whole == Need(30000, 1, exclusive=True), case


BAD_VALUES = [-1, "1.5", "500m", "ten", True, [], {}, MAX_UNITS + 1, "1" * 70]


@pytest.mark.parametrize("raw", BAD_VALUES, ids=[repr(r) for r in BAD_VALUES])
@pytest.mark.parametrize("sidecar", [True, False], ids=["sidecar", "plain"])
def test_a_bad_value_in_an_init_container_is_a_clear_error(raw, sidecar):
    init = [side("warm-up", raw) if sidecar else c("warm-up", raw)]
    got = parse_need(pod(init, [c("a", 5)]))
    assert got is not None and got.error is not None and not got.slices
    assert got.error.startswith(f"pod init container 'warm-up' asks for {R}="), got.error
    assert "whole number of units" in got.error
    whole = parse_need(pod([c("warm-up", raw, GPU)], [c("a", 1, GPU)], annotations={MEM: "30000"}))
    assert whole is not None and whole.error is not None
    assert whole.error.startswith(f"pod init container 'warm-up' asks for {GPU}=")
    assert "whole number of GPUs" in whole.error


def test_an_init_container_without_a_name_is_named_by_a_question_mark():
    got = parse_need(pod([{"restartPolicy": "Always", "resources": {"limits": {R: "x"}}}],
                         [c("a", 5)]))  # fmt: skip
    assert got is not None and got.error is not None
    assert got.error.startswith("pod init container '?' asks for"), got.error


def test_a_bad_init_container_is_reported_before_a_bad_app_container():
    """The kubelet's order: init containers first."""
    got = parse_need(pod([c("i", "x")], [c("a", "y")]))
    assert got is not None and got.error is not None and "init container 'i'" in got.error


# ------------------------------------------------------------ the rule, exhaustively ----


def test_the_slices_add_up_to_kubernetes_rule():
    """Every pod of up to 3 init containers (sidecar or plain) and 2 app containers of 1, 2, 3
    or 5 units: the slices the kubelet hands out add up to Kubernetes' effective request, and
    every container's units fit in one slice."""
    sizes = (1, 2, 3, 5)
    kinds = [(n, s) for n in sizes for s in (True, False)]
    for k in range(4):
        for init in product(kinds, repeat=k):
            for m in range(3):
                for app in product(sizes, repeat=m):
                    slices = held_slices(app, init)
                    assert sum(slices) == effective_request(app, init), (init, app, slices)
                    biggest = max([n for n, _ in init] + list(app), default=0)
                    assert max(slices, default=0) >= biggest, (init, app, slices)


def test_effective_request_is_kubernetes_formula():
    # max(apps + all sidecars, max over plain inits of (init + sidecars before it))
    assert effective_request([5], [(20, True)]) == 25
    assert effective_request([5], [(10, True), (30, False)]) == 40
    assert effective_request([5], [(30, False), (10, True)]) == 30
    assert effective_request([5], [(8, False), (10, True)]) == 15
    assert effective_request([], []) == 0


# ----------------------------------------------- the extender: the scenario ----


def shared_node(name: str, free_mib: int) -> Any:
    """A node of one shared GPU with ``free_mib`` free, as the agent renders it."""
    _, desired = evaluate(snapshot(gpu(0, memory_free_mib=free_mib), read_at=READ_AT),
                          settings(shared_gpus="all"))  # fmt: skip
    return parse_node(name, desired.labels, desired.annotations)


def whole_node(name: str, *free_mib: int) -> Any:
    _, desired = evaluate(snapshot(*(gpu(i, memory_free_mib=f) for i, f in enumerate(free_mib)),
                                   read_at=READ_AT), settings())  # fmt: skip
    return parse_node(name, desired.labels, desired.annotations)


def extender(nodes: dict[str, Any]) -> Extender:
    s = ExtenderSettings(_env_file=None)
    return Extender(s, nodes.get, clock=lambda: NOW, monotonic=lambda: 0.0,
                    ledger=Ledger(s.settle_s, s.assume_s))  # fmt: skip


def test_a_sidecar_pods_slice_is_reserved_and_the_next_pod_goes_elsewhere():
    """One shared GPU with 30,000 MiB free (29 units): the sidecar pod (20 + 5) passes and
    reserves 25 units; the next 10-unit pod then fails with the in-flight reason (before the
    fix the sidecar pod reserved 5 and the 10-unit pod passed, then failed kubelet admission)."""
    ext = extender({"n": shared_node("n", 30000)})
    first = ext.filter({"Pod": pod([side("s", 20)], [c("a", 5)], uid="u1"), "NodeNames": ["n"]})
    assert first["NodeNames"] == ["n"], first
    held = ext.ledger.on_node("n")  # type: ignore[union-attr]
    assert [p.slices for p in held] == [(20, 5)]
    second = ext.filter({"Pod": pod([], [c("a", 10)], uid="u2"), "NodeNames": ["n"]})
    assert second["NodeNames"] == [], second
    assert "room taken by in-flight pods" in second["FailedNodes"]["n"]


def test_a_sidecar_pod_that_does_not_fit_fails_the_filter():
    """24 GiB free: a 5-unit app fits, a 20-unit sidecar beside it does not."""
    ext = extender({"n": shared_node("n", 24576)})
    assert ext.filter({"Pod": pod([], [c("a", 5)], uid="u0"), "NodeNames": ["n"]})["NodeNames"]
    out = ext.filter({"Pod": pod([side("s", 20)], [c("a", 5)], uid="u1"), "NodeNames": ["n"]})
    assert out["NodeNames"] == [] and "had no room" in out["FailedNodes"]["n"], out


def test_a_whole_gpu_sidecar_pod_needs_a_gpu_for_each():
    """1-GPU sidecar + 1-GPU app: two whole GPUs; a node of one fails, a node of two passes."""
    nodes = {"one": whole_node("one", 70000), "two": whole_node("two", 70000, 70000)}
    ann = {MEM: "30000"}
    sidecar_pod = pod([side("s", 1, GPU)], [c("a", 1, GPU)], annotations=ann)
    out = extender(nodes).filter({"Pod": sidecar_pod, "NodeNames": ["one", "two"]})
    assert out["NodeNames"] == ["two"], out
    assert "one" in out["FailedNodes"]


def test_a_bound_sidecar_pod_from_the_watch_is_a_placement_of_its_slices():
    doc = pod([side("s", 20)], [c("a", 5)])
    doc["spec"]["nodeName"] = "n"
    p = placement_from_pod(doc, None, now=NOW)
    assert p is not None and p.slices == (20, 5)
