"""What one tick of the agent read and did (``TickResult``), and what the device plugin reads
from the agent (``AgentFeed``): the one seam between the two, typed.

The device plugin (``deviceplugin``) runs in the agent's process and serves the agent's latest
reading to the kubelet; it may not import the agent (one layer), so it reads the agent through
``AgentFeed``, which ``agent.Agent`` satisfies (mypy checks it where ``cli.daemon`` hands the
agent to ``DevicePluginSet``). Pure: types only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..model.snapshot import NodeSnapshot
from ..rules.attribution import GpuAttribution
from ..rules.health import NodeHealth
from .patch import MergePatch
from .render import Desired

__all__ = [
    "AgentFeed", "ReadingAge", "ReadingCache", "TickListener",
    "TickResult",
]


@dataclass(frozen=True)
class TickResult:
    """What one tick saw and did: ``snapshot`` (the NVML reading), ``health`` (its assessment:
    one ``Unit`` per GPU or MIG device), ``desired`` (the labels and telemetry rendered from
    them), ``patch`` the merge patch computed (``None``: nothing changed), ``sent`` whether it
    reached the API server; ``attribution``: who uses each GPU or MIG device, by UUID (empty
    when not attributed)."""

    snapshot: NodeSnapshot
    health: NodeHealth
    desired: Desired
    patch: MergePatch | None
    sent: bool
    attribution: Mapping[str, GpuAttribution] = field(default_factory=dict)


#: ``ReadingAge``'s reading before any is passed: no caller's reading is it, so the first one,
#: whatever it is (``None`` too), starts its clock
_NOT_YET = object()


class ReadingAge:
    """How long the reading a server (the device plugin, the DRA plugin) serves has been the
    same, on that server's own clock: counted from when it first saw that reading, so the
    agent's wall clock plays no part. The caller serialises calls (its own lock)."""

    def __init__(self) -> None:
        self._seen: object = _NOT_YET
        self._seen_at_s: float  # set with the first reading

    def age_s(self, reading: object, now_s: float) -> float:
        """Seconds since ``reading`` (compared by identity) was first passed, at ``now_s``."""
        if reading is not self._seen:
            self._seen, self._seen_at_s = reading, now_s
        return now_s - self._seen_at_s


#: called with each tick's result as soon as it is cached, on the tick's thread
TickListener = Callable[[TickResult], None]
class ReadingCache(Protocol):
    """Where the agent keeps its latest tick (``agent.state.SnapshotCache``)."""

    @property
    def last(self) -> TickResult | None:
        """The latest tick's result (``None`` before the first tick finished); replaced whole
        by each tick, so a reader never sees half of one."""
        ...


class AgentFeed(Protocol):
    """What the device plugin reads from the agent (``agent.Agent``).

    - ``cache``: the latest reading and its health (``ReadingCache.last``).
    - ``clock``: the agent's clock (monotonic seconds), the one ``last_listed`` is on.
    - ``last_listed``: the device IDs (GPU and MIG UUIDs, unit IDs ``<GPU UUID>::<k>``) the
      kubelet's last PodResources list that answered names as assigned, and when (``clock``
      seconds) it was asked for; ``None``: none answered (no socket, or it failed).
    - ``on_tick``: the tick listeners; the plugin appends its own (to wake its streams and
      follow MIG profiles) and never removes them. Each is called on the tick's thread, before
      any API request.
    """

    @property
    def cache(self) -> ReadingCache: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def last_listed(self) -> tuple[frozenset[str], float] | None: ...

    @property
    def on_tick(self) -> list[TickListener]: ...
