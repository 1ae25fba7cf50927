"""Shared GPUs, the agent's pure side (issue 25, items 4 and 5): labels, the write budget,
slices and their use, telemetry.

- whole-GPU aggregates count whole GPUs only: a shared GPU is no GPU a ``nvidia.com/gpu`` pod can
  get; a node with shared GPUs carries ``gpu.shared.memory.free-mib``, the largest slice one
  healthy shared GPU can take (live free memory, no more than its units not held), rounded
  down with hysteresis, a drop urgent in the write budget and a rise waiting;
- unit device IDs from PodResources (``<UUID>::<k>``) hold their GPU; a container's slice is its
  units x the unit, its use the memory of its own processes; over-use episodes;
- the telemetry marks shared GPUs (``shared``, ``share_units``, ``share_unit_mib``) and each
  slice (``limit_mib``, ``memory_used_mib``, ``over_limit``).
With no GPU shared, everything is as before (the other tests pass unchanged).
"""

from __future__ import annotations

import json

import pytest

from omaticaya_py.core.allocation.slice_use import (
    SliceUse,
    gpu_slices,
    over_limit,
    slice_room_mib,
    stray_unit_ids,
)
from omaticaya_py.core.model.sharing import Sharing, episodes, is_shared, unit_id, unit_ids
from omaticaya_py.core.model.snapshot import GpuProcess
from omaticaya_py.core.publish.budget import safe_part, urgent
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.publish.render_telemetry import TelemetryOptions, telemetry_document
from omaticaya_py.core.rules.attribution import (
    ContainerDevices,
    PodRef,
)
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import Telemetry
from omaticaya_py.kube.pod_client import pod_identity
from tests.agent.sharing_agent_support import (  # the names moved out, for this file's tests
    CID_A,  # noqa: F401
    CID_A2,  # noqa: F401
    CID_B,  # noqa: F401
    CONTAINERS,  # noqa: F401
    NAMES,  # noqa: F401
    RES,  # noqa: F401
    U0,  # noqa: F401
    U1,  # noqa: F401
    UID_A,  # noqa: F401
    UID_B,  # noqa: F401
    attributed,  # noqa: F401
    holder,  # noqa: F401
)
from tests.helpers import gpu, h100_static, prefixed, settings, snapshot

P = "omaticaya.io/"
SHARED = "gpu.shared.memory.free-mib"
UID_C = "2b3a4f6e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def labels(snap, attribution=None, previous=None, **overrides):
    s = settings(per_gpu_labels=False, **overrides)
    return render(snap, assess(snap), s, previous, with_telemetry=False,
                  attribution=attribution).labels  # fmt: skip


FOUR = snapshot(
    gpu(0, memory_free_mib=40000, utilization_pct=50.0, process_count=1),
    gpu(1, memory_free_mib=70000, utilization_pct=1.0),
    gpu(2, memory_free_mib=81079, utilization_pct=2.0),
    gpu(3, memory_free_mib=20000, utilization_pct=30.0, process_count=1),
)
WHOLE_FOUR = {
    **h100_static(4),
    "gpu.health": "Healthy",
    "gpu.memory.free-mib": "80896",
    "gpu.memory.free-total-mib": "210944",  # 211079 down to 1024
    "gpu.utilization-pct": "0",
    "gpu.idle-count": "2",  # GPU 1 and 2
    "gpu.healthy-count": "4",
}

LABEL_CASES = [
    # (id, snapshot, shared_gpus, expected short-name labels, whole)
    ("none-shared", FOUR, "none", WHOLE_FOUR),
    (
        "two-of-four-shared",
        FOUR,
        "0,1",
        {
            **h100_static(4),
            "gpu.health": "Healthy",
            "gpu.memory.free-mib": "80896",  # GPU 2: whole GPUs only
            "gpu.memory.free-total-mib": "100352",  # 81079 + 20000, down
            "gpu.utilization-pct": "0",  # GPU 2's 2 %
            "gpu.idle-count": "1",  # GPU 2 (GPU 1 is idle but shared)
            "gpu.healthy-count": "2",
            SHARED: "69632",  # GPU 1: 70000 free, 79 units free
        },
    ),
    (
        "all-shared",
        FOUR,
        "all",
        {
            **h100_static(4),  # hardware facts count every GPU
            "gpu.health": "Healthy",
            "gpu.memory.free-mib": "0",
            "gpu.memory.free-total-mib": "0",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "0",
            SHARED: "80896",  # GPU 2, 81079 free, capped at 79 units = 80896
        },
    ),
    (
        "shared-gpu-unhealthy",
        snapshot(gpu(0, ecc_uncorrected_volatile=1), gpu(1)),
        "0",
        {
            **h100_static(2),
            "gpu.health": "Degraded",
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "80896",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "1",
            SHARED: "0",  # the only shared GPU is unhealthy: no slice
        },
    ),
    (
        "shared-index-not-on-node",
        FOUR,
        "7",
        WHOLE_FOUR,  # no GPU of this node is shared: no shared label, nothing changes
    ),
]


