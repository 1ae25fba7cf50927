"""Slices enforced by CUDA MPS, the agent's side (issue 39, items 3 and 4), pure.

- a container over its slice on a GPU whose MPS daemon is up is the enforcement's fault:
  ``MpsLimitNotEnforced`` on the pod and on the Node, saying the limit should have held; with
  enforcement off or the daemon not up, ``GpuMemoryOverLimit`` as before
  (``core.allocation.slice_enforcement.judge``, table-tested); both counted in
  ``omaticaya_slice_over_limit{gpu,uuid,enforced,reason}`` and
  ``..._episodes_total{enforced,reason}`` (the multi-process case, issue 47, is
  ``tests/core/allocation/test_slice_over_limit_processes.py``'s);
- the telemetry gives each shared GPU its ``mps`` (``"up"`` or why not), absent for a GPU not
  shared and with enforcement off; a daemon going down rewrites it at once (``UnitMark.mps``);
- ``omaticaya top`` shows it (``mps`` / the reason after ``shared``; ``mps`` and ``enforced``
  in JSON);
- the agent builds its ``MpsWatch`` only with a GPU shared and enforcement ``mps``.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.collectors import SliceOverLimit
from omaticaya_py.agent.events import SliceWatch, mps_enforcement
from omaticaya_py.core.allocation.mps import DaemonState, Layout, state_json
from omaticaya_py.core.allocation.slice_enforcement import (
    NOT_ENFORCED,
    OVER_LIMIT,
    OverLimit,
    judge,
    mps_status,
    over_counts,
)
from omaticaya_py.core.allocation.slice_use import SliceUse
from omaticaya_py.core.model.sharing import Sharing
from omaticaya_py.core.model.snapshot import GpuProcess, NodeSnapshot
from omaticaya_py.core.publish.budget import UnitMark, telemetry_change
from omaticaya_py.core.publish.render_telemetry import (
    TelemetryOptions,
    published_marks,
    telemetry_document,
    telemetry_marks,
)
from omaticaya_py.core.rules.attribution import PodRef
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import Telemetry
from omaticaya_py.kube import KubeForbidden
from omaticaya_py.sources.mps import MpsWatch
from omaticaya_py.views import fleet
from omaticaya_py.views.top import TopOptions, render
from tests.agent.sharing_agent_support import (
    CID_A,
    CID_B,
    CONTAINERS,
    NAMES,
    U0,
    U1,
    UID_A,
    UID_B,
    attributed,
    holder,
)
from tests.helpers import gpu, settings, snapshot

RES = "omaticaya.io/gpu-memory"
A = SliceUse("ml", "infer-a", "server", 20, 20480, 25000)
G0, G1, NO_UUID = gpu(0), gpu(1), gpu(2, uuid=None)

# --- the decision --------------------------------------------------------------------------

JUDGE_CASES = [
    # (id, GPU, enforcement map (None: off), enforced, why, reason)
    ("enforcement-off", G0, None, False, "", OVER_LIMIT),
    ("daemon-up", G0, {U0: "up"}, True, "", NOT_ENFORCED),
    ("daemon-down", G0, {U0: "mps-daemon-down"}, False, "mps-daemon-down", OVER_LIMIT),
    ("state-stale", G0, {U0: "mps-state-stale"}, False, "mps-state-stale", OVER_LIMIT),
    ("another-gpu-up", G0, {U1: "up"}, False, "mps-state-missing", OVER_LIMIT),
    ("empty-reason-is-missing", G0, {U0: ""}, False, "mps-state-missing", OVER_LIMIT),
    ("gpu-without-a-uuid", NO_UUID, {"": "up"}, False, "mps-state-missing", OVER_LIMIT),
]


@pytest.mark.parametrize(
    ("g", "enforcement", "enforced", "why", "reason"),
    [c[1:] for c in JUDGE_CASES], ids=[c[0] for c in JUDGE_CASES],
)
def test_judge(g, enforcement, enforced, why, reason):
    (o,) = judge([(g, A)], enforcement)
    assert (o.enforced, o.why, o.reason) == (enforced, why, reason)
    assert o.key == ("ml", "infer-a", "server", g.uuid or "")


def test_judge_keeps_the_order_and_each_gpu_its_own_enforcement():
    b = SliceUse("ml", "infer-b", "server", 4, 4096, 5000)
    found = judge([(G0, A), (G1, b), (G0, b)], {U0: "up", U1: "mps-daemon-starting"})
    assert [(o.gpu.index, o.slice.pod, o.enforced) for o in found] == [
        (0, "infer-a", True), (1, "infer-b", False), (0, "infer-b", True)]
    assert over_counts(found) == {
        ("0", U0, "true", NOT_ENFORCED): 2, ("1", U1, "false", OVER_LIMIT): 1}
    assert judge([], {U0: "up"}) == [] and over_counts([]) == {}


MESSAGE_CASES = [
    # (id, judged, in the message, not in it)
    (
        "enforced",
        OverLimit(G0, A, True),
        [f"container server holds 25000 MiB on GPU 0 ({U0}), over its slice of 20480 MiB "
         f"(20 units of {RES})", "MPS control daemon is up and should have held it",
         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "check that the container is a client of that daemon",
         "CUDA_MPS_PIPE_DIRECTORY"],
        ["nothing enforces"],
    ),
    (
        "enforcement-off-as-before",
        OverLimit(G0, A, False),
        [f"container server holds 25000 MiB on GPU 0 ({U0}), over its slice of 20480 MiB "
         f"(20 units of {RES}); nothing enforces the slice without an MPS control daemon for "
         "that GPU"],
        ["not up", "should have held"],
    ),
    (
        "daemon-down",
        OverLimit(G0, A, False, "mps-daemon-down"),
        ["nothing enforces the slice without an MPS control daemon for that GPU (its MPS "
         "daemon is not up: mps-daemon-down)"],
        ["should have held"],
    ),
]


@pytest.mark.parametrize(
    ("o", "said", "unsaid"), [c[1:] for c in MESSAGE_CASES], ids=[c[0] for c in MESSAGE_CASES]
)
def test_messages(o, said, unsaid):
    message = o.message(RES)
    for text in said:
        assert text in message, message
    for text in unsaid:
        assert text not in message, message


def test_enforcement_off_keeps_the_message_of_before_word_for_word():
    assert OverLimit(G0, A, False).message(RES) == (
        f"container server holds 25000 MiB on GPU 0 ({U0}), over its slice of 20480 MiB (20 "
        f"units of {RES}); nothing enforces the slice without an MPS control daemon for that GPU"
    )


MPS_STATUS_CASES = [
    # (id, GPU, shared, enforcement, field)
    ("up", G0, True, {U0: "up"}, "up"),
    ("down", G0, True, {U0: "mps-daemon-down"}, "mps-daemon-down"),
    ("not-in-the-map", G0, True, {}, "mps-state-missing"),
    ("not-shared", G0, False, {U0: "up"}, None),
    ("enforcement-off", G0, True, None, None),
    ("no-uuid", NO_UUID, True, {"": "up"}, None),
]


@pytest.mark.parametrize(
    ("g", "shared", "enforcement", "field"),
    [c[1:] for c in MPS_STATUS_CASES], ids=[c[0] for c in MPS_STATUS_CASES],
)
def test_mps_status(g, shared, enforcement, field):
    assert mps_status(g, shared, enforcement) == field


# --- the telemetry ---------------------------------------------------------------------------

SHARING = Sharing(settings(shared_gpus="0").shared_gpus, 1024)
SNAP = snapshot(gpu(0, memory_free_mib=50000), gpu(1))


def _over_att():
    return attributed({U0: [GpuProcess(10, 25000)]}, {10: PodRef(UID_A, CID_A)},
                      [holder("ml", "infer-a", "server", U0, 20)], NAMES, CONTAINERS)  # fmt: skip


TELEMETRY_CASES = [
    # (id, enforcement map, GPU 0's mps, GPU 1's)
    ("up", {U0: "up"}, "up", None),
    ("down", {U0: "mps-daemon-down"}, "mps-daemon-down", None),
    ("missing-from-the-map", {}, "mps-state-missing", None),
    ("enforcement-off", None, None, None),
]


@pytest.mark.parametrize(
    ("enforcement", "g0", "g1"), [c[1:] for c in TELEMETRY_CASES], ids=[c[0] for c in TELEMETRY_CASES]
)
def test_telemetry_says_each_shared_gpus_enforcement(enforcement, g0, g1):
    raw = telemetry_document(
        SNAP, assess(SNAP), TelemetryOptions(attribution=_over_att(), sharing=SHARING, mps=enforcement)
    ).to_json()
    gpus = json.loads(raw)["gpus"]
    assert [g.get("mps") for g in gpus] == [g0, g1]
    assert "mps" not in gpus[1]  # never on a GPU not shared
    doc, problem = Telemetry.parse(raw)
    assert problem is None and [g.mps for g in doc.gpus] == [g0, g1]
    # what the writer compares is what it would read back
    marks = telemetry_marks(SNAP, _over_att(), SHARING, enforcement)
    assert published_marks(doc) == marks and marks[(0, -1)].mps == g0


def test_without_the_map_the_telemetry_is_as_before():
    before = telemetry_document(SNAP, assess(SNAP), TelemetryOptions(attribution=_over_att(), sharing=SHARING))
    assert '"mps"' not in before.to_json()
    assert telemetry_marks(SNAP, _over_att(), SHARING)[(0, -1)].mps is None


def test_the_mps_field_is_read_leniently():
    doc, _ = Telemetry.parse(json.dumps({"gpus": [{"index": 0, "mps": 7}, {"index": 1, "mps": "up"}]}))
    assert [g.mps for g in doc.gpus] == [None, "up"]


CHANGE_CASES = [
    # (id, published mps, now, change)
    ("goes-down", "up", "mps-daemon-down", "worse"),
    ("goes-stale", "up", "mps-state-stale", "worse"),
    ("field-gone", "up", None, "worse"),
    ("comes-up", "mps-daemon-down", "up", "better"),
    ("another-reason", "mps-daemon-starting", "mps-daemon-down", "better"),
    ("first-said", None, "mps-daemon-down", "better"),
    ("stays-up", "up", "up", None),
    ("stays-down", "mps-daemon-down", "mps-daemon-down", None),
]


@pytest.mark.parametrize(
    ("before", "after", "change"), [c[1:] for c in CHANGE_CASES], ids=[c[0] for c in CHANGE_CASES]
)
def test_a_daemon_going_down_rewrites_the_telemetry_at_once(before, after, change):
    published = {(0, -1): UnitMark(50000, mps=before)}
    now = {(0, -1): UnitMark(50000, mps=after)}
    assert telemetry_change(published, now, 256) == change


# --- the Events and the metrics ----------------------------------------------------------------


class _Pods:
    """A ``PodClient`` stand-in that records the Events posted (``refuse``: each is refused)."""

    def __init__(self, refuse: bool = False) -> None:
        self.events: list[dict] = []
        self.refuse = refuse

    def get_pod(self, namespace, name):
        return None

    def create_pod_event(self, **kw):
        if self.refuse:
            raise KubeForbidden("create event: HTTP 403", status=403, verb="create")
        self.events.append(kw)


def _watch(tmp_path: Path, state: str | None, *, now: float = 1000.0) -> MpsWatch:
    """A real ``MpsWatch`` over ``tmp_path``, GPU 0's daemon ``state`` (``None``: no file)."""
    layout = Layout(root=Path("/run/omaticaya/mps"), state_dir=tmp_path / "state")
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    if state is not None:
        layout.state(U0).write_text(state_json(DaemonState(U0, 0, state, heartbeat_s=now)))  # type: ignore[arg-type]
    return MpsWatch(layout, 30.0, wall=lambda: now)


