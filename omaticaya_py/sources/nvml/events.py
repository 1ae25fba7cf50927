"""The Xid watcher: critical Xid and double-bit ECC events of the GPUs, from a background thread.

The thread waits in ``nvmlEventSetWait_v2`` on an NVML event set
(``nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError``, masked by what each GPU
supports) and keeps the events until ``take``. Each watcher thread has its own stop event;
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

from ...core.snapshot import XidEvent
from .device import Device
from .library import decode, error_name

__all__ = ["XidWatcher"]

#: NVIDIA's Xid for a double-bit ECC error (such an event carries no Xid of its own)
XID_DOUBLE_BIT_ECC = 48


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

    def __init__(self, errors: Counter[tuple[str, str]], clock: Callable[[], float]) -> None:
        self.errors = errors
        self.clock = clock
        self._lock = threading.Lock()
        self._events: list[XidEvent] = []
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
                sleep=stop.wait,
                before_sleep=self._count_wait_error,
            )
            while not stop.is_set():
                data = waiting(wait_once)
                if data is None:
                    continue
                uuid = self._event_uuid(data)
                xid = (
                    int(data.eventData)
                    if data.eventType == pynvml.nvmlEventTypeXidCriticalError
                    else XID_DOUBLE_BIT_ECC
                )
                event = XidEvent(
                    index=index_of.get(uuid, -1), xid=xid, at_s=self.clock(), uuid=uuid
                )
                with self._lock:
                    self._events.append(event)
        finally:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError:
                pass

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