@pytest.mark.parametrize(
    ("snap", "shared", "expected"), [c[1:] for c in LABEL_CASES], ids=[c[0] for c in LABEL_CASES]
)
def test_labels_with_shared_gpus(snap, shared, expected):
    assert labels(snap, shared_gpus=shared) == prefixed(expected)


def test_no_shared_gpu_renders_exactly_as_before():
    snap = FOUR
    s_default, s_none = settings(), settings(shared_gpus="none")
    for s in (s_default, s_none):
        d = render(snap, assess(snap), s)
        assert "share_unit_mib" not in d.annotations[P + "telemetry"]
        assert '"shared"' not in d.annotations[P + "telemetry"]
    assert render(snap, assess(snap), s_default).labels == render(snap, assess(snap), s_none).labels







ROOM_CASES = [
    # (id, free MiB on GPU 0, units held on GPU 0 by one container, expected label)
    ("nothing-held", 81079, 0, "80896"),
    ("units-cap-the-room", 81079, 70, "9216"),  # 9 units left, though 81 GB are free
    ("memory-caps-the-room", 30000, 20, "29696"),  # 59 units left, 30000 MiB free
    ("every-unit-held", 81079, 79, "0"),
]


@pytest.mark.parametrize(
    ("free", "held", "expected"), [c[1:] for c in ROOM_CASES], ids=[c[0] for c in ROOM_CASES]
)
def test_the_shared_label_is_the_live_room_within_the_units_not_held(free, held, expected):
    snap = snapshot(gpu(0, memory_free_mib=free), gpu(1, memory_free_mib=1000))
    assignments = [holder("ml", "infer-a", "server", U0, held)] if held else []
    att = attributed({}, {}, assignments)
    got = labels(snap, att, shared_gpus="0,1")
    assert got[P + SHARED] == expected


def test_the_shared_label_has_hysteresis_and_drops_at_once():
    def at(free, previous):
        snap = snapshot(gpu(0, memory_free_mib=free))
        prev = {P + SHARED: previous} if previous else None
        return labels(snap, previous=prev, shared_gpus="0")[P + SHARED]

    assert at(20500, None) == "20480"
    assert at(20500, "19456") == "19456"  # just over the edge: held (20 % of a step)
    assert at(20700, "19456") == "20480"  # past the edge by the margin: rises
    assert at(19000, "20480") == "18432"  # a drop goes at once


BUDGET_CASES = [
    # (id, before, after, urgent)
    ("drops", "20480", "19456", True),
    ("rises", "19456", "20480", False),
    ("appears", None, "20480", False),
    ("goes", "20480", None, True),
    ("unreadable", "20480", "x", True),
]


@pytest.mark.parametrize(
    ("before", "after", "expected"), [c[1:] for c in BUDGET_CASES], ids=[c[0] for c in BUDGET_CASES]
)
def test_the_shared_label_in_the_write_budget(before, after, expected):
    key = P + SHARED
    b = {P + "gpu.health": "Healthy", **({key: before} if before else {})}
    a = {P + "gpu.health": "Healthy", **({key: after} if after else {})}
    assert urgent(b, a) is expected
    # while a rise is held, the Node keeps the old (lower) value; a drop goes out
    assert safe_part(b, a).get(key) == (after if expected else before)


