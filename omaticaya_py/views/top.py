"""``omaticaya top`` (and ``kubectl omaticaya top``): a cluster-wide table of live GPU state.

The Nodes come through ``NodeFeed``, one ``kube.NodeCache`` (the list+watch informer): its
first LIST for one table, and with ``watch`` its changes, redrawn on each batch of changes and
every ``interval_s``; rendered with ``rich`` (``tables``): colour only on a
terminal (``NO_COLOR`` is honoured), fitted to 80 columns when the output is not a terminal.
``-o json`` prints ``{"nodes": [...]}`` (one line per redraw with ``--watch``); ``-o wide`` adds
columns. The options and the rows they select are in ``options``. A node whose telemetry names
a Lease is fresh while its Lease is renewed (``leases``: the Leases of the namespaces named are
listed and, with ``watch``, watched), by the extender's rule (``core.rules.liveness``). RBAC: ``list``
and ``watch`` on ``nodes``, and on ``leases`` in the agents' namespace.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console
from rich.live import Live

from ..core import schema
from ..core.publish.patch import NodeMeta
from ..core.rules.liveness import Seen, observe
from ..kube import KubeError, KubeUnavailable, NodeCache
from ..kube.errors import is_transient
from .fleet import NodeRow, to_json
from .leases import TopLeases
from .options import OUTPUTS, TopOptions, select_rows, top_options
from .tables import render

__all__ = ["OUTPUTS", "NodeFeed", "TopOptions", "render", "run_top", "select_rows", "top_options"]

#: what ``top`` needs, said in the message of a refused (403) LIST or WATCH
RBAC = "omaticaya top needs list and watch on nodes"


class NodeFeed:
    """The Nodes ``top`` shows (those matching ``options.selector``), as ``NodeMeta``: one
    ``kube.NodeCache`` (``factory``; list+watch in its own thread, context and kubeconfig from
    ``options``), whose changes are queued for the drawing thread.

    ``start(wait_s)`` returns every Node by name once the first LIST is stored; it raises the
    ``KubeError`` of a refusal (401, 403, another 4xx) at once, and the last transient one
    (no answer, 429, 5xx) when no LIST succeeded within ``wait_s`` seconds. ``changes(timeout_s)``
    returns the changes since the last call, ``(name, node)`` (``None``: gone), waiting up to
    ``timeout_s`` seconds for the first (``[]``: none came). Failures after the first LIST are the
    cache's: it retries, and ``top`` keeps showing what it has."""

    def __init__(self, options: TopOptions, *, factory: Callable[..., Any] = NodeCache) -> None:
        self._changes: queue.SimpleQueue[tuple[str, NodeMeta | None]] = queue.SimpleQueue()
        self._last_error: KubeError | None = None
        self._failed = threading.Event()
        self._cache = factory(
            lambda node: node,
            query={"labelSelector": options.selector} if options.selector else {},
            kubeconfig=options.kubeconfig,
            context=options.context,
            on_change=lambda name, old, new: self._changes.put((name, new)),
            on_error=self._error,
            rbac=RBAC,
        )

    def _error(self, err: KubeError) -> None:
        self._last_error = err
        if not is_transient(err) and err.status is not None:
            self._failed.set()  # refused: no point in waiting for the retries

    def start(self, wait_s: float = 30.0) -> dict[str, NodeMeta]:
        """Start the cache; every Node by name once its first LIST is stored (see the class)."""
        self._cache.start()
        deadline = time.monotonic() + wait_s
        while not self._cache.synced and not self._failed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._last_error or KubeUnavailable(
                    f"list nodes: no answer in {wait_s:g}s", verb="list"
                )
            self._cache.wait_synced(min(left, 0.05))
        if not self._cache.synced:
            raise self._last_error  # type: ignore[misc]  # set with _failed
        self._drain()  # the first LIST's own changes: the snapshot holds them
        return self._cache.snapshot()

    def _drain(self) -> list[tuple[str, NodeMeta | None]]:
        out = []
        while True:
            try:
                out.append(self._changes.get_nowait())
            except queue.Empty:
                return out

    def changes(self, timeout_s: float) -> list[tuple[str, NodeMeta | None]]:
        """The changes since the last call (see the class)."""
        try:
            first = self._changes.get(timeout=timeout_s)
        except queue.Empty:
            return []
        return [first, *self._drain()]

    def close(self) -> None:
        """Stop the cache (its open WATCH ends at once)."""
        self._cache.stop(timeout_s=1.0)


def _console(stream: IO[str], wide: bool = False) -> Console:
    """rich's console: colour and width from the terminal; no colour when the output is not a
    terminal (a pipe, a file), and then 80 columns (``wide``: as wide as the table needs)."""
    if stream.isatty():
        return Console(file=stream, highlight=False)
    width = 400 if wide else 80
    return Console(file=stream, highlight=False, width=width, color_system=None, no_color=True)


