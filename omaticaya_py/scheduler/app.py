"""The extender's HTTP face: a Starlette app serving /filter, /prioritize, /metrics and the probes."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from itertools import repeat
from typing import Any

from loguru import logger as log

from ..core.model.sayonce import SayOnce
from ..core.schema import NodeGpuState
from ..serving import metrics_route
from .metrics import metrics_registry
from .protocol import Extender

__all__ = [
    "MAX_BODY_BYTES",
    "LeaseProblems",
    "NodeProblems",
    "args_problem",
    "create_app",
    "metrics_registry",
]

# ------------------------------------------------------------------------------- app ----


#: the largest request body read: a NodeList of 1,000 Nodes of 32 KiB (without
#: ``nodeCacheCapable`` the scheduler sends whole Nodes); larger is answered 413
MAX_BODY_BYTES = 32 << 20


def args_problem(args: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of an ExtenderArgs object, or ``None``: ``NodeNames`` must
    be null or a list of names, ``Nodes`` null or an object whose ``items`` is null or a list
    of objects. (``Pod`` may be anything: a pod without a readable need passes through.)"""
    names = args.get("NodeNames")
    if names is not None and not (
        isinstance(names, list) and all(map(isinstance, names, repeat(str)))
    ):
        return "NodeNames must be null or a list of Node names"
    nodes = args.get("Nodes")
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else ()
        if not isinstance(nodes, dict) or not (
            items is None or (isinstance(items, list) and all(isinstance(n, dict) for n in items))
        ):
            return "Nodes must be null or a NodeList object whose items are Node objects"
    return None


def _said(
    said: SayOnce[str, str], lock: threading.Lock, counts: Counter[str], name: str,
    problem: str | None,
) -> bool | None:
    """``problem`` (``None``: none) holds for ``name`` now: True when it is a new one (counted),
    False when one ended, ``None`` when nothing changed (nothing to say)."""
    with lock:
        if problem is None:
            return False if said.end(name) is not None else None
        if not said.start(name, problem):
            return None
        counts[problem] += 1
        return True


class NodeProblems:
    """Bad Node data seen by the cache, logged once per Node and problem and counted.

    ``seen(state)`` is called with each parsed Node (``NodeGpuState.problem``: why its telemetry
    is unusable); ``skipped(name, exc)`` when parsing a Node raised; ``judged(name, problem,
    detail)`` with each node judged (problems found at judging time: a time ahead of the clock,
    judging raised). ``counts`` maps a problem (or ``"skipped: <exception type>"``) to how many
    times a Node turned to it. A Node whose data is good again is logged once more, at INFO."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._current: SayOnce[str, str] = SayOnce()  # the cache's view, by node
        self._judged: SayOnce[str, str] = SayOnce()  # found at judging time, by node
        self._lock = threading.Lock()

    @property
    def flagged(self) -> Mapping[str, str]:
        """Names with a problem found at judging time on record (read-only use): the others
        need not be told that they judged well (``protocol.Extender.flagged``)."""
        return self._judged.current

    def judged(self, name: str, problem: str | None, detail: str = "") -> None:
        """Record the problem found while judging node ``name`` (``None``: none), logging and
        counting it when it is new for that node. Cheap when there is none, as for most."""
        if problem is None and name not in self._judged:
            return
        if _said(self._judged, self._lock, self.counts, name, problem) is None:
            return
        if problem is None:
            log.info("node {}: GPU telemetry judged usable again", name)
        else:
            log.warning("node {}: {} ({})", name, problem, detail)

    def _set(self, name: str, problem: str | None, detail: str = "") -> None:
        if _said(self._current, self._lock, self.counts, name, problem) is None:
            return
        if problem is None:
            log.info("node {}: GPU telemetry usable again", name)
        else:
            log.warning("node {}: {}{} (the node fails the filter)", name, problem, detail)

    def seen(self, state: NodeGpuState) -> NodeGpuState:
        """Record ``state`` (logging a new problem once) and return it."""
        self._set(state.name, state.problem)
        return state

    def skipped(self, name: str, exc: Exception) -> None:
        """Record a Node that could not be parsed at all (dropped from the cache)."""
        self._set(name, f"skipped: {type(exc).__name__}", f": {str(exc)[:200]}")


class LeaseProblems:
    """Leases the extender could not read (``nodeview.lease_from_object`` raised), logged once
    per Lease and problem (again at INFO once it reads well) and counted by problem."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._current: SayOnce[str, str] = SayOnce()
        self._lock = threading.Lock()

    def good(self, name: str) -> None:
        if _said(self._current, self._lock, self.counts, name, None) is None:
            return
        log.info("Lease {}: readable again", name)

    def skipped(self, name: str, exc: Exception) -> None:
        problem = str(exc)[:200]
        if _said(self._current, self._lock, self.counts, name, problem) is None:
            return
        log.warning("Lease {}: {} (skipped: the nodes naming it are stale)", name, problem)


