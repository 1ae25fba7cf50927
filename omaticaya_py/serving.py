"""The one HTTP stack: Starlette apps served by uvicorn, and prometheus-client's ``/metrics``.

The agent (``/metrics``, ``/healthz``, ``/readyz``) and the scheduler extender (its verbs and the
same three paths) both serve through ``HttpServer``: the socket is bound at construction, so a
bad address fails at once with ``OSError``, and uvicorn then serves it either in the calling
thread (``run``: SIGTERM/SIGINT stop it when that is the main thread) or in a background thread
(``start``/``shutdown``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

__all__ = ["UNIX_PATH_MAX", "HttpServer", "bind", "listen_unix", "metrics_route", "probe_app"]

#: the longest path of a unix socket, bytes (``sun_path`` is 108 with its terminating NUL)
UNIX_PATH_MAX = 107


def listen_unix(server: Any, path: Any) -> None:
    """Have the gRPC ``server`` (``grpc.server``) listen on the unix socket ``path``: the one way
    both kubelet plugins (the device plugin, the DRA driver) do it. Raises ``OSError`` naming
    the path when it cannot: a path over ``UNIX_PATH_MAX`` bytes (gRPC itself raises a bare
    ``RuntimeError`` then, which a plugin's retry did not catch: its registration thread died
    and the plugin never served), or any other failure to bind."""
    size = len(str(path).encode())
    if size > UNIX_PATH_MAX:
        raise OSError(f"cannot listen on {path}: {size} bytes, a unix socket's path is at most "
                      f"{UNIX_PATH_MAX}: use a shorter folder")  # fmt: skip
    try:
        port = server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {path}: {str(exc).split(';')[0]}") from None
    if port == 0:
        raise OSError(f"cannot listen on {path}")


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


def probe_app(registry: Any, healthz: Any, readyz: Any) -> Any:
    """The Starlette application of a metrics port: ``/metrics`` (``metrics_route`` of
    ``registry``), ``/healthz`` and ``/readyz`` (each a probe returning ``(ok, reason)``:
    200 or 503, the reason as one line of plain text)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    def answer(ok: bool, reason: str) -> PlainTextResponse:
        return PlainTextResponse(reason + "\n", status_code=200 if ok else 503)

    async def health(request: Request) -> PlainTextResponse:
        return answer(*healthz())

    async def ready(request: Request) -> PlainTextResponse:
        return answer(*readyz())

    return Starlette(
        routes=[
            Route("/healthz", health, methods=["GET"]),
            Route("/readyz", ready, methods=["GET"]),
            metrics_route(registry),
        ]
    )


def _quiet_server(config: Any) -> Any:
    """A ``uvicorn.Server`` whose main loop sleeps until it is told to stop.

    Stock uvicorn wakes every 0.1 s to look at ``should_exit`` and, every second, to rebuild the
    ``date`` header: ten wake-ups a second with nothing to serve, which was 7x the idle agent's
    CPU (issue 31: 0.23 % of a core vs 0.033 % without the server). Here ``should_exit`` is a
    property whose setter wakes the loop (from ``stop()`` in another thread, or uvicorn's own
    SIGTERM/SIGINT handler in this one), and responses carry no ``date`` header (RFC 9110 lets a
    server without a reliable clock leave it out; Prometheus and kube-scheduler ignore it).
    Everything else (start-up, graceful shutdown, the protocol) is uvicorn's."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        _loop: asyncio.AbstractEventLoop | None = None
        _wake: asyncio.Event | None = None
        _exit = False

        @property
        def should_exit(self) -> bool:
            return self._exit

        @should_exit.setter
        def should_exit(self, value: bool) -> None:
            self._exit = value
            loop, wake = self._loop, self._wake
            if value and loop is not None and wake is not None and not loop.is_closed():
                loop.call_soon_threadsafe(wake.set)

        async def main_loop(self) -> None:
            self._wake = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            await self.on_tick(0)  # the default headers, once
            while not self._exit:
                await self._wake.wait()

    return QuietServer(config)


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
            app, log_level=log_level.lower(), access_log=access_log, lifespan="off",
            date_header=False,
        )
        self.server = _quiet_server(config)
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