def _two_over():
    procs = {U0: [GpuProcess(10, 25000)], U1: [GpuProcess(11, 25000)]}
    refs = {10: PodRef(UID_A, CID_A), 11: PodRef(UID_B, CID_B)}
    return attributed(procs, refs, [holder("ml", "infer-a", "server", U0, 20),
                                    holder("ml", "infer-b", "server", U1, 20)], NAMES, CONTAINERS)


ROUND_CASES = [
    # (id, GPU 0's daemon state (None: no file; "off": enforcement off), pod Events, Node Events)
    ("daemon-up", "up", [(NOT_ENFORCED, "infer-a"), (OVER_LIMIT, "infer-b")], [NOT_ENFORCED]),
    ("daemon-down", "down", [(OVER_LIMIT, "infer-a"), (OVER_LIMIT, "infer-b")], []),
    ("no-state-file", None, [(OVER_LIMIT, "infer-a"), (OVER_LIMIT, "infer-b")], []),
    ("enforcement-off", "off", [(OVER_LIMIT, "infer-a"), (OVER_LIMIT, "infer-b")], []),
]


@pytest.mark.parametrize(
    ("state", "pod_events", "node_events"), [c[1:] for c in ROUND_CASES], ids=[c[0] for c in ROUND_CASES]
)
def test_slice_watch_tells_the_enforcements_fault_from_the_workloads(
    tmp_path, state, pod_events, node_events
):
    mps = None if state == "off" else _watch(tmp_path, state)
    watch = SliceWatch(settings(shared_gpus="all"), mps=mps)
    pods, on_node = _Pods(), []
    snap, att = snapshot(gpu(0), gpu(1)), _two_over()
    for now in (0.0, 1.0):  # once per episode
        watch.round(pods, snap, att, now, node_event=lambda r, m: on_node.append((r, m)))
    assert [(e["reason"], e["name"]) for e in pods.events] == pod_events
    assert all(e["warning"] for e in pods.events)
    assert [r for r, _ in on_node] == node_events
    if node_events:
        assert on_node[0][1].startswith("pod ml/infer-a: container server holds 25000 MiB on GPU 0")
        assert "should have held" in pods.events[0]["message"]
    enforced = "true" if state == "up" else "false"
    reason = NOT_ENFORCED if state == "up" else OVER_LIMIT
    assert watch.over_now == {("0", U0, enforced, reason): 1, ("1", U1, "false", OVER_LIMIT): 1}
    assert watch.episodes == Counter({(enforced, reason): 1, ("false", OVER_LIMIT): 1}
                                     if enforced == "true" else {("false", OVER_LIMIT): 2})
    assert watch.posted[NOT_ENFORCED] == 2 * (state == "up")  # the pod's and the Node's


