"""A container's total over its slice, told apart by its processes; evictions; MPS daemon
restarts (issue 47, items 2 and 3's Event), pure and with stand-in API clients.

- the decision (``core.allocation.slice_enforcement.over_reason``, table-tested): with the GPU's MPS daemon
  up, several processes each within the slice -> ``SliceOverLimitProcesses`` (MPS's limit is
  per process: the sum is over), one process over alone (or what each holds unknown) ->
  ``MpsLimitNotEnforced``; nothing enforcing -> ``GpuMemoryOverLimit``;
- each slice's processes with their own MiB (``core.allocation.slice_use.gpu_slices``), and the message;
- a daemon restarted (``daemon_generation``, ``daemon_restarted``, table-tested), said once per
  restart per pod holding a slice of its GPU (``SliceWatch``);
- ``OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict``: the pod evicted after its Event, once per pod,
  a refusal retried next round and logged once, a pod without UID skipped and counted;
- the metrics: ``reason`` on ``omaticaya_slice_over_limit``, ``omaticaya_slice_evictions_total``.

The same on the real API server: ``tests/agent/test_slice_over_limit_cluster.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from loguru import logger
from prometheus_client import CollectorRegistry, generate_latest

from omaticaya_py.agent.collectors import SliceOverLimit
from omaticaya_py.agent.events import SliceWatch
from omaticaya_py.core.allocation.mps import DaemonState, Layout, slice_id, state_json
from omaticaya_py.core.allocation.slice_enforcement import (
    DAEMON_RESTARTED,
    NOT_ENFORCED,
    OVER_LIMIT,
    OVER_LIMIT_PROCESSES,
    READ_SLACK_MIB,
    OverLimit,
    daemon_generation,
    daemon_restarted,
    judge,
    over_counts,
    over_reason,
)
from omaticaya_py.core.allocation.slice_use import SliceUse, gpu_slices, over_limit
from omaticaya_py.core.config.settings import SettingsError, load_settings
from omaticaya_py.core.model.sharing import unit_id
from omaticaya_py.core.model.snapshot import GpuProcess
from omaticaya_py.core.rules.attribution import PodIdentity, PodRef
from omaticaya_py.kube import KubeForbidden, KubeNotFound
from omaticaya_py.kube.errors import KubeConflict, KubeTooManyRequests
from omaticaya_py.sources.mps import MpsWatch
from tests.agent.sharing_agent_support import (
    CID_A,
    CID_B,
    CONTAINERS,
    NAMES,
    U0,
    UID_A,
    UID_B,
    attributed,
    holder,
)
from tests.helpers import gpu, settings, snapshot

RES = "omaticaya.io/gpu-memory"
LIMIT = 8192  # an 8-unit slice
G0 = gpu(0)


def _slice(*mib: int | None, used: int | None = None) -> SliceUse:
    """An 8 GiB slice of ``infer-a/server`` whose processes (pids 11, 12, ...) hold ``mib``."""
    procs = tuple((11 + i, m) for i, m in enumerate(mib))
    total = sum(m or 0 for m in mib) if used is None else used
    return SliceUse("ml", "infer-a", "server", 8, LIMIT, total, procs)


# --- the decision ----------------------------------------------------------------------------

REASON_CASES = [
    # (id, the slice, enforced (the GPU's MPS daemon up), reason)
    ("several-within", _slice(6000, 6000), True, OVER_LIMIT_PROCESSES),
    ("several-at-their-cap", _slice(LIMIT, LIMIT, 100), True, OVER_LIMIT_PROCESSES),
    # NVML reads a client at its cap a little over it (its context counted 2 MiB more)
    ("several-within-the-read-slack", _slice(LIMIT + 2, LIMIT + READ_SLACK_MIB), True,
     OVER_LIMIT_PROCESSES),
    ("one-past-the-slack", _slice(6000, LIMIT + READ_SLACK_MIB + 1), True, NOT_ENFORCED),
    ("one-escaped", _slice(25000), True, NOT_ENFORCED),
    ("one-escaped-among-several", _slice(3000, 20000), True, NOT_ENFORCED),
    ("one-at-its-cap-alone", _slice(LIMIT + 2), True, NOT_ENFORCED),  # as before issue 47
    ("a-process-without-memory", _slice(6000, 6000, None), True, NOT_ENFORCED),
    ("no-process-list", SliceUse("ml", "infer-a", "server", 8, LIMIT, 12000), True, NOT_ENFORCED),
    ("several-within-nothing-enforcing", _slice(6000, 6000), False, OVER_LIMIT),
    ("one-escaped-nothing-enforcing", _slice(25000), False, OVER_LIMIT),
]


@pytest.mark.parametrize(
    ("s", "enforced", "reason"), [c[1:] for c in REASON_CASES], ids=[c[0] for c in REASON_CASES]
)
def test_over_reason(s, enforced, reason):
    assert over_reason(s, enforced) == reason
    (o,) = judge([(G0, s)], {U0: "up"} if enforced else {U0: "mps-daemon-down"})
    assert o.reason == reason and o.escaped == (reason == NOT_ENFORCED)
    assert over_counts([o]) == {("0", U0, "true" if reason == NOT_ENFORCED else "false", reason): 1}


def test_a_gpu_without_a_uuid_is_not_enforced_and_counted_under_an_empty_uuid():
    """Fail closed: a GPU NVML gave no UUID for is never taken as enforced (no state can be
    its), and the gauge's ``gpu_uuid`` label is empty for it."""
    g = gpu(0, uuid=None)
    (o,) = judge([(g, _slice(6000, 6000))], {U0: "up", "": "up"})
    assert (o.enforced, o.why, o.reason) == (False, "mps-state-missing", OVER_LIMIT)
    assert over_counts([o]) == {("0", "", "false", OVER_LIMIT): 1}


