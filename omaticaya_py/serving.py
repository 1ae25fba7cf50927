"""The one HTTP stack: Starlette apps served by uvicorn, and prometheus-client's ``/metrics``.

The agent (``/metrics``, ``/healthz``, ``/readyz``) and the scheduler extender (its verbs and the
same three paths) both serve through ``HttpServer``: the socket is bound at construction, so a
bad address fails at once with ``OSError``, and uvicorn then serves it either in the calling
thread (``run``: SIGTERM/SIGINT stop it when that is the main thread) or in a background thread
(``start``/``shutdown``).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

__all__ = ["HttpServer", "bind", "metrics_route"]


def bind(address: str, port: int) -> socket.socket:
    """A listening TCP socket on ``address:port`` (``port`` 0: any free port). The family
    follows the address: ``'::'`` listens on IPv6, and on IPv4 too where the host is
    dual-stack. Raises ``OSError`` (port in use, address not on this host, no IPv6)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    dual = family == socket.AF_INET6 and address == "::" and socket.has_dualstack_ipv6()
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it every small response waits ~40 ms for the client's delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class _Asgi:
    """A plain ASGI callable (so Starlette's ``Route`` serves it as is, without a redirect)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def metrics_route(registry: Any) -> Any:
    """``GET /metrics``: prometheus-client's ASGI exposition of ``registry`` (content
    negotiation, OpenMetrics, gzip and ``name[]`` filtering are the library's)."""
    from prometheus_client import make_asgi_app
    from starlette.routing import Route

    return Route("/metrics", _Asgi(make_asgi_app(registry)), methods=["GET"])


class HttpServer:
    """uvicorn serving ``app`` on a socket bound now; ``port`` is the bound port.

    ``log_level`` is uvicorn's own (``"warning"`` keeps its start-up lines out of the agent's
    log); ``access_log`` logs each request. Raises ``OSError`` when the address cannot be
    bound."""

    def __init__(
        self, app: Any, address: str, port: int, *, log_level: str = "warning",
        access_log: bool = False,
    ) -> None:
        import uvicorn

        self.sock = bind(address, port)
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level=log_level.lower(), access_log=access_log, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """True once uvicorn accepts connections."""
        return bool(self.server.started)

    def run(self) -> bool:
        """Serve in this thread until ``stop()`` (or SIGTERM/SIGINT in the main thread);
        returns whether it ever served."""
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()
        return self.started

    def start(self, timeout_s: float = 10.0) -> HttpServer:
        """Serve in a daemon thread; returns once it accepts connections (or ``timeout_s``)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=lambda: (self.run(), ready.set()),  # type: ignore[func-returns-value]  # 2 calls
            name="http", daemon=True,
        )
        self._thread.start()
        poll = threading.Event()
        while not self.started and not ready.is_set() and timeout_s > 0:
            poll.wait(0.01)
            timeout_s -= 0.01
        return self

    def stop(self) -> None:
        """Ask uvicorn to stop: it stops accepting and finishes the requests in flight."""
        self.server.should_exit = True

    def shutdown(self) -> None:
        """``stop()`` and wait for the background thread (at most 5 s)."""
        self.stop()
        if self._thread is not None:
            self._thread.join(5.0)
        self.sock.close()