def _emit_json(rows: list[NodeRow], stream: IO[str], one_line: bool) -> None:
    doc = to_json(rows)
    stream.write(
        (json.dumps(doc, separators=(",", ":")) if one_line else json.dumps(doc, indent=2)) + "\n"
    )
    stream.flush()


class Sightings:
    """When ``top`` saw each Node's ``read_at`` take its value (``core.rules.liveness.observe``, on
    ``monotonic``), and the Lease each names; ``see(node)`` with every Node listed or changed."""

    def __init__(self, prefix: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._prefix = prefix
        self._monotonic = monotonic
        self._by: dict[str, tuple[float | None, Seen | None, str | None]] = {}

    def see(self, node: Any) -> None:
        state = schema.parse_node(node.name, node.labels, node.annotations, self._prefix)
        before, seen, _ = self._by.get(node.name, (None, None, None))
        seen = observe(before, seen, state.read_at, self._monotonic())
        self._by[node.name] = (state.read_at, seen, state.lease)

    def drop(self, name: str) -> None:
        self._by.pop(name, None)

    def seen(self, name: str) -> Seen | None:
        return self._by.get(name, (None, None, None))[1]

    def namespaces(self) -> set[str]:
        """The namespaces of the Leases the Nodes name."""
        return {ref.partition("/")[0] for _, _, ref in self._by.values() if ref}


def run_top(
    options: TopOptions,
    *,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    clock: Callable[[], float] = time.time,
    feeds: Callable[[TopOptions], Any] = NodeFeed,
    leases: TopLeases | None = None,
) -> int:
    """``omaticaya top``: 0 when shown (a watch ended by Ctrl-C too); 1 when the API server
    cannot be read (one line on stderr). Leases that cannot be read: one line on stderr, and
    the nodes naming them are judged by ``read_at``. ``feeds``: builds the ``NodeFeed``."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    own_leases = leases is None
    try:
        feed = feeds(options)
        leases = leases or TopLeases(
            kubeconfig=options.kubeconfig, context=options.context,
            warn=lambda line: print(f"omaticaya top: {line}", file=err),
        )  # fmt: skip
        try:
            return _top(feed, leases, options, out, clock)
        finally:
            feed.close()
            if own_leases:
                leases.close()
    except KubeError as exc:
        print(f"omaticaya top: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        return 0


def _top(
    feed: NodeFeed,
    leases: TopLeases,
    options: TopOptions,
    out: IO[str],
    clock: Callable[[], float],
) -> int:
    """The Nodes of ``feed`` shown once, or watched (``options.watch``) until interrupted;
    Leases read through ``leases``, ages by ``clock`` (epoch seconds). Returns 0."""
    nodes = feed.start()
    sightings = Sightings(options.prefix)
    for node in nodes.values():
        sightings.see(node)

    def rows_now() -> list[NodeRow]:
        leases.follow(sightings.namespaces())
        return select_rows(
            nodes.values(), options, clock(), leases=leases, seen=sightings.seen,
            now_mono=time.monotonic(),
        )  # fmt: skip

    if not options.watch:
        rows = rows_now()
        if options.output == "json":
            _emit_json(rows, out, one_line=False)
        else:
            _console(out, options.output == "wide").print(render(rows, options))
        return 0
    _watch(feed, nodes, sightings, rows_now, options, out)
    return 0


def _watch(
    feed: NodeFeed,
    nodes: dict[str, NodeMeta],
    sightings: Sightings,
    rows_now: Callable[[], list[NodeRow]],
    options: TopOptions,
    out: IO[str],
) -> None:
    """Draw ``rows_now()`` on ``out``, then again after each batch of the ``feed``'s changes
    (kept in ``nodes`` and ``sightings``) or every ``options.interval_s`` seconds (ages move
    on); in place on a terminal, JSON lines with ``-o json``. Ends only by an exception
    (Ctrl-C)."""
    as_json = options.output == "json"
    console = _console(out, options.output == "wide")
    live: Live | None = None
    if not as_json and out.isatty():
        live = Live(console=console, auto_refresh=False, screen=False)
        live.start()

    def draw() -> None:
        rows = rows_now()
        if as_json:
            _emit_json(rows, out, one_line=True)
        elif live is not None:
            live.update(render(rows, options), refresh=True)
        else:
            console.print(render(rows, options))
            console.print()
            out.flush()

    node: NodeMeta | None  # each change (None: deleted)
    try:
        draw()
        interval = max(1, int(options.interval_s))
        while True:
            # a batch of changes, or none within the interval (then ages moved on): a redraw
            for name, node in feed.changes(interval):
                if node is None:
                    nodes.pop(name, None)
                    sightings.drop(name)
                else:
                    nodes[name] = node
                    sightings.see(node)
            draw()
    finally:
        if live is not None:
            live.stop()