def test_the_message_names_each_process_the_sum_and_the_slice():
    o = OverLimit(G0, _slice(5000, 4000, 3500), True)
    assert o.message(RES).startswith(
        f"container server holds 12500 MiB on GPU 0 ({U0}) in 3 processes (pid 11: 5000 MiB, "
        f"pid 12: 4000 MiB, pid 13: 3500 MiB), over its slice of 8192 MiB (8 units of {RES}) "
        "in sum; each process is within the slice"
    )
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is per process" in o.message(RES)
    assert "should have held" not in o.message(RES)
    many = OverLimit(G0, _slice(*[600] * 20), True)
    assert "pid 26: 600 MiB, and 4 more)" in many.message(RES) and "pid 27" not in many.message(RES)
    sixteen = OverLimit(G0, _slice(*[600] * 16), True).message(RES)
    assert "pid 26: 600 MiB), over its slice" in sixteen and "more" not in sixteen
    seventeen = OverLimit(G0, _slice(*[600] * 17), True).message(RES)
    assert "pid 26: 600 MiB, and 1 more), over its slice" in seventeen


def test_gpu_slices_give_each_process_its_own_memory():
    procs = (GpuProcess(10, 5000), GpuProcess(12, 4000), GpuProcess(11, None), GpuProcess(30, 9))
    att = attributed(
        {U0: procs},
        {10: PodRef(UID_A, CID_A), 11: PodRef(UID_A, CID_A), 12: PodRef(UID_A, None),
         30: PodRef(UID_B, CID_B)},
        [holder("ml", "infer-a", "server", U0, 8), holder("ml", "infer-b", "server", U0, 1, first=8)],
        NAMES, CONTAINERS,
    )  # fmt: skip
    a, b = gpu_slices(att[U0], U0, 1024, procs)
    # pid 12 is in the pod's own cgroup: counted for its only holder of the GPU
    assert (a.used_mib, a.processes) == (9000, ((10, 5000), (11, None), (12, 4000)))
    assert (b.used_mib, b.processes) == (9, ((30, 9),))
    assert gpu_slices(att[U0], U0, 1024)[0].processes == ()  # not asked for
    unknown = attributed({U0: procs}, {}, [holder("ml", "infer-a", "server", U0, 8)], NAMES,
                         CONTAINERS)  # fmt: skip
    assert gpu_slices(unknown[U0], U0, 1024, procs)[0].processes == ()  # use not known
    assert a == SliceUse("ml", "infer-a", "server", 8, 8192, 9000)  # the processes not compared


