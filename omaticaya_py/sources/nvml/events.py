"""The Xid watcher: critical Xid and double-bit ECC events of the GPUs, from a background thread.

The thread waits in ``nvmlEventSetWait_v2`` on an NVML event set
(``nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError``, masked by what each GPU
supports) and keeps the events until ``take``, at most ``MAX_PENDING`` of them: beyond that
(an Xid flood, or no read for a long while) the oldest are dropped and counted (``dropped``),
but never the latest event of a (GPU, Xid) pair (``bound_events``), so that the fact that a
critical Xid happened on a GPU is never lost. Each watcher thread has its own stop event;
``stop`` waits for the thread to leave ``nvmlEventSetWait_v2`` (at most ``WAIT_MS``) so that
``nvmlShutdown`` never runs under it. An event names its GPU by UUID.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml
import tenacity

from ...core.model.snapshot import XidEvent
from .device import Device
from .library import decode, error_name, handle_address

__all__ = ["XidWatcher", "bound_events"]

#: NVIDIA's Xid for a double-bit ECC error (such an event carries no Xid of its own)
XID_DOUBLE_BIT_ECC = 48


def bound_events(events: list[XidEvent], limit: int) -> tuple[list[XidEvent], int]:
    """``events`` (oldest first) cut to at most ``limit`` (>= 1), and how many were dropped.

    First the latest event of each (GPU, Xid) is kept and older repeats dropped; if more than
    ``limit`` distinct pairs remain (a driver sending made-up codes), the oldest are dropped
    too, except the latest event of each GPU. Order is kept."""
    if len(events) <= limit:
        return events, 0
    latest: dict[tuple[str | int | None, int], int] = {}
    for i, e in enumerate(events):
        latest[(e.uuid or e.index, e.xid)] = i
    kept = sorted(latest.values())
    if len(kept) > limit:
        last_of_gpu = {events[i].uuid or events[i].index: i for i in kept}
        must = set(last_of_gpu.values())
        room = max(0, limit - len(must))
        others = [i for i in kept if i not in must]
        kept = sorted(must | set(others[len(others) - room :] if room else ()))
    return [events[i] for i in kept], len(events) - len(kept)


class XidWatcher:
    """One background thread at a time (``nvml-xid``) delivering Xid events.

    ``errors``: the counter NVML errors of the event calls go to, by ``(call, error name)``
    (shared with the reader's); ``clock``: ``XidEvent.at_s`` (monotonic seconds).
    """

    #: longest the thread stays inside ``nvmlEventSetWait_v2`` (ms), the join's margin (s),
    #: and the pause after a failed wait before the next (s)
    WAIT_MS = 1000
    JOIN_S = 5.0
    ERROR_PAUSE_S = 1.0
    #: the most events kept between two reads (``bound_events``)
    MAX_PENDING = 256

    def __init__(self, errors: Counter[tuple[str, str]], clock: Callable[[], float]) -> None:
        self.errors = errors
        self.clock = clock
        self._lock = threading.Lock()
        self._events: list[XidEvent] = []
        #: events dropped from the buffer beyond ``MAX_PENDING`` (``bound_events``)
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None

    def start(self, devices: list[Device]) -> None:
        """(Re)start the thread over ``devices`` (each with a handle); a running one is
        stopped first."""
        if self._thread is not None:
            self.stop()
        stop = threading.Event()  # this thread's own: a later one never revives it
        self._stop = stop
        self._thread = threading.Thread(
            target=self._watch, args=(devices, stop), name="nvml-xid", daemon=True
        )
        self._thread.start()

    def stop(self) -> bool:
        """Stop the thread; True if it is still inside NVML after ``JOIN_S`` seconds."""
        thread, stop = self._thread, self._stop
        self._thread = self._stop = None
        if stop is not None:
            stop.set()
        if thread is None:
            return False
        thread.join(timeout=self.JOIN_S)
        return thread.is_alive()

    def take(self) -> tuple[XidEvent, ...]:
        """The events delivered since the last ``take``, oldest first."""
        with self._lock:
            events, self._events = tuple(self._events), []
        return events

    def _watch(self, devices: list[Device], stop: threading.Event) -> None:
        """Deliver critical Xid and double-bit ECC events of ``devices`` until ``stop``."""
        types = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self.errors[("nvmlEventSetCreate", error_name(exc))] += 1
            return
        try:
            for device in devices:
                try:
                    # a type the GPU cannot report makes NVML register nothing: mask first
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(device.handle)
                    pynvml.nvmlDeviceRegisterEvents(device.handle, types & supported, event_set)
                except pynvml.NVMLError as exc:
                    self.errors[("nvmlDeviceRegisterEvents", error_name(exc))] += 1
            index_of = {d.uuid: d.index for d in devices if d.uuid}
            by_address = {handle_address(d.handle): d for d in devices}

            def wait_once() -> Any:
                """The next event; None after a quiet ``WAIT_MS`` or once stopped."""
                if stop.is_set():
                    return None
                try:
                    return pynvml.nvmlEventSetWait_v2(event_set, self.WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    return None

            # another NVML error: counted, then tried again after a pause that stop cuts short
            waiting = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(pynvml.NVMLError),
                wait=tenacity.wait_fixed(self.ERROR_PAUSE_S),
                sleep=stop.wait,  # type: ignore[arg-type]  # tenacity drops wait()'s bool
                before_sleep=self._count_wait_error,
            )
            while not stop.is_set():
                data = waiting(wait_once)
                if data is None:
                    continue
                uuid = self._event_uuid(data)
                if uuid is None:  # off the bus (Xid 79): its handle still names the GPU
                    known = by_address.get(handle_address(data.device))
                    uuid = known.uuid if known is not None else None
                xid = (
                    int(data.eventData)
                    if data.eventType == pynvml.nvmlEventTypeXidCriticalError
                    else XID_DOUBLE_BIT_ECC
                )
                event = XidEvent(
                    index=index_of.get(uuid, -1), xid=xid, at_s=self.clock(), uuid=uuid
                )
                self.keep(event)
        finally:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError:
                pass

    def keep(self, event: XidEvent) -> None:
        """Buffer ``event`` for the next ``take``; over ``MAX_PENDING``, cut the buffer down to
        half of it (``bound_events``), so that a flood costs O(1) per event."""
        with self._lock:
            self._events.append(event)
            if len(self._events) > self.MAX_PENDING:
                self._events, dropped = bound_events(self._events, self.MAX_PENDING // 2)
                self.dropped += dropped

    def _count_wait_error(self, retry_state: tenacity.RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if exc is not None:
            self.errors[("nvmlEventSetWait_v2", error_name(exc))] += 1

    @staticmethod
    def _event_uuid(data: Any) -> str | None:
        """The UUID of the GPU an event came from (``nvmlDeviceGetUUID(eventData.device)``)."""
        try:
            return decode(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            return None