SLICE_CASES = [
    # (id, processes on GPU 0, pod refs, assignments, names?, expected slices on GPU 0)
    (
        "one-slice-under",
        [GpuProcess(10, 10240)],
        {10: PodRef(UID_A, CID_A)},
        [holder("ml", "infer-a", "server", U0, 20)],
        True,
        [SliceUse("ml", "infer-a", "server", 20, 20480, 10240)],
    ),
    (
        "one-slice-over",
        [GpuProcess(10, 25000)],
        {10: PodRef(UID_A, CID_A)},
        [holder("ml", "infer-a", "server", U0, 20)],
        True,
        [SliceUse("ml", "infer-a", "server", 20, 20480, 25000)],
    ),
    (
        "two-pods-own-use-each",
        [GpuProcess(10, 30000), GpuProcess(11, 4000), GpuProcess(12, 1000)],
        {10: PodRef(UID_A, CID_A), 11: PodRef(UID_B, CID_B), 12: None},  # 12: out-of-band
        [holder("ml", "infer-a", "server", U0, 20), holder("ml", "infer-b", "server", U0, 10, first=20)],
        True,
        [SliceUse("ml", "infer-a", "server", 20, 20480, 30000),
         SliceUse("ml", "infer-b", "server", 10, 10240, 4000)],
    ),
    (
        "holder-without-a-process-uses-nothing",
        [],
        {},
        [holder("ml", "infer-a", "server", U0, 4)],
        True,
        [SliceUse("ml", "infer-a", "server", 4, 4096, 0)],
    ),
    (
        "pods-not-named-use-unknown",
        [GpuProcess(10, 30000)],
        {10: PodRef(UID_A, CID_A)},
        [holder("ml", "infer-a", "server", U0, 20)],
        False,
        [SliceUse("ml", "infer-a", "server", 20, 20480, None)],
    ),
    (
        "process-not-placed-use-unknown",
        [GpuProcess(10, 30000)],
        {},  # no host /proc: unknown
        [holder("ml", "infer-a", "server", U0, 20)],
        True,
        [SliceUse("ml", "infer-a", "server", 20, 20480, None)],
    ),
    (
        "container-unnamed-counts-for-the-pods-only-holder",
        [GpuProcess(10, 30000)],
        {10: PodRef(UID_A, "d" * 64)},  # a container ID the API did not list (yet)
        [holder("ml", "infer-a", "server", U0, 20)],
        True,
        [SliceUse("ml", "infer-a", "server", 20, 20480, 30000)],
    ),
    (
        "two-containers-of-one-pod",
        [GpuProcess(10, 3000), GpuProcess(11, 9000)],
        {10: PodRef(UID_A, CID_A), 11: PodRef(UID_A, CID_A2)},
        [holder("ml", "infer-a", "server", U0, 4), holder("ml", "infer-a", "sidecar", U0, 8, first=4)],
        True,
        [SliceUse("ml", "infer-a", "server", 4, 4096, 3000),
         SliceUse("ml", "infer-a", "sidecar", 8, 8192, 9000)],
    ),
    (
        "two-containers-one-unnamed-process",
        [GpuProcess(10, 3000), GpuProcess(11, 9000)],
        {10: PodRef(UID_A, CID_A), 11: PodRef(UID_A, None)},  # in the pod, no container
        [holder("ml", "infer-a", "server", U0, 4), holder("ml", "infer-a", "sidecar", U0, 8, first=4)],
        True,
        [SliceUse("ml", "infer-a", "server", 4, 4096, None),
         SliceUse("ml", "infer-a", "sidecar", 8, 8192, None)],
    ),
    (
        "a-process-of-a-pod-holding-no-slice-hides-nothing",
        [GpuProcess(10, 3000), GpuProcess(13, 5000)],
        {10: PodRef(UID_A, CID_A), 13: PodRef(UID_C, "e" * 64)},  # 13: a pod with no slice
        [holder("ml", "infer-a", "server", U0, 20)],
        True,
        [SliceUse("ml", "infer-a", "server", 20, 20480, 3000)],
    ),
    (
        "holder-not-named-yet",
        [GpuProcess(13, 5000)],
        {13: PodRef(UID_C, "e" * 64)},  # maybe its process: cannot say
        [holder("ml", "infer-c", "server", U0, 2)],
        True,
        [SliceUse("ml", "infer-c", "server", 2, 2048, None)],
    ),
    (
        "units-of-another-gpu-and-repeats",
        [],
        {},
        [ContainerDevices("ml", "infer-a", "server", RES,
                          (unit_id(U0, 0), unit_id(U0, 0), unit_id(U0, 1), unit_id(U1, 0))),
         holder("ml", "infer-b", "server", U1, 3)],
        True,
        [SliceUse("ml", "infer-a", "server", 2, 2048, 0)],
    ),
]