def test_over_limit_reads_the_processes_from_the_gpus_reading():
    procs = (GpuProcess(10, 5000), GpuProcess(11, 4000))
    att = attributed({U0: procs}, {10: PodRef(UID_A, CID_A), 11: PodRef(UID_A, CID_A)},
                     [holder("ml", "infer-a", "server", U0, 8)], NAMES, CONTAINERS)  # fmt: skip
    snap = snapshot(gpu(0, processes=procs), gpu(1))
    watch = SliceWatch(settings(shared_gpus="0"))
    ((g, s),) = over_limit(snap, att, watch.sharing)
    assert s.processes == ((10, 5000), (11, 4000))
    (o,) = judge([(g, s)], {U0: "up"})
    assert o.reason == OVER_LIMIT_PROCESSES


# --- the daemon restarted --------------------------------------------------------------------


def _state(pid: int | None, starts: int, state: str = "up") -> DaemonState:
    return DaemonState(U0, 0, state, pid=pid, starts=starts)  # type: ignore[arg-type]


RESTART_CASES = [
    # (id, the state seen last, the state now, restarted)
    ("same-daemon", _state(100, 1), _state(100, 1), False),
    ("same-daemon-gone-down", _state(100, 1), _state(100, 1, "down"), False),
    ("restarted", _state(100, 1), _state(200, 2, "starting"), True),
    ("restarted-and-up", _state(100, 1), _state(200, 2), True),
    ("a-start-that-failed", _state(100, 1, "down"), _state(100, 2, "down"), True),
    ("new-supervisor", _state(100, 3), _state(40, 1), True),
    ("new-supervisor-same-pid", _state(100, 3), _state(100, 1), True),
    ("first-read", None, _state(100, 1), False),
    ("not-read-now", _state(100, 1), None, False),
    ("first-start", _state(None, 0, "down"), _state(100, 1, "starting"), False),
    ("new-supervisor-not-started-yet", _state(100, 3), _state(None, 0, "down"), False),
]


@pytest.mark.parametrize(
    ("seen", "now", "restarted"), [c[1:] for c in RESTART_CASES], ids=[c[0] for c in RESTART_CASES]
)
def test_daemon_restarted(seen, now, restarted):
    assert daemon_restarted(daemon_generation(seen), daemon_generation(now)) is restarted


@pytest.mark.parametrize(
    ("state", "generation"),
    [(None, None), (_state(None, 1), None), (_state(100, 0, "down"), None), (_state(100, 1), (100, 1)),
     (_state(0, 2), (0, 2))],
)  # fmt: skip
def test_daemon_generation_needs_a_pid_and_a_start(state, generation):
    assert daemon_generation(state) == generation


class _Pods:
    """A ``PodClient`` stand-in: records Events and evictions; ``refuse_events``, and
    ``evict_error`` (raised by each eviction while set), make them fail; ``uids`` the pods'."""

    def __init__(self, uids: dict[str, str] | None = None) -> None:
        self.events: list[dict] = []
        self.evicted: list[tuple[str, str, str]] = []
        self.refuse_events = False
        self.evict_error: Exception | None = None
        self.uids = uids if uids is not None else {"infer-a": UID_A, "infer-b": UID_B}

    def get_pod(self, namespace, name):
        return PodIdentity(namespace, name, self.uids.get(name, ""), {})

    def create_pod_event(self, **kw):
        if self.refuse_events:
            raise KubeForbidden("create event: HTTP 403", status=403, verb="create")
        self.events.append(kw)

    def evict_pod(self, namespace, name, uid):
        if self.evict_error is not None:
            raise self.evict_error
        self.evicted.append((namespace, name, uid))

    def reasons(self) -> list[tuple[str, str]]:
        return [(e["reason"], e["name"]) for e in self.events]


def _layout(tmp_path: Path) -> Layout:
    layout = Layout(root=Path("/run/omaticaya/mps"), state_dir=tmp_path / "state")
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    return layout


def _sid(i: int, uuid: str = U0) -> str:
    """The slice ID of ``_holding``'s pod ``i`` (its 8 units of ``uuid`` from ``8 * i``)."""
    return slice_id(",".join(sorted(unit_id(uuid, k) for k in range(8 * i, 8 * i + 8))))


