"""A pod started before the NVIDIA container toolkit was ready has no NVML library in its
container, and re-initialising NVML at every tick cannot bring one in (the toolkit injects it
when a container is created). ``/healthz`` fails once every read for
``LIBRARY_MISSING_RESTART_S`` found no library, so that the liveness probe's restart makes a
container that has it (issue 31); any other NVML failure, or a library found, never does."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.agent.metrics import LIBRARY_MISSING_RESTART_S, liveness
from omaticaya_py.agent.state import LIBRARY_NOT_FOUND
from omaticaya_py.core.model.snapshot import NodeSnapshot
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE, Clock, settings


class ScriptedReader:
    """Each read returns the next entry: an NVML error name, or ``None`` for the H100 trace's
    reading (a library that works)."""

    def __init__(self, clock: Clock, script: list[str | None]) -> None:
        self.clock, self.script = clock, list(script)
        self.trace = TraceReader(H100_TRACE)

    def read(self) -> Any:
        error = self.script.pop(0)
        if error is None:
            return self.trace.read()
        return NodeSnapshot(
            read_at=datetime.now(timezone.utc), clock_s=self.clock(), error=error, source="nvml"
        )

    def close(self) -> None:
        pass


R = LIBRARY_MISSING_RESTART_S


@pytest.mark.parametrize(
    ("script", "healthy"),
    [
        # (seconds since start, the read's error) per tick; healthy after the last one?
        ([(0, LIBRARY_NOT_FOUND), (R, LIBRARY_NOT_FOUND)], True),  # exactly the bound
        ([(0, LIBRARY_NOT_FOUND), (R + 1, LIBRARY_NOT_FOUND)], False),
        # the library appeared (a restart did it, or it was a passing failure): the episode ends
        ([(0, LIBRARY_NOT_FOUND), (R / 2, None), (R + 1, LIBRARY_NOT_FOUND)], True),
        # a driver that is not loaded yet can come back on its own: nvmlInit again is the cure
        ([(0, "NVMLError_DriverNotLoaded"), (10 * R, "NVMLError_DriverNotLoaded")], True),
        ([(0, None), (10 * R, None)], True),
    ],
)
def test_a_missing_library_fails_healthz_after_the_bound(script, healthy):
    clock = Clock(1000.0)
    reader = ScriptedReader(clock, [error for _, error in script])
    agent = Agent(settings(node_name="n1", schedule="@every 10s"), reader,
                  NodeApi(None, dry_run=True), clock=clock)

    class Running:
        running = True

    Daemon(agent).scheduler = Running()  # the probe reads it through agent.daemon
    for at_s, _ in script:
        clock.t = 1000.0 + at_s
        agent.tick()
    alive, reason = liveness(agent.daemon, agent.cache)
    assert alive is healthy, reason
    if not healthy:
        assert reason.startswith(f"no NVML library in this container for {R + 1:.0f}s")