def test_the_gauge_empties_when_the_episode_ends_and_failures_are_counted(tmp_path):
    watch = SliceWatch(settings(shared_gpus="0"), mps=_watch(tmp_path, "up"))
    snap = snapshot(gpu(0), gpu(1))

    def refused(reason, message):
        raise KubeForbidden("create event: HTTP 403", status=403, verb="create")

    watch.round(_Pods(), snap, _over_att(), 0.0, node_event=refused)
    assert watch.errors["event-failed"] == 1  # the Node's, not retried: the pod has its Event
    assert watch.episodes == Counter({("true", NOT_ENFORCED): 1})
    assert watch.posted[NOT_ENFORCED] == 1
    under = attributed({U0: [GpuProcess(10, 100)]}, {10: PodRef(UID_A, CID_A)},
                       [holder("ml", "infer-a", "server", U0, 20)], NAMES, CONTAINERS)  # fmt: skip
    watch.round(_Pods(), snap, under, 1.0)
    assert watch.over_now == {}
    refusing = _Pods(refuse=True)
    watch.round(refusing, snap, _over_att(), 2.0)
    assert watch.errors["event-failed"] == 2
    assert watch.episodes == Counter({("true", NOT_ENFORCED): 1})


def test_mps_enforcement_map():
    assert mps_enforcement(None, [U0]) is None