def _daemon(layout: Layout, pid: int, starts: int, sid: str, uuid: str = U0, index: int = 0) -> None:
    """A slice's daemon up, its state as ``omaticaya mps`` writes it."""
    layout.requests_dir.mkdir(parents=True, exist_ok=True)
    layout.slice_state(sid).write_text(state_json(
        DaemonState(uuid, index, "up", pid=pid, starts=starts, heartbeat_s=1000.0, sid=sid)))  # fmt: skip


def _holding(*pods: str):
    """Each of ``pods`` (``infer-a``, ``infer-b``) holding 8 units of GPU 0, within them."""
    uid = {"infer-a": (UID_A, CID_A), "infer-b": (UID_B, CID_B)}
    procs = {U0: [GpuProcess(10 + i, 100) for i, _ in enumerate(pods)]}
    refs = {10 + i: PodRef(*uid[p]) for i, p in enumerate(pods)}
    return attributed(procs, refs, [holder("ml", p, "server", U0, 8, first=8 * i)
                                    for i, p in enumerate(pods)], NAMES, CONTAINERS)  # fmt: skip


def test_a_restart_is_said_once_to_each_pod_holding_its_slice(tmp_path):
    """Each slice has an MPS daemon of its own (``core.allocation.mps``): its restart is said to the pod
    holding that slice, not to the other slices' pods on the same GPU."""
    layout = _layout(tmp_path)
    mps = MpsWatch(layout, 30.0, min_interval_s=0.0, wall=lambda: 1000.0)
    watch = SliceWatch(settings(shared_gpus="all"), mps=mps)
    pods, snap = _Pods(), snapshot(gpu(0), gpu(1))
    _daemon(layout, 100, 1, _sid(0))
    _daemon(layout, 300, 1, _sid(1))  # infer-b's slice's daemon: never restarted
    watch.round(pods, snap, _holding("infer-a", "infer-b"), 0.0)
    assert pods.events == []  # the first state read: nothing to compare it with
    _daemon(layout, 200, 2, _sid(0))
    pods.refuse_events = True
    watch.round(pods, snap, _holding("infer-a", "infer-b"), 1.0)
    assert pods.events == [] and watch.errors["event-failed"] == 1
    pods.refuse_events = False
    watch.round(pods, snap, _holding("infer-a", "infer-b"), 2.0)  # tried again
    assert pods.reasons() == [(DAEMON_RESTARTED, "infer-a")]
    e = pods.events[0]
    assert e["warning"] and e["uid"] == UID_A and e["namespace"] == "ml"
    assert e["message"] == (
        f"the MPS control daemon of the pod's slice {_sid(0)} of GPU 0 ({U0}) was restarted "
        "(pid 200, start 2): the pod's CUDA processes running on that slice lost their MPS "
        "server and must be restarted; new processes reach the restarted daemon"
    )
    for now in (3.0, 4.0):  # once per restart per pod
        watch.round(pods, snap, _holding("infer-a", "infer-b"), now)
    assert len(pods.events) == 1 and watch.posted[DAEMON_RESTARTED] == 1
    # both restarted: said to both; one whose Event fails and that lets its slice go is not
    # tried again
    _daemon(layout, 250, 3, _sid(0))
    _daemon(layout, 350, 2, _sid(1))
    pods.refuse_events = True
    watch.round(pods, snap, _holding("infer-a", "infer-b"), 5.0)
    pods.refuse_events = False
    watch.round(pods, snap, _holding("infer-a"), 6.0)  # infer-b's slice let go
    watch.round(pods, snap, _holding("infer-a", "infer-b"), 7.0)
    assert pods.reasons()[1:] == [(DAEMON_RESTARTED, "infer-a")]


