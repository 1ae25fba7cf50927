"""``omaticaya top`` (and ``kubectl omaticaya top``): a cluster-wide table of live GPU state.

One LIST of Nodes (and with ``watch``, the client's WATCH from its resourceVersion, redrawn on
each change and every ``interval_s``), rendered with ``rich``: colour only on a terminal
(``NO_COLOR`` is honoured), fitted to 80 columns when the output is not a terminal. ``-o json``
prints ``{"nodes": [...]}`` (one line per redraw with ``--watch``); ``-o wide`` adds columns.
RBAC: ``list`` and ``watch`` on ``nodes``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..kube import KubeError, KubeUnavailable
from ..kube.nodes_list import NodeLister, WatchExpired
from .fleet import (
    GRACE_S,
    TTL_S,
    GpuRow,
    NodeRow,
    filter_rows,
    fleet_rows,
    short_uuid,
    sort_rows,
    to_json,
)

__all__ = ["OUTPUTS", "TopOptions", "render", "run_top", "select_rows"]

OUTPUTS = ("table", "wide", "json")
_HEALTH_STYLE = {
    "Healthy": "green",
    "Degraded": "yellow",
    "Unhealthy": "bold red",
    "Unknown": "red",
    "Invalid": "bold magenta",
}


@dataclass(frozen=True)
class TopOptions:
    kubeconfig: str | None = None
    context: str | None = None
    selector: str | None = None
    output: str = "table"
    sort: str = "name"
    gpus: bool = False
    unhealthy: bool = False
    stale: bool = False
    all_nodes: bool = False
    watch: bool = False
    interval_s: float = 10.0
    prefix: str = "omaticaya.io"
    grace_s: float = GRACE_S
    ttl_s: float = TTL_S


def select_rows(nodes: Any, options: TopOptions, now: float) -> list[NodeRow]:
    """Nodes -> the rows shown: parsed, filtered and sorted as the options say."""
    rows = fleet_rows(
        nodes,
        now=now,
        prefix=options.prefix,
        grace_s=options.grace_s,
        ttl_s=options.ttl_s,
        include_unknown=options.all_nodes,
    )
    rows = filter_rows(rows, unhealthy=options.unhealthy, stale=options.stale)
    return sort_rows(rows, options.sort)


# -- cells -------------------------------------------------------------------------------


def _gib(mib: int | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}Gi"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _age(seconds: float | None) -> str:
    """kubectl's style: 45s, 12m, 3h, 4d (a reading from the future: 0s)."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 2 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _health(health: str | None) -> Text:
    text = health or "-"
    return Text(text, style=_HEALTH_STYLE.get(text, ""))


def _age_cell(row: NodeRow) -> Text:
    age = Text(_age(row.age_s))
    if row.stale:
        age.append(" STALE", style="bold red")
    return age


def _gpus_cell(row: NodeRow) -> Text:
    if row.gpus is None and row.healthy is None:
        return Text("-")
    healthy = "-" if row.healthy is None else str(row.healthy)
    total = "-" if row.gpus is None else str(row.gpus)
    style = "" if row.healthy is not None and row.healthy == row.gpus else "yellow"
    return Text(f"{healthy}/{total}", style=style)


def _table(gap: int = 2) -> Table:
    """A borderless table, ``gap`` spaces between columns."""
    return Table(
        box=box.SIMPLE_HEAD,
        padding=(0, gap - 1, 0, 0),  # the divider is one space
        pad_edge=False,
        show_edge=False,
        header_style="bold",
    )


def _col(table: Table, header: str, width: int, right: bool = False) -> None:
    """A column that keeps ``width`` (only the node's name gives way on a narrow terminal)."""
    table.add_column(
        header, justify="right" if right else "left", no_wrap=True, min_width=width
    )