@pytest.mark.parametrize(
    ("procs", "refs", "assignments", "named", "expected"),
    [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES],
)
def test_slices_and_their_use(procs, refs, assignments, named, expected):
    att = attributed({U0: procs}, refs, assignments, NAMES if named else None,
                     CONTAINERS if named else None)  # fmt: skip
    assert list(gpu_slices(att[U0], U0, 1024)) == expected
    assert [s.over for s in gpu_slices(att[U0], U0, 1024)] == [e.over for e in expected]


def test_unit_ids_hold_their_gpu_once_per_container():
    assignments = [holder("ml", "infer-a", "server", U0, 3), holder("ml", "w", "c", U1, 0)]
    att = attributed({}, {}, assignments)
    assert [h.pod for h in att[U0].holders] == ["infer-a"]
    assert att[U1].holders == ()


def test_units_naming_no_gpu_of_the_node_are_stray():
    other = "GPU-ffffffff-0000-0000-0000-000000000000"
    assignments = [
        ContainerDevices("ml", "a", "c", RES, (unit_id(U0, 0), unit_id(other, 3), "GPU-whole")),
        ContainerDevices("ml", "b", "c", RES, (f"{other}::x",)),  # not a unit ID at all
    ]
    assert stray_unit_ids(assignments, [U0, U1]) == [unit_id(other, 3)]
    att = attributed({}, {}, assignments)
    assert [h.pod for h in att[U0].holders] == ["a"] and att[U1].holders == ()


EPISODE_CASES = [
    # (id, reported, over now, starts, still reported)
    ("starts", set(), ["a"], ["a"], set()),
    ("goes-on", {"a"}, ["a"], [], {"a"}),
    ("ends", {"a"}, [], [], set()),
    ("one-ends-another-starts", {"a"}, ["b"], ["b"], set()),
    ("repeats-in-one-tick", set(), ["a", "a"], ["a"], set()),
]


@pytest.mark.parametrize(
    ("reported", "now", "starts", "kept"), [c[1:] for c in EPISODE_CASES],
    ids=[c[0] for c in EPISODE_CASES],
)
def test_over_use_episodes(reported, now, starts, kept):
    assert episodes(frozenset(reported), now) == (starts, frozenset(kept))


def test_over_limit_lists_the_slices_over_on_shared_gpus_only():
    procs = {U0: [GpuProcess(10, 25000)], U1: [GpuProcess(11, 25000)]}
    refs = {10: PodRef(UID_A, CID_A), 11: PodRef(UID_B, CID_B)}
    assignments = [holder("ml", "infer-a", "server", U0, 20), holder("ml", "infer-b", "server", U1, 20)]
    att = attributed(procs, refs, assignments, NAMES, CONTAINERS)
    snap = snapshot(gpu(0), gpu(1))
    found = over_limit(snap, att, Sharing(settings(shared_gpus="0").shared_gpus, 1024))
    assert [(g.index, s.pod) for g, s in found] == [(0, "infer-a")]
    assert over_limit(snap, att, Sharing()) == []


def test_a_gpu_with_mig_on_is_never_shared():
    sharing = Sharing(settings(shared_gpus="all").shared_gpus, 1024)
    assert is_shared(gpu(0), sharing)
    assert not is_shared(gpu(0, mig_enabled=True), sharing)
    assert not is_shared(gpu(0), None) and not is_shared(gpu(0), Sharing())


def test_room_without_a_reading_or_a_total():
    assert slice_room_mib(gpu(0, memory_free_mib=None), None, 1024) is None
    assert slice_room_mib(gpu(0, memory_total_mib=None), None, 1024) == 81079


