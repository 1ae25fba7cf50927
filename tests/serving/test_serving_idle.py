"""The one HTTP stack sleeps until a request comes (issue 31, item 6): with nothing to serve,
the server's thread makes no context switches (stock uvicorn wakes ten times a second to poll
its exit flag and rebuild the ``date`` header); it still serves, and ``stop()`` from another
thread, like SIGTERM, ends it at once."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from omaticaya_py.serving import HttpServer
from tests.waiting import wait_for


def _switches(tid: int) -> int:
    """Voluntary + involuntary context switches of one thread of this process (/proc)."""
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    return sum(
        int(line.split()[1]) for line in status.splitlines()
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    )


def _http_thread() -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == "http")


def test_an_idle_server_does_not_wake_and_still_serves_and_stops():
    app = Starlette(routes=[Route("/ok", lambda request: PlainTextResponse("ok\n"))])
    server = HttpServer(app, "127.0.0.1", 0).start()
    try:
        assert server.started
        url = f"http://127.0.0.1:{server.port}/ok"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.read() == b"ok\n"
            assert r.headers.get("date") is None  # uvicorn's per-second date header is off
        thread = _http_thread()
        assert thread.native_id is not None
        tid = thread.native_id

        def settled() -> bool:  # the finished connection's teardown is over
            start = _switches(tid)
            time.sleep(0.3)
            return _switches(tid) == start

        wait_for("the http thread to settle after the request", settled, timeout_s=10)
        before = _switches(thread.native_id)
        time.sleep(1.5)  # stock uvicorn: ~15 wake-ups in this window
        assert _switches(thread.native_id) - before <= 1
        with urllib.request.urlopen(url, timeout=5) as r:  # a request still wakes it
            assert r.status == 200
    finally:
        server.stop()
    wait_for("the http thread to end", lambda: not _http_thread_alive(), timeout_s=5)


def _http_thread_alive() -> bool:
    return any(t.name == "http" and t.is_alive() for t in threading.enumerate())
