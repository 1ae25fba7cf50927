"""``omaticaya top`` (and ``kubectl omaticaya top``): a cluster-wide table of live GPU state.

One LIST of Nodes (and with ``watch``, the client's WATCH from its resourceVersion, redrawn on
each change and every ``interval_s``), rendered with ``rich`` (``tables``): colour only on a
terminal (``NO_COLOR`` is honoured), fitted to 80 columns when the output is not a terminal.
``-o json`` prints ``{"nodes": [...]}`` (one line per redraw with ``--watch``); ``-o wide`` adds
columns. The options and the rows they select are in ``options``. RBAC: ``list`` and ``watch``
on ``nodes``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import IO

from rich.console import Console
from rich.live import Live

from ..kube import KubeError, KubeUnavailable
from ..kube.nodes_list import NodeLister, WatchExpired
from .fleet import NodeRow, to_json
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


def run_top(
    options: TopOptions,
    *,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    clock: Callable[[], float] = time.time,
    lister: NodeLister | None = None,
) -> int:
    """``omaticaya top``: 0 when shown (a watch ended by Ctrl-C too); 1 when the API server
    cannot be read (one line on stderr)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    own = lister is None
    try:
        lister = lister or NodeLister(kubeconfig=options.kubeconfig, context=options.context)
        try:
            return _top(lister, options, out, clock)
        finally:
            if own:
                lister.close()
    except KubeError as exc:
        print(f"omaticaya top: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        return 0


def _top(lister: NodeLister, options: TopOptions, out: IO[str], clock: Callable[[], float]) -> int:
    items, version = lister.list(options.selector)
    nodes = {n.name: n for n in items}
    as_json = options.output == "json"
    if not options.watch:
        rows = select_rows(nodes.values(), options, clock())
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
        rows = select_rows(nodes.values(), options, clock())
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
                    else:
                        nodes[node.name] = node
                    changed = True
                    draw()
                if not changed:  # the server ended a quiet watch: ages moved on
                    draw()
            except (WatchExpired, KubeUnavailable):  # expired, or the watch dropped: list again
                items, version = lister.list(options.selector)
                nodes = {n.name: n for n in items}
                draw()
    finally:
        if live is not None:
            live.stop()
