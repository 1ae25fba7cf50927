"""Xid health carried over a restart (issue 23, item 6): NVML does not replay old events, so a
new agent seeds its Xid window from the Node's own telemetry (``core.rules.xid_seed``).

The pure seeding is table-tested on telemetry written by the real renderer and on hand-forged
documents; one test runs two agents one after the other on the real kube-apiserver.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.core.model.snapshot import NodeSnapshot, XidEvent
from omaticaya_py.core.publish.render import telemetry
from omaticaya_py.core.rules.health import XidLedger, XidPolicy, assess
from omaticaya_py.core.rules.xid_seed import MAX_AHEAD_S, seed_events
from omaticaya_py.kube import NodeClient
from tests.conftest import node_metadata
from tests.helpers import READ_AT, gpu, lost, settings, snapshot

POLICY = XidPolicy(quiet_s=600.0)
U0, U1 = gpu(0).uuid, gpu(1).uuid


def published(*events: XidEvent, clock_s: float = 1000.0) -> str:
    """The telemetry an agent writes at READ_AT (reader clock ``clock_s``) having seen
    ``events``."""
    snap = snapshot(gpu(0), gpu(1), clock_s=clock_s, xid_events=events)
    return telemetry(snap, assess(snap, events, POLICY))


def restarted(after_s: float, *gpus, clock_s: float = 5.0) -> NodeSnapshot:
    """The new agent's first reading, ``after_s`` later on the wall clock, on a new clock."""
    return snapshot(*(gpus or (gpu(0), gpu(1))), clock_s=clock_s,
                    read_at=READ_AT + timedelta(seconds=after_s))


def forged(gpus: list[dict], **doc) -> str:
    return json.dumps({"schema": 2, "read_at": "2025-03-04T05:06:07Z", "gpus": gpus, **doc})


def entry(uuid: str = U0, reasons=("xid-74",), xids=(("74", "2025-03-04T05:06:00Z"),), **kw):
    out = {"index": 0, "uuid": uuid, "reasons": list(reasons), **kw}
    if xids is not None:
        out["xids"] = [{"xid": int(x), "at": at} for x, at in xids]
    return out


def test_the_telemetry_carries_each_fatal_xid_with_its_time() -> None:
    doc = json.loads(published(XidEvent(0, 74, 990.5, U0), XidEvent(0, 13, 995.0, U0)))
    g0, g1 = doc["gpus"]
    assert g0["reasons"] == ["xid-74"]
    assert g0["xids"] == [{"xid": 74, "at": "2025-03-04T05:05:57.500Z"}]  # 9.5 s before read_at
    assert "xids" not in g1  # none: absent, as before


SEEDS = [
    # (what, raw telemetry, the new reading, expected (index, xid, at_s) seeded, refused count)
    ("20 s later on a new clock: the window runs on from the event",
     published(XidEvent(0, 74, 990.0, U0)), restarted(20.0), [(0, 74, 5.0 - 30.0)], 0),
    ("the latest of two events of one code", published(XidEvent(0, 74, 900.0, U0),
     XidEvent(0, 74, 950.0, U0)), restarted(0.0, clock_s=1000.0), [(0, 74, 950.0)], 0),
    ("matched by UUID when indices shifted", published(XidEvent(1, 79, 1000.0, U1)),
     restarted(10.0, gpu(0, uuid=U1)), [(0, 79, -5.0)], 0),
    ("a GPU no longer read seeds nothing", published(XidEvent(0, 74, 990.0, U0)),
     restarted(10.0, gpu(1)), [], 0),
    ("a GPU lost now seeds nothing", published(XidEvent(0, 74, 990.0, U0)),
     restarted(10.0, lost(0), gpu(1)), [], 0),
    ("no telemetry", None, restarted(10.0), [], 0),
    ("an older agent's telemetry (no xids): dated at read_at",
     forged([entry(xids=None)]), restarted(20.0), [(0, 74, -15.0)], 0),
    ("a time slightly ahead counts as now",
     forged([entry(xids=[("74", "2025-03-04T05:06:37Z")])]), restarted(0.0), [(0, 74, 5.0)], 0),
    ("not JSON", "{not json", restarted(0.0), [], 1),
    ("a year ahead", forged([entry(xids=[("74", "2026-03-04T05:06:07Z")])]), restarted(0.0), [], 1),
    ("year 1", forged([entry(xids=[("74", "0001-01-01T00:00:00+23:59")])]), restarted(0.0), [], 1),
    ("no time", forged([entry(xids=[("74", "")])]), restarted(0.0), [], 1),
    ("a reason without its time", forged([entry(reasons=("xid-74", "xid-79"))]),
     restarted(0.0), [], 1),
    ("a time without its reason", forged([entry(reasons=())]), restarted(0.0), [], 1),
    ("the GPU listed twice", forged([entry(), entry()]), restarted(0.0), [], 1),
    ("one bad GPU, one good: the good one seeds",
     forged([entry(xids=[("74", "nonsense")]),
             entry(U1, reasons=("xid-79",), xids=[("79", "2025-03-04T05:06:07Z")])]),
     restarted(0.0), [(1, 79, 5.0)], 1),
    ("too many entries", forged([entry(reasons=[f"xid-{n}" for n in range(100)],
                                       xids=[(str(n), "2025-03-04T05:06:07Z") for n in range(100)])]),
     restarted(0.0), [], 1),
    ("an unknown GPU's garbage is not even looked at",
     forged([entry("GPU-forged", xids=[("74", "garbage")])]), restarted(0.0), [], 0),
]


