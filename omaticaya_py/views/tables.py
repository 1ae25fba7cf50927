"""The tables of ``omaticaya top``: rows of Nodes (or of their GPUs) as ``rich`` renderables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .fleet import GpuRow, NodeRow, short_uuid

if TYPE_CHECKING:
    from .options import TopOptions

__all__ = ["gpu_table", "node_table", "render"]

_HEALTH_STYLE = {
    "Healthy": "green",
    "Degraded": "yellow",
    "Unhealthy": "bold red",
    "Unknown": "red",
    "Invalid": "bold magenta",
}


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
    """One row per Node: health, GPUs healthy/total, free and total memory (GiB), utilisation,
    temperature, age of the reading; ``wide`` adds idle GPUs, free memory summed, product and
    the problem (a shared GPU not enforced by MPS included)."""
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
            cells += [
                "-" if r.idle is None else str(r.idle),
                _gib(r.free_total_mib),
                r.product or "-",
                _problem(r),
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


def _pods(g: GpuRow) -> str:
    """The pods holding a GPU (on a shared GPU each slice's used/limit GiB, ``OVER`` when it
    holds more than its slice), and its out-of-band memory where there is some."""
    if g.slices:
        text = ",".join(
            f"{s.pod} {'-' if s.used_mib is None else f'{s.used_mib / 1024:.1f}'}/"
            f"{s.limit_mib / 1024:.1f}GiB" + (" OVER" if s.over else "")
            for s in g.slices
        )
    else:
        text = ",".join(g.pods) or "-"
    if g.out_of_band_mib:
        text += f" +{g.out_of_band_mib / 1024:.1f}GiB out-of-band"
    return text


def _mps_marker(cell: Text, g: GpuRow) -> None:
    """After a shared GPU's ``shared``: ``mps`` (green) while its MPS daemon caps each slice,
    the reason in red while it does not (``mps-daemon-down``, ...); nothing when the telemetry
    does not say (enforcement off, an older agent)."""
    if g.mps == "up":
        cell.append(" mps", style="green")
    elif g.mps:
        cell.append(" " + g.mps, style="bold red")


def _problem(r: NodeRow) -> str:
    """The wide node table's PROBLEM: the row's own, else each GPU's reasons and a shared GPU's
    MPS enforcement when it is not up."""
    if r.problem:
        return r.problem
    parts = []
    for g in r.gpu_rows:
        why = [*g.reasons, *([g.mps] if g.shared and g.mps and g.mps != "up" else [])]
        if why:
            parts.append(f"gpu{g.index}: {' '.join(why)}")
    return ", ".join(parts)


def gpu_table(rows: list[NodeRow], wide: bool = False) -> Table:
    """One row per GPU of each Node: UUID (shortened unless ``wide``), a bar of used memory,
    free/total GiB, utilisation, temperature, processes, health with its reasons (and ``mig``,
    ``shared``, and on a shared GPU its MPS enforcement: ``mps`` or why not), and, where
    agents attribute their GPUs, the pods holding each (and memory held by processes in no
    pod; on a shared GPU, each slice's used/limit)."""
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
    # only where some agent attributes its GPUs: no empty column on 80 columns
    pods = any(g.pods or g.out_of_band_mib for r in rows for g in r.gpu_rows)
    if pods:
        table.add_column("PODS", overflow="fold", min_width=4)
    for r in rows:
        if not r.gpu_rows:
            table.add_row(
                r.name, "-", "-", Text("-"), "-", "-", "-", "-", _health(r.health),
                *(["-"] if pods else []),
            )
        for g in r.gpu_rows:
            health = _health(g.health)
            if g.reasons:
                health.append(" " + ",".join(g.reasons))
            if g.mig:
                health.append(" mig")
            if g.shared:
                health.append(" shared")
                _mps_marker(health, g)
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
                *([_pods(g)] if pods else []),
            )
    return table


def render(rows: list[NodeRow], options: TopOptions) -> Any:
    """The renderable for ``rows``: the node table, or the GPU table with ``gpus``."""
    wide = options.output == "wide"
    table = gpu_table(rows, wide) if options.gpus else node_table(rows, wide)
    if not rows:
        return Group(Text("No nodes with Omaticaya GPU data."), table)
    return table