def test_mps_enforcement_map_from_the_state_files(tmp_path):
    watch = _watch(tmp_path, "up")
    assert mps_enforcement(watch, [U0, U1]) == {U0: "up", U1: "mps-state-missing"}
    stale = MpsWatch(watch.layout, 30.0, wall=lambda: 2000.0)
    assert mps_enforcement(stale, [U0]) == {U0: "mps-state-stale"}


def test_the_metrics(tmp_path):
    registry = CollectorRegistry()
    registry.register(SliceOverLimit(
        lambda: {("0", U0, "true", NOT_ENFORCED): 1, ("1", U1, "false", OVER_LIMIT): 2},
        Counter({("true", NOT_ENFORCED): 3, ("false", OVER_LIMIT): 1}),
    ))  # fmt: skip
    text = generate_latest(registry).decode()
    assert (f'omaticaya_slice_over_limit{{enforced="true",gpu="0",reason="{NOT_ENFORCED}",'
            f'uuid="{U0}"}} 1.0') in text
    assert (f'omaticaya_slice_over_limit{{enforced="false",gpu="1",reason="{OVER_LIMIT}",'
            f'uuid="{U1}"}} 2.0') in text
    assert ('omaticaya_slice_over_limit_episodes_total{enforced="true",'
            f'reason="{NOT_ENFORCED}"}} 3.0') in text
    assert ('omaticaya_slice_over_limit_episodes_total{enforced="false",'
            f'reason="{OVER_LIMIT}"}} 1.0') in text
    empty = CollectorRegistry()
    empty.register(SliceOverLimit(dict, {}))
    assert "omaticaya_slice_over_limit{" not in generate_latest(empty).decode()