def test_a_restart_while_no_pod_holds_the_slice_is_not_said_to_the_next(tmp_path):
    layout = _layout(tmp_path)
    mps = MpsWatch(layout, 30.0, min_interval_s=0.0, wall=lambda: 1000.0)
    watch = SliceWatch(settings(shared_gpus="0"), mps=mps)
    pods, snap = _Pods(), snapshot(gpu(0), gpu(1))
    idle = attributed({}, {}, [], NAMES, CONTAINERS)
    _daemon(layout, 100, 1, _sid(0))
    watch.round(pods, snap, idle, 0.0)
    _daemon(layout, 200, 2, _sid(0))
    watch.round(pods, snap, idle, 1.0)
    watch.round(pods, snap, _holding("infer-a"), 2.0)
    assert pods.events == []
    # an unreadable state in between is no restart: the next read is compared with the last
    layout.slice_state(_sid(0)).write_text("{not json")
    watch.round(pods, snap, _holding("infer-a"), 3.0)
    _daemon(layout, 200, 2, _sid(0))
    watch.round(pods, snap, _holding("infer-a"), 4.0)
    assert pods.events == []


def test_no_restart_is_watched_without_mps():
    watch = SliceWatch(settings(shared_gpus="0"))
    pods = _Pods()
    watch.round(pods, snapshot(gpu(0), gpu(1)), _holding("infer-a"), 0.0)
    assert pods.events == [] and watch.mps is None


# --- eviction --------------------------------------------------------------------------------


def _over(*pods: str):
    """Each of ``pods`` holding 8 units of GPU 0 with two processes of 6000 MiB each."""
    uid = {"infer-a": (UID_A, CID_A), "infer-b": (UID_B, CID_B)}
    procs, refs = [], {}
    for i, p in enumerate(pods):
        for k in range(2):
            procs.append(GpuProcess(10 + 2 * i + k, 6000))
            refs[10 + 2 * i + k] = PodRef(*uid[p])
    att = attributed({U0: procs}, refs, [holder("ml", p, "server", U0, 8, first=8 * i)
                                         for i, p in enumerate(pods)], NAMES, CONTAINERS)  # fmt: skip
    return snapshot(gpu(0, processes=tuple(procs)), gpu(1)), att


def _evicting(tmp_path: Path, action: str = "evict") -> SliceWatch:
    layout = _layout(tmp_path)
    layout.state(U0).write_text(state_json(  # GPU 0's probe up: its slices are enforced
        DaemonState(U0, 0, "up", pid=100, starts=1, heartbeat_s=1000.0)))  # fmt: skip
    mps = MpsWatch(layout, 30.0, min_interval_s=0.0, wall=lambda: 1000.0)
    return SliceWatch(settings(shared_gpus="0", slice_over_limit_action=action), mps=mps)


def test_the_pod_is_evicted_after_its_event_once(tmp_path):
    watch, pods = _evicting(tmp_path), _Pods()
    snap, att = _over("infer-a")
    watch.round(pods, snap, att, 0.0)
    assert pods.reasons() == [(OVER_LIMIT_PROCESSES, "infer-a")]
    assert pods.events[0]["message"].endswith(
        "; the pod is evicted (OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict; a PodDisruptionBudget "
        "may put it off)"
    )
    assert pods.evicted == [("ml", "infer-a", UID_A)]
    assert watch.over_now == {("0", U0, "false", OVER_LIMIT_PROCESSES): 1}
    assert watch.episodes == Counter({("false", OVER_LIMIT_PROCESSES): 1})
    watch.round(pods, snap, att, 1.0)  # still over while it terminates: not asked again
    assert pods.evicted == [("ml", "infer-a", UID_A)] and watch.evictions == Counter(evicted=1)
    assert watch.posted == Counter({OVER_LIMIT_PROCESSES: 1})  # no Node Event: MPS held


def test_no_eviction_before_the_event_is_posted(tmp_path):
    watch, pods = _evicting(tmp_path), _Pods()
    pods.refuse_events = True
    watch.round(pods, *_over("infer-a"), 0.0)
    assert pods.evicted == [] and watch.evictions == Counter()
    pods.refuse_events = False
    watch.round(pods, *_over("infer-a"), 1.0)
    assert pods.evicted == [("ml", "infer-a", UID_A)]


