"""``omaticaya top`` (and ``kubectl omaticaya top``): a cluster-wide table of live GPU state.

One LIST of Nodes (and with ``watch``, the client's WATCH from its resourceVersion, redrawn on
each change and every ``interval_s``), rendered with ``rich`` (``tables``): colour only on a
terminal (``NO_COLOR`` is honoured), fitted to 80 columns when the output is not a terminal.
``-o json`` prints ``{"nodes": [...]}`` (one line per redraw with ``--watch``); ``-o wide`` adds
columns. The options and the rows they select are in ``options``. A node whose telemetry names
a Lease is fresh while its Lease is renewed (``leases``: the Leases of the namespaces named are
listed and, with ``watch``, watched), by the extender's rule (``core.liveness``). RBAC: ``list``
and ``watch`` on ``nodes``, and on ``leases`` in the agents' namespace.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console
from rich.live import Live

from ..core import schema
from ..core.liveness import Seen, observe
from ..kube import KubeError, KubeUnavailable
from ..kube.nodes_list import NodeLister, WatchExpired
from .fleet import NodeRow, to_json
from .leases import TopLeases
from .options import OUTPUTS, TopOptions, select_rows, top_options
from .tables import render

__all__ = ["OUTPUTS", "TopOptions", "render", "run_top", "select_rows", "top_options"]


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
    """When ``top`` saw each Node's ``read_at`` take its value (``core.liveness.observe``, on
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
    lister: NodeLister | None = None,
    leases: TopLeases | None = None,
) -> int:
    """``omaticaya top``: 0 when shown (a watch ended by Ctrl-C too); 1 when the API server
    cannot be read (one line on stderr). Leases that cannot be read: one line on stderr, and
    the nodes naming them are judged by ``read_at``."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    own = lister is None
    own_leases = leases is None
    try:
        lister = lister or NodeLister(kubeconfig=options.kubeconfig, context=options.context)
        leases = leases or TopLeases(
            kubeconfig=options.kubeconfig, context=options.context,
            warn=lambda line: print(f"omaticaya top: {line}", file=err),
        )  # fmt: skip
        try:
            return _top(lister, leases, options, out, clock)
        finally:
            if own:
                lister.close()
            if own_leases:
                leases.close()
    except KubeError as exc:
        print(f"omaticaya top: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        return 0


def _top(
    lister: NodeLister,
    leases: TopLeases,
    options: TopOptions,
    out: IO[str],
    clock: Callable[[], float],
) -> int:
    items, version = lister.list(options.selector)
    nodes = {n.name: n for n in items}
    sightings = Sightings(options.prefix)
    for node in items:
        sightings.see(node)
    as_json = options.output == "json"

    def rows_now() -> list[NodeRow]:
        leases.follow(sightings.namespaces())
        return select_rows(
            nodes.values(), options, clock(), leases=leases, seen=sightings.seen,
            now_mono=time.monotonic(),
        )  # fmt: skip

    if not options.watch:
        rows = rows_now()
        if as_json:
            _emit_json(rows, out, one_line=False)
        else:
            _console(out, options.output == "wide").print(render(rows, options))
        return 0

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

    try:
        draw()
        interval = max(1, int(options.interval_s))
        while True:
            try:
                changed = False
                for kind, node, rv in lister.watch(version, options.selector, interval):
                    version = rv or version
                    if kind == "DELETED":
                        nodes.pop(node.name, None)
                        sightings.drop(node.name)
                    else:
                        nodes[node.name] = node
                        sightings.see(node)
                    changed = True
                    draw()
                if not changed:  # the server ended a quiet watch: ages moved on
                    draw()
            except (WatchExpired, KubeUnavailable):  # expired, or the watch dropped: list again
                items, version = lister.list(options.selector)
                for name in set(nodes) - {n.name for n in items}:
                    sightings.drop(name)
                nodes = {n.name: n for n in items}
                for node in items:
                    sightings.see(node)
                draw()
    finally:
        if live is not None:
            live.stop()