# --- the agent's wiring ------------------------------------------------------------------------


class _Still:
    def __init__(self, snap: NodeSnapshot) -> None:
        self.snap = snap

    def read(self) -> NodeSnapshot:
        return self.snap

    def close(self) -> None:
        pass


WIRING_CASES = [
    # (id, shared_gpus, share_enforcement, device plugin, an MpsWatch?)
    ("shared-mps", "0", "mps", True, True),
    ("shared-none", "0", "none", True, False),
    ("not-shared", "none", "mps", True, False),
    ("no-device-plugin", "0", "mps", False, False),  # no slice of ours to enforce
]


@pytest.mark.parametrize(
    ("shared", "enforcement", "plugin", "watched"), [c[1:] for c in WIRING_CASES],
    ids=[c[0] for c in WIRING_CASES],
)  # fmt: skip
def test_the_agent_watches_the_daemons_only_with_sharing_and_mps(shared, enforcement, plugin,
                                                                 watched):  # fmt: skip
    s = settings(node_name="n1", shared_gpus=shared, share_enforcement=enforcement,
                 device_plugin=plugin)  # fmt: skip
    agent = Agent(s, _Still(snapshot(gpu(0))), NodeApi(None, lease=None), attribution=None)
    assert (agent.mps is not None) is watched
    assert (agent.writer.mps is not None) is watched
    if agent.slices is not None:
        assert agent.slices.mps is agent.mps