def test_telemetry_of_shared_gpus_and_their_slices():
    procs = {U0: [GpuProcess(10, 25000), GpuProcess(11, 1000)]}
    refs = {10: PodRef(UID_A, CID_A), 11: PodRef(UID_B, CID_B)}
    assignments = [
        holder("ml", "infer-a", "server", U0, 20),
        holder("ml", "infer-b", "server", U0, 10, first=20),
        ContainerDevices("ml", "train", "t", "nvidia.com/gpu", (U1,)),
    ]
    att = attributed(procs, refs, assignments, NAMES, CONTAINERS)
    snap = snapshot(gpu(0, memory_free_mib=50000), gpu(1))
    sharing = Sharing(settings(shared_gpus="0").shared_gpus, 1024)
    raw = telemetry_document(snap, assess(snap), TelemetryOptions(attribution=att, sharing=sharing)).to_json()
    doc = json.loads(raw)
    g0, g1 = doc["gpus"]
    assert doc["share_unit_mib"] == 1024
    assert (g0["shared"], g0["share_units"]) == (True, 79)
    assert "shared" not in g1 and "share_units" not in g1
    assert g0["pods"] == [
        {"namespace": "ml", "pod": "infer-a", "container": "server", "limit_mib": 20480,
         "memory_used_mib": 25000, "over_limit": True},
        {"namespace": "ml", "pod": "infer-b", "container": "server", "limit_mib": 10240,
         "memory_used_mib": 1000},
    ]
    # a whole GPU's holder, as before: its processes' memory, no slice
    assert g1["pods"] == [{"namespace": "ml", "pod": "train", "container": "t", "memory_used_mib": 0}]
    parsed, problem = Telemetry.parse(raw)
    assert problem is None
    assert [(p.pod, p.limit_mib, p.over_limit) for p in parsed.gpus[0].pods] == [
        ("infer-a", 20480, True), ("infer-b", 10240, None)
    ]


def test_telemetry_reads_over_limit_leniently():
    doc, _ = Telemetry.parse(json.dumps({"gpus": [{"index": 0, "pods": [
        {"pod": "a", "over_limit": "yes", "limit_mib": "x"}, {"pod": "b", "over_limit": True}]}]}))
    assert [(p.over_limit, p.limit_mib) for p in doc.gpus[0].pods] == [(None, None), (True, None)]


POD_DOCS = [
    # (id, pod document, uid, containers)
    (
        "running",
        {"metadata": {"uid": UID_A}, "status": {"containerStatuses": [
            {"name": "server", "containerID": f"containerd://{CID_A}"},
            {"name": "waiting"},  # not started: no ID
        ], "initContainerStatuses": [{"name": "init", "containerID": f"cri-o://{CID_B}"}]}},
        UID_A,
        {CID_A: "server", CID_B: "init"},
    ),
    ("pending", {"metadata": {"uid": UID_A}, "status": {"phase": "Pending"}}, UID_A, {}),
    (
        "malformed",
        {"metadata": {"uid": 7}, "status": {"containerStatuses": ["x", {"name": 1, "containerID": 2}]}},
        "",
        {},
    ),
    ("not-an-object", [], "", {}),
]


@pytest.mark.parametrize(
    ("doc", "uid", "containers"), [c[1:] for c in POD_DOCS], ids=[c[0] for c in POD_DOCS]
)
def test_pod_identity_from_untrusted_documents(doc, uid, containers):
    found = pod_identity(doc, "ml", "infer-a")
    assert (found.uid, dict(found.containers)) == (uid, containers)


def test_unit_ids_helper_matches_the_device_plugin_form():
    assert unit_ids(U0, 2) == [f"{U0}::0", f"{U0}::1"]


OVER = ("ml", "infer-a", "server")
MARK_CASES = [
    # (id, published over, now over, change)
    ("goes-over", frozenset(), frozenset({OVER}), "worse"),
    ("stays-over", frozenset({OVER}), frozenset({OVER}), None),
    ("back-under", frozenset({OVER}), frozenset(), "better"),
]


@pytest.mark.parametrize(
    ("before", "after", "change"), [c[1:] for c in MARK_CASES], ids=[c[0] for c in MARK_CASES]
)
def test_a_slice_going_over_rewrites_the_telemetry_at_once(before, after, change):
    from omaticaya_py.core.publish.budget import UnitMark, telemetry_change

    holders = frozenset({OVER})
    published = {(0, -1): UnitMark(50000, holders, before)}
    now = {(0, -1): UnitMark(50000, holders, after)}
    assert telemetry_change(published, now, 256) == change


def test_marks_of_shared_gpus_read_back_equal():
    from omaticaya_py.core.publish.render_telemetry import published_marks, telemetry_marks

    procs = {U0: [GpuProcess(10, 25000)]}
    att = attributed(procs, {10: PodRef(UID_A, CID_A)}, [holder("ml", "infer-a", "server", U0, 20)],
                     NAMES, CONTAINERS)  # fmt: skip
    snap = snapshot(gpu(0, memory_free_mib=50000), gpu(1))
    sharing = Sharing(settings(shared_gpus="0").shared_gpus, 1024)
    doc, _ = Telemetry.parse(
        telemetry_document(snap, assess(snap), TelemetryOptions(attribution=att, sharing=sharing)).to_json()
    )
    marks = telemetry_marks(snap, att, sharing)
    assert published_marks(doc) == marks
    assert marks[(0, -1)].over == frozenset({OVER})