@pytest.mark.parametrize(("raw", "snap", "seeded", "refused"),
                         [s[1:] for s in SEEDS], ids=[s[0] for s in SEEDS])
def test_seed_events(raw, snap, seeded, refused) -> None:
    found = seed_events(raw, snap)
    assert [(e.index, e.xid, e.at_s) for e in found.events] == seeded
    assert all(e.uuid == snap.gpus[e.index].uuid for e in found.events)
    assert len(found.refused) == refused


def test_far_ahead_is_refused_and_near_ahead_clamped() -> None:
    snap = restarted(0.0)
    ahead = (READ_AT + timedelta(seconds=MAX_AHEAD_S + 1)).isoformat().replace("+00:00", "Z")
    assert seed_events(forged([entry(xids=[("74", ahead)])]), snap).refused


def test_a_seeded_ledger_keeps_the_gpu_unhealthy_until_the_window_from_the_event() -> None:
    raw = published(XidEvent(0, 74, 990.0, U0))  # 10 s before READ_AT
    ledger = XidLedger(XidPolicy(quiet_s=60.0))
    first = restarted(20.0)  # 30 s after the event
    found = seed_events(raw, first)
    ledger.seed(found.events, len(found.refused))
    assert ledger.seeded == 1 and ledger.seed_refused == 0
    timeline = []
    for later_s in (0.0, 29.0, 30.0):  # the window ends 60 s after the event: 30 s on
        now = replace(first, clock_s=first.clock_s + later_s)
        timeline.append(assess(now, ledger.recent(now.clock_s), ledger.policy).gpus[0].reasons)
    assert timeline == [("xid-74",), ("xid-74",), ()]


def test_the_policy_of_the_new_agent_decides_which_codes_count() -> None:
    found = seed_events(published(XidEvent(0, 74, 990.0, U0)), restarted(1.0))
    ledger = XidLedger(XidPolicy(ignore=frozenset({74})))
    ledger.seed(found.events)
    assert ledger.seeded == 0 and ledger.recent(5.0) == ()


# -- two agents on the real kube-apiserver ----------------------------------------------


class Reader:
    """Returns ``snap`` with the clock and wall clock moved by ``t`` seconds."""

    def __init__(self, snap: NodeSnapshot) -> None:
        self.snap = snap
        self.t = 0.0

    def read(self) -> NodeSnapshot:
        return replace(self.snap, clock_s=self.snap.clock_s + self.t,
                       read_at=self.snap.read_at + timedelta(seconds=self.t))

    def close(self) -> None:
        pass


@pytest.mark.cluster
def test_a_restarted_agent_keeps_an_xid_unhealthy_until_the_window_ends(
    dev_cluster, admin_api, make_node
) -> None:
    node = make_node()
    s = settings(node_name=node, xid_quiet_s=60, min_patch_interval_s=0)
    key = "omaticaya.io/gpu-0.health"

    def agent(reader: Reader) -> Agent:
        client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda _: None)
        return Agent(s, reader, NodeApi(client, lease=None))

    # agent 1 sees Xid 74 on GPU 0 (reader clock 1000, wall READ_AT) and writes the Node
    one = Reader(snapshot(gpu(0), gpu(1), clock_s=1000.0,
                          xid_events=[XidEvent(0, 74, 1000.0, U0)]))
    agent(one).tick()
    assert node_metadata(admin_api, node)[0][key] == "Unhealthy"

    # agent 2 starts 20 s later (a rolling update), on a clock of its own; NVML replays nothing
    two = Reader(snapshot(gpu(0), gpu(1), clock_s=3.0, read_at=READ_AT + timedelta(seconds=20)))
    second = agent(two)
    seen = []
    for t in (0.0, 39.0, 40.5):  # the window ends 60 s after the event: 40 s into agent 2
        two.t = t
        result = second.tick()
        seen.append((t, result.health.gpus[0].reasons, node_metadata(admin_api, node)[0][key]))
    assert seen == [
        (0.0, ("xid-74",), "Unhealthy"),
        (39.0, ("xid-74",), "Unhealthy"),
        (40.5, (), "Healthy"),
    ]
    assert second.ledger.seeded == 1 and second.ledger.seed_refused == 0
    registry = CollectorRegistry()
    agent_registry(second, registry)
    assert registry.get_sample_value("omaticaya_xid_events_seeded_total") == 1
    assert registry.get_sample_value("omaticaya_xid_seed_refused_total") == 0


@pytest.mark.cluster
def test_a_node_that_cannot_be_read_seeds_nothing_and_the_agent_goes_on(
    dev_cluster, make_node, tmp_path
) -> None:
    from loguru import logger

    node = make_node()
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        missing = NodeClient("no-such-node", kubeconfig=str(dev_cluster.kubeconfig))
        a = Agent(settings(node_name=node), Reader(snapshot(gpu(0))), NodeApi(missing, lease=None))
        snap, health, _ = a.evaluate()
        assert a.xid_seeder is None  # done: nothing more to try
        assert a.ledger.seeded == 0 and health.gpus[0].healthy
        assert sum("could not read the Node's telemetry" in line for line in lines) == 1
        a.evaluate()
        assert sum("could not read the Node's telemetry" in line for line in lines) == 1
    finally:
        logger.remove(sink)