def test_the_agents_telemetry_carries_the_daemons_state(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    s = settings(node_name="n1", shared_gpus="0", share_enforcement="mps", device_plugin=True,
                 mps_root=Path("/run/omaticaya/mps"), mps_state_dir=state_dir)  # fmt: skip
    snap = NodeSnapshot(read_at=datetime.now(UTC), clock_s=0.0, gpus=(gpu(0), gpu(1)))
    agent = Agent(s, _Still(snap), NodeApi(None, lease=None), attribution=None)
    result = agent.tick()
    doc, _ = Telemetry.parse(result.desired.annotations["omaticaya.io/telemetry"])
    assert [g.mps for g in doc.gpus] == ["mps-state-missing", None]
    (state_dir / f"{U0}.json").write_text(state_json(DaemonState(U0, 0, "up", heartbeat_s=time.time())))
    agent.mps._cache.clear()  # type: ignore[union-attr]  # read again now, not in a second
    result = agent.tick()  # coming up is a change for the better: written when the budget allows
    agent.writer.last_patch_s = None
    result = agent.tick()
    doc, _ = Telemetry.parse(result.desired.annotations["omaticaya.io/telemetry"])
    assert [g.mps for g in doc.gpus] == ["up", None]


# --- omaticaya top -----------------------------------------------------------------------------

NOW = 1_800_000_000.0


def _node(*gpus: dict) -> fleet.NodeRow:
    stamp = datetime.fromtimestamp(NOW - 5, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {"schema": 2, "health": "Healthy", "read_at": stamp, "refresh_s": 330,
           "expires_at": datetime.fromtimestamp(NOW + 325, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "gpus": list(gpus)}  # fmt: skip
    labels = {"omaticaya.io/gpu.health": "Healthy", "omaticaya.io/gpu.count": str(len(gpus))}
    return fleet.node_row("n1", labels, {"omaticaya.io/telemetry": json.dumps(doc)}, fleet.RowContext(now=NOW))


def _g(index: int, **extra) -> dict:
    return {"index": index, "uuid": f"GPU-{index:08x}-7fda-b7ae-a94e-630097a14ca4",
            "memory_free_mib": 40960, "memory_total_mib": 81559, "health": "Healthy", **extra}  # fmt: skip


def _text(rows, options: TopOptions) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render(rows, options))
    return out.getvalue()


TOP_CASES = [
    # (id, GPU entry, row's mps, enforced, after "shared" in the GPU table)
    ("up", _g(0, shared=True, share_units=79, mps="up"), "up", True, "Healthy shared mps"),
    ("down", _g(0, shared=True, mps="mps-daemon-down"), "mps-daemon-down", False,
     "Healthy shared mps-daemon-down"),
    ("not-said", _g(0, shared=True), None, False, "Healthy shared"),
    ("not-shared-ignored", _g(0, mps="up"), None, False, "Healthy"),
    ("untrusted-long", _g(0, shared=True, mps="x" * 500), "x" * 40, False, "shared " + "x" * 40),
    ("untrusted-type", _g(0, shared=True, mps=["up"]), None, False, "Healthy shared"),
]


@pytest.mark.parametrize(
    ("entry", "mps", "enforced", "shown"), [c[1:] for c in TOP_CASES], ids=[c[0] for c in TOP_CASES]
)
def test_top_shows_each_shared_gpus_enforcement(entry, mps, enforced, shown):
    row = _node(entry)
    (g,) = row.gpu_rows
    assert (g.mps, g.enforced) == (mps, enforced)
    text = _text([row], TopOptions(gpus=True))
    line = next(line for line in text.splitlines() if line.startswith("n1"))
    assert line.rstrip().endswith(shown), line
    doc = fleet.to_json([row])["nodes"][0]["gpus"][0]
    assert (doc["mps"], doc["enforced"]) == (mps, enforced)


def test_the_wide_node_table_names_a_shared_gpu_not_enforced():
    row = _node(_g(0, shared=True, mps="mps-state-stale"), _g(1, shared=True, mps="up"), _g(2))
    text = _text([row], TopOptions(output="wide"))
    assert "gpu0: mps-state-stale" in text and "gpu1" not in text


def test_unreadable_state_files_are_counted_in_the_agents_metrics(tmp_path):
    """A state file that is not JSON counts the GPU as not enforced and is counted once per
    read in omaticaya_mps_state_errors_total, the agent's /metrics (the watch the device
    plugin shares); without MPS enforcement there is no series."""
    from omaticaya_py.agent.metrics import agent_registry

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    s = settings(node_name="n1", shared_gpus="0", share_enforcement="mps", device_plugin=True,
                 mps_root=Path("/run/omaticaya/mps"), mps_state_dir=state_dir)  # fmt: skip
    snap = NodeSnapshot(read_at=datetime.now(UTC), clock_s=0.0, gpus=(gpu(0),))
    agent = Agent(s, _Still(snap), NodeApi(None, lease=None), attribution=None)
    (state_dir / f"{U0}.json").write_text("{not json")
    assert agent.mps is not None and agent.mps.enforcement(U0).reason == "mps-state-unreadable"
    text = generate_latest(agent_registry(agent)).decode()
    assert "omaticaya_mps_state_errors_total 1.0" in text
    off = Agent(settings(node_name="n1", shared_gpus="0", share_enforcement="none"),
                _Still(snap), NodeApi(None, lease=None), attribution=None)  # fmt: skip
    assert "omaticaya_mps_state_errors" not in generate_latest(agent_registry(off)).decode()
