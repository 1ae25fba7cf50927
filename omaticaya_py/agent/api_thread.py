"""The API work of a tick, off the read path: Lease renewal, Node patch, Events.

An API server that accepts and never answers holds each request for ``kube_timeout_s`` and
each call for its retries (4 x 10 s for the Lease, again for the Node): done inside the tick,
that held the next reading, and the health the device plugin serves, for 80 s at a 10 s
schedule. The daemon's tick therefore only reads, caches and tells its listeners, then hands
its reading to ``ApiWriter``: one thread that writes the latest reading it was given (a newer
one replaces one not yet started: latest wins, counted in ``writes_superseded``), so that a
slow API delays the Node's labels, never the reading. The work itself is ``Agent.write``, also
run inline by ``Agent.tick()`` (``omaticaya once``, tests).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from loguru import logger

from ..core.publish.readings import TickResult
from ..kube import KubeError
from .state import AgentStopping, SnapshotCache

__all__ = ["ApiWriter"]


class ApiWriter:
    """The thread (``kube-writer``) that runs ``write`` (``Agent.write``: a reading and the
    agent-clock time it was read at -> what was written) for the latest reading submitted;
    ``cache`` gets each result and counts what was superseded or failed.

    ``submit`` never blocks on the API; a reading submitted while another waits replaces it.
    Every failure is logged (once per outage) and counted, never raised: the thread goes on
    with the next reading. ``stop`` ends it after the round in flight."""

    def __init__(
        self, write: Callable[[TickResult, float], TickResult], cache: SnapshotCache
    ) -> None:
        self.write, self.cache = write, cache
        self._cond = threading.Condition()
        self._pending: tuple[TickResult, float] | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> ApiWriter:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kube-writer", daemon=True)
            self._thread.start()
        return self

    def submit(self, result: TickResult, now_s: float) -> None:
        """Write ``result`` (read at ``now_s``, agent clock) next; replaces one not started."""
        with self._cond:
            if self._pending is not None:
                self.cache.writes_superseded += 1
            self._pending = (result, now_s)
            self._cond.notify()

    def stop(self) -> None:
        """Ask the thread to end after the round in flight; a reading not started is dropped."""
        with self._cond:
            self._stopped = True
            self._pending = None
            self._cond.notify()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; True when it did (or never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        cache = self.cache
        while True:
            with self._cond:
                while self._pending is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                result, now_s = self._pending  # type: ignore[misc]
                self._pending = None
            try:
                cache.replace(result, self.write(result, now_s))
            except AgentStopping:
                return
            except KubeError:
                pass  # logged once per outage in ApiOutage.failed
            except Exception:  # noqa: BLE001 - the writer must survive any bug in one round
                cache.tick_errors += 1
                logger.exception("writing the Node failed")