def test_a_refused_eviction_is_retried_each_round_and_logged_once(tmp_path):
    watch, pods = _evicting(tmp_path), _Pods()
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        pods.evict_error = KubeTooManyRequests("create eviction: HTTP 429", status=429)
        for now in (0.0, 1.0, 2.0):
            watch.round(pods, *_over("infer-a"), now)
        pods.evict_error = KubeForbidden("create eviction: HTTP 403", status=403)
        watch.round(pods, *_over("infer-a"), 3.0)
        pods.evict_error = None
        watch.round(pods, *_over("infer-a"), 4.0)
        watch.round(pods, *_over("infer-a"), 5.0)
    finally:
        logger.remove(sink)
    assert watch.evictions == Counter(blocked=3, failed=1, evicted=1)
    assert pods.evicted == [("ml", "infer-a", UID_A)]
    said = [line for line in lines if "could not evict pod ml/infer-a" in line]
    assert len(said) == 2 and "(blocked:" in said[0] and "(failed:" in said[1]
    assert len(pods.events) == 1


@pytest.mark.parametrize("error", [KubeNotFound("gone", status=404), KubeConflict("uid", status=409)])
def test_a_pod_gone_is_not_asked_again(tmp_path, error):
    watch, pods = _evicting(tmp_path), _Pods()
    pods.evict_error = error
    watch.round(pods, *_over("infer-a"), 0.0)
    watch.round(pods, *_over("infer-a"), 1.0)
    assert watch.evictions == Counter(gone=1)


def test_a_pod_without_a_uid_is_skipped_and_counted_once(tmp_path):
    """The pod as the API last gave it has no UID (untrusted: a forged or broken answer), though
    the tick's attribution named its processes: no eviction without a UID precondition; skipped,
    counted and logged once while it stays over; evicted once a read gives its UID."""
    watch, pods = _evicting(tmp_path), _Pods(uids={})
    snap, att = _over("infer-a")
    for now in (0.0, 1.0, 2.0):
        watch.round(pods, snap, att, now)
    assert watch.names.known[("ml", "infer-a")].uid == ""
    assert pods.evicted == [] and watch.evictions == Counter(skipped=1)
    assert pods.reasons() == [(OVER_LIMIT_PROCESSES, "infer-a")]  # the Event is said anyway
    watch.names.known[("ml", "infer-a")] = PodIdentity("ml", "infer-a", UID_A, {CID_A: "server"})
    watch.round(pods, snap, att, 3.0)
    assert pods.evicted == [("ml", "infer-a", UID_A)]
    assert watch.evictions == Counter(skipped=1, evicted=1)


def test_the_default_action_evicts_nothing(tmp_path):
    watch, pods = _evicting(tmp_path, "event"), _Pods()
    watch.round(pods, *_over("infer-a"), 0.0)
    assert pods.reasons() == [(OVER_LIMIT_PROCESSES, "infer-a")] and pods.evicted == []
    assert "evicted" not in pods.events[0]["message"]
    assert settings().slice_over_limit_action == "event"


def test_the_setting_is_read_and_checked(monkeypatch):
    monkeypatch.setenv("OMATICAYA_SLICE_OVER_LIMIT_ACTION", "evict")
    assert load_settings().slice_over_limit_action == "evict"
    monkeypatch.setenv("OMATICAYA_SLICE_OVER_LIMIT_ACTION", "kill")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert str(err.value).startswith("invalid setting OMATICAYA_SLICE_OVER_LIMIT_ACTION='kill'")


def test_the_metrics():
    registry = CollectorRegistry()
    registry.register(SliceOverLimit(
        lambda: {("0", U0, "false", OVER_LIMIT_PROCESSES): 1},
        Counter({("false", OVER_LIMIT_PROCESSES): 2}),
        Counter(evicted=1, blocked=3),
    ))  # fmt: skip
    text = generate_latest(registry).decode()
    assert (f'omaticaya_slice_over_limit{{enforced="false",gpu="0",reason="{OVER_LIMIT_PROCESSES}",'
            f'uuid="{U0}"}} 1.0') in text
    assert ('omaticaya_slice_over_limit_episodes_total{enforced="false",'
            f'reason="{OVER_LIMIT_PROCESSES}"}} 2.0') in text
    assert 'omaticaya_slice_evictions_total{result="evicted"} 1.0' in text
    assert 'omaticaya_slice_evictions_total{result="blocked"} 3.0' in text
    empty = CollectorRegistry()
    empty.register(SliceOverLimit(dict, {}))
    assert "omaticaya_slice_evictions_total{" not in generate_latest(empty).decode()