class _RefusingPods:
    """A ``PodClient`` stand-in whose every request is refused (RBAC without ``get pods`` and
    ``create events``); the real client is exercised in tests/agent/test_sharing_overlimit.py."""

    def __init__(self) -> None:
        self.calls = 0

    def get_pod(self, namespace, name):
        from omaticaya_py.kube import KubeForbidden

        self.calls += 1
        raise KubeForbidden(f"get pod {namespace}/{name}: HTTP 403", status=403, verb="get")

    def create_pod_event(self, **kw):
        from omaticaya_py.kube import KubeForbidden

        self.calls += 1
        raise KubeForbidden("create event: HTTP 403", status=403, verb="create")


def test_refused_pod_reads_and_events_are_counted_and_retried():
    from omaticaya_py.agent.events import SliceWatch

    watch = SliceWatch(settings(shared_gpus="0"))
    procs = {U0: [GpuProcess(10, 25000)]}
    assignments = [holder("ml", "infer-a", "server", U0, 20)]
    snap = snapshot(gpu(0), gpu(1))
    pods = _RefusingPods()
    unnamed = attributed(procs, {10: PodRef(UID_A, CID_A)}, assignments)
    watch.round(pods, snap, unnamed, 0.0)
    watch.round(pods, snap, unnamed, 1.0)  # not asked again within refetch_s (30 s)
    assert watch.errors["get-forbidden"] == 1
    watch.round(pods, snap, unnamed, 31.0)
    assert watch.errors["get-forbidden"] == 2
    named = attributed(procs, {10: PodRef(UID_A, CID_A)}, assignments, NAMES, CONTAINERS)
    watch.round(pods, snap, named, 32.0)
    watch.round(pods, snap, named, 33.0)
    assert watch.errors["event-failed"] == 2  # an Event not posted is tried again
    assert watch.posted["GpuMemoryOverLimit"] == 0


def _names_after_one_read(found=True):
    from omaticaya_py.agent.attribution_reader import PodNames
    from omaticaya_py.core.rules.attribution import PodIdentity

    names = PodNames()
    key = ("ml", "infer-a")
    if found:
        names.asked(key, 0.0, PodIdentity("ml", "infer-a", UID_A, {CID_A: "server"}))
    else:
        names.tried(key, 0.0)
    return names


WANTED_CASES = [
    # (id, read answered?, process on the GPU: (pod UID, container ID), now, wanted?)
    ("quiet", True, (UID_A, CID_A), 1000.0, False),
    ("restarted-container-soon", True, (UID_A, "f" * 64), 10.0, False),
    ("restarted-container", True, (UID_A, "f" * 64), 31.0, True),
    ("stranger-pod-soon", True, (UID_C, "e" * 64), 31.0, False),
    ("stranger-pod", True, (UID_C, "e" * 64), 301.0, True),
    ("read-failed-soon", False, (UID_A, CID_A), 10.0, False),
    ("read-failed", False, (UID_A, CID_A), 31.0, True),
]


@pytest.mark.parametrize(
    ("found", "proc", "now", "wanted"), [c[1:] for c in WANTED_CASES], ids=[c[0] for c in WANTED_CASES]
)
def test_which_slice_pods_are_read_again(found, proc, now, wanted):
    names = _names_after_one_read(found)
    pod_names, containers = names.maps()
    att = attributed({U0: [GpuProcess(10, 100)]}, {10: PodRef(*proc)},
                     [holder("ml", "infer-a", "server", U0, 2)], pod_names, containers)  # fmt: skip
    by_gpu = {U0: (att[U0], gpu_slices(att[U0], U0, 1024))}
    assert names.wanted(by_gpu, now) == ([("ml", "infer-a")] if wanted else [])


def test_a_pod_no_longer_holding_a_slice_is_forgotten():
    names = _names_after_one_read()
    assert names.wanted({}, 1.0) == [] and names.known == {} and names.maps() == ({}, {})
    att = attributed({}, {}, [holder("ml", "infer-a", "server", U0, 2)])
    assert names.wanted({U0: (att[U0], gpu_slices(att[U0], U0, 1024))}, 2.0) == [("ml", "infer-a")]
