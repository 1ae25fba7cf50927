"""Reservations age on the extender's clock, never the API server's (issue 38, fault 7).

The pod watch's documents carry the server's times (PodScheduled's ``lastTransitionTime``); the
ledger judges ages at the extender's ``now``. A reservation keeps the time the extender made
it; a pod first seen from the watch (after a restart) ages from when the extender first saw
it, and no later watch event or LIST restarts that age. The extender's clock is the hand-driven
``tests.helpers.Clock``; the server is 90 s behind it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.inflight import Placement
from omaticaya_py.scheduler.ledger import Ledger, Phase, placement_from_pod
from tests.helpers import Clock

NOW = 1_800_000_000.0  # the extender's clock when the pod is bound
BEHIND_S = 90.0  # the API server's clock is this far behind the extender's
SETTLE_S, ASSUME_S = 60.0, 30.0
UID, KEY, MIB = "u", "ns/p", 30000


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bound_pod(server_now: float) -> dict[str, Any]:
    """The pod as the watch shows it bound on node ``a`` at ``server_now`` (the server's
    clock), not started yet."""
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": UID,
                     "annotations": {"omaticaya.io/gpu-memory-mib": str(MIB)}},
        "spec": {"nodeName": "a"},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(server_now)},
        ]},
    }  # fmt: skip


def reading(read_at: float) -> NodeGpuState:
    """Node ``a``: one GPU of 70 GB free, read at ``read_at`` (the pod not shown yet)."""
    return NodeGpuState(name="a", known=True, health="Healthy", read_at=read_at,
                        gpus=(GpuInfo(0, 70000, True),), free_total_mib=70000)  # fmt: skip


def watch(ledger: Ledger, clock: Clock, previous: Placement | None = None) -> None:
    """The pod watch at ``clock``'s time: the pod document (server time 90 s behind) through
    ``placement_from_pod`` into the ledger, as ``server._start_pod_cache`` wires it."""
    new = placement_from_pod(bound_pod(clock() - BEHIND_S), previous,
                             now=clock())  # fmt: skip
    ledger.pod_changed(KEY, previous, new)


def test_the_server_90s_behind_does_not_expire_a_fresh_reservation():
    clock, ledger = Clock(NOW), Ledger(settle_s=SETTLE_S, assume_s=ASSUME_S)
    ledger.reserve(Placement(KEY, UID, "a", MIB, 1, placed_at=clock(), gpus=(0,),
                             bound=False))  # fmt: skip
    clock.t += 1
    watch(ledger, clock)  # confirmed: the pod is bound where it was reserved
    assert ledger.counts["confirmed"] == 1
    clock.t += 1
    assert ledger.phase(UID, reading(clock()), clock()) is Phase.BOUND
    # it keeps the time the extender reserved it: settle_s from then, not from the server's
    assert ledger.get(UID).placed_at == NOW  # type: ignore[union-attr]
    assert ledger.phase(UID, reading(NOW + SETTLE_S - 1), NOW + SETTLE_S - 1) is Phase.BOUND
    assert ledger.phase(UID, reading(NOW + SETTLE_S), NOW + SETTLE_S) is Phase.EXPIRED


def test_a_restarted_extender_ages_a_bound_pod_from_when_it_first_saw_it():
    clock, ledger = Clock(NOW), Ledger(settle_s=SETTLE_S, assume_s=ASSUME_S)  # a fresh process
    watch(ledger, clock)  # the LIST after the restart: bound, never reserved here
    first = ledger.get(UID)
    assert first is not None and first.placed_at == NOW
    clock.t += 1
    assert ledger.phase(UID, reading(clock()), clock()) is Phase.BOUND
    # a later event of the pod, and a re-LIST that lost the previous placement: neither
    # restarts its age (a reservation cannot be kept alive by the watch)
    clock.t = NOW + 30
    watch(ledger, clock, first)
    clock.t = NOW + 50
    watch(ledger, clock, None)
    assert ledger.get(UID).placed_at == NOW  # type: ignore[union-attr]
    assert ledger.phase(UID, reading(NOW + SETTLE_S - 1), NOW + SETTLE_S - 1) is Phase.BOUND
    assert ledger.phase(UID, reading(NOW + SETTLE_S), NOW + SETTLE_S) is Phase.EXPIRED