def node_table(rows: list[NodeRow], wide: bool = False) -> Table:
    table = _table()
    table.add_column("NODE", no_wrap=True, overflow="ellipsis", max_width=None if wide else 24)
    _col(table, "HEALTH", 9)
    _col(table, "GPUS", 4, right=True)
    _col(table, "FREE", 6, right=True)
    _col(table, "TOTAL", 6, right=True)
    _col(table, "UTIL", 4, right=True)
    _col(table, "TEMP", 4, right=True)
    _col(table, "AGE", 8)
    if wide:
        _col(table, "IDLE", 4, right=True)
        _col(table, "FREE-SUM", 8, right=True)
        _col(table, "PRODUCT", 12)
        table.add_column("PROBLEM", min_width=10)
    for r in rows:
        cells: list[Any] = [
            r.name,
            _health(r.health),
            _gpus_cell(r),
            _gib(r.free_mib),
            _gib(r.total_mib),
            _pct(r.util_pct),
            "-" if r.temperature_c is None else f"{r.temperature_c}C",
            _age_cell(r),
        ]
        if wide:
            problem = r.problem or ", ".join(
                f"gpu{g.index}: {' '.join(g.reasons)}" for g in r.gpu_rows if g.reasons
            )
            cells += [
                "-" if r.idle is None else str(r.idle),
                _gib(r.free_total_mib),
                r.product or "-",
                problem or "",
            ]
        table.add_row(*cells)
    return table


def _memory_bar(g: GpuRow) -> Any:
    if g.free_mib is None or not g.total_mib or g.total_mib <= 0:
        return Text("-")
    used = min(max(g.total_mib - g.free_mib, 0), g.total_mib)
    return ProgressBar(total=g.total_mib, completed=used, width=8)


def _free_total(g: GpuRow) -> str:
    """``40.0/79.6``: free / total memory in GiB."""

    def gib(mib: int | None) -> str:
        return "-" if mib is None else f"{mib / 1024:.1f}"

    return f"{gib(g.free_mib)}/{gib(g.total_mib)}"


def gpu_table(rows: list[NodeRow], wide: bool = False) -> Table:
    table = _table(gap=1)
    table.add_column("NODE", no_wrap=True, overflow="ellipsis", max_width=None if wide else 18)
    _col(table, "GPU", 3, right=True)
    _col(table, "UUID", 40 if wide else 8)
    _col(table, "USED", 8)
    _col(table, "GIB-FREE", 9, right=True)
    _col(table, "UTIL", 4, right=True)
    _col(table, "TEMP", 4, right=True)
    _col(table, "PROC", 4, right=True)
    table.add_column("HEALTH", overflow="fold", min_width=13)  # remap-pending
    for r in rows:
        if not r.gpu_rows:
            table.add_row(r.name, "-", "-", Text("-"), "-", "-", "-", "-", _health(r.health))
        for g in r.gpu_rows:
            health = _health(g.health)
            if g.reasons:
                health.append(" " + ",".join(g.reasons))
            if g.mig:
                health.append(" mig")
            uuid = (g.uuid or "-") if wide else (short_uuid(g.uuid) or "-")
            table.add_row(
                r.name,
                str(g.index),
                uuid,
                _memory_bar(g),
                _free_total(g),
                _pct(g.util_pct),
                "-" if g.temperature_c is None else f"{g.temperature_c}C",
                "-" if g.processes is None else str(g.processes),
                health,
            )
    return table


def render(rows: list[NodeRow], options: TopOptions) -> Any:
    """The renderable for ``rows``: the node table, or the GPU table with ``gpus``."""
    wide = options.output == "wide"
    table = gpu_table(rows, wide) if options.gpus else node_table(rows, wide)
    if not rows:
        return Group(Text("No nodes with Omaticaya GPU data."), table)
    return table


# -- the command -------------------------------------------------------------------------


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


def top_options(flags: dict[str, Any], environ: dict[str, str] | None = None) -> TopOptions:
    """``TopOptions`` from the parsed flags of ``omaticaya top`` (unknown keys ignored; the
    prefix from ``--prefix``, else ``$OMATICAYA_PREFIX``, else ``omaticaya.io``)."""
    import os

    env = os.environ if environ is None else environ
    known = {k: v for k, v in flags.items() if k in TopOptions.__dataclass_fields__}
    known["prefix"] = known.get("prefix") or env.get("OMATICAYA_PREFIX") or "omaticaya.io"
    return TopOptions(**known)