def _answer(body: Any) -> Any:
    """A JSON response: orjson (a 5,000-node answer in ~0.2 ms; the standard encoder: ~2 ms),
    the standard encoder for what orjson refuses (a lone surrogate, an int over 64 bits)."""
    import orjson
    from starlette.responses import Response

    try:
        data = orjson.dumps(body)
    except TypeError:
        data = json.dumps(body, separators=(",", ":")).encode()
    return Response(data, media_type="application/json")


async def _read_args(request: Any) -> dict[str, Any] | tuple[int, str]:
    """The ExtenderArgs object of ``request``, or (HTTP status, reason) for a body that is not
    one (413 over ``MAX_BODY_BYTES``, 400 not a JSON object of the right shape)."""
    declared = request.headers.get("content-length", "")
    too_big = 413, f"bad ExtenderArgs: body larger than {MAX_BODY_BYTES} bytes"
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return too_big
        chunks.append(chunk)
    try:
        args = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return 400, "bad ExtenderArgs: not JSON"
    if not isinstance(args, dict):
        return 400, "bad ExtenderArgs: not a JSON object"
    problem = args_problem(args)
    return (400, f"bad ExtenderArgs: {problem}") if problem else args


def _verb(name: str, call: Callable[[Any], Any], refused: Callable[[int, str], Any],
          failed: Callable[[Exception], Any], threaded: bool = False) -> Any:  # fmt: skip
    """The endpoint of one verb: ``call(args)`` answered as JSON; a bad body answered by
    ``refused(status, reason)``; an exception logged and answered by ``failed(exc)`` (the
    scheduler always gets an answer). ``threaded``: run in a worker thread (it does I/O)."""
    from starlette.concurrency import run_in_threadpool

    async def endpoint(request: Any) -> Any:
        args = await _read_args(request)
        if isinstance(args, tuple):
            return refused(*args)
        try:
            return _answer(await run_in_threadpool(call, args) if threaded else call(args))
        except Exception as exc:  # noqa: BLE001 - answer the scheduler, never drop the request
            log.exception("{} failed", name)
            return failed(exc)

    return endpoint


def create_app(
    extender: Extender, registry: Any = None, preempt: Callable[[Any], Any] | None = None
) -> Any:
    """The Starlette app: ``POST /filter``, ``POST /prioritize``, ``POST /preempt`` (with
    ``preempt``: ExtenderPreemptionArgs -> ExtenderPreemptionResult, run in a worker thread:
    it reads the API server; ``scheduler.preempt``), ``GET /healthz``,
    ``GET /readyz`` (503 with the reason until the node cache has synced, and while its
    list+watch is dead or stalled: ``Extender.health``), and ``GET /metrics`` (Prometheus text,
    from ``registry``; absent without one)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    def no_filter(reason: str, status: int = 200) -> Any:
        body: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "Error": reason}
        return JSONResponse(body, status_code=status)

    def error(status: int, reason: str) -> Any:
        return JSONResponse({"Error": reason}, status_code=status)

    async def healthz(request: Any) -> Any:
        return PlainTextResponse("ok")

    async def readyz(request: Any) -> Any:
        if not extender.synced():
            return PlainTextResponse("node cache not synced", status_code=503)
        ok, reason = extender.health()
        return PlainTextResponse(reason, status_code=200 if ok else 503)

    routes: list[Any] = [
        Route("/filter", _verb("filter", extender.filter, lambda st, why: no_filter(why, st),
                               lambda exc: no_filter(f"omaticaya extender: {exc}")),
              methods=["POST"]),
        Route("/prioritize", _verb("prioritize", extender.prioritize, error,
                                   lambda exc: error(500, f"omaticaya extender: {exc}")),
              methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]  # fmt: skip
    if preempt is not None:  # no preemption rather than a failed scheduling cycle
        routes.append(Route("/preempt", _verb(
            "preempt", preempt, error, lambda exc: _answer({"NodeNameToMetaVictims": {}}),
            threaded=True), methods=["POST"]))  # fmt: skip
    if registry is not None:
        routes.append(metrics_route(registry))
    return Starlette(routes=routes)
