"""What ``omaticaya top`` shows: its options (``TopOptions``, from the flags) and the rows
they select from the Nodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.rules.liveness import Seen
from .fleet import (
    GRACE_S,
    TTL_S,
    LeaseView,
    NodeRow,
    RowContext,
    filter_rows,
    fleet_rows,
    sort_rows,
)

__all__ = ["OUTPUTS", "TopOptions", "select_rows", "top_options"]

OUTPUTS = ("table", "wide", "json")


@dataclass(frozen=True)
class TopOptions:
    """The flags of ``omaticaya top``: where to read (``kubeconfig``, ``context``, ``selector``),
    how to show (``output``: one of ``OUTPUTS``; ``sort``: name, free, util or age; ``gpus``: a
    row per GPU), which rows (``unhealthy``, ``stale``, ``all_nodes``: also Nodes without data),
    ``watch`` (redrawn at least every ``interval_s`` seconds), the label ``prefix``, and when a
    reading is stale: by the extender's rule (``core.rules.liveness``), with ``grace_s`` past its
    expiry or its Lease's, or ``ttl_s`` + ``grace_s`` from an agent that publishes no expiry."""

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


def select_rows(
    nodes: Any,
    options: TopOptions,
    now: float,
    *,
    leases: LeaseView | None = None,
    seen: Callable[[str], Seen | None] | None = None,
    now_mono: float | None = None,
) -> list[NodeRow]:
    """Nodes -> the rows shown: parsed, judged (``leases``, ``seen``, ``now_mono`` as
    ``fleet.node_row``), filtered and sorted as the options say."""
    context = RowContext(now, options.prefix, options.grace_s, options.ttl_s, leases, now_mono)
    rows = fleet_rows(nodes, context, include_unknown=options.all_nodes, seen=seen)
    rows = filter_rows(rows, unhealthy=options.unhealthy, stale=options.stale)
    return sort_rows(rows, options.sort)


def top_options(flags: dict[str, Any], environ: dict[str, str] | None = None) -> TopOptions:
    """``TopOptions`` from the parsed flags of ``omaticaya top`` (unknown keys ignored; the
    prefix from ``--prefix``, else ``$OMATICAYA_PREFIX``, else ``omaticaya.io``)."""
    import os

    env = os.environ if environ is None else environ
    known = {k: v for k, v in flags.items() if k in TopOptions.__dataclass_fields__}
    known["prefix"] = known.get("prefix") or env.get("OMATICAYA_PREFIX") or "omaticaya.io"
    return TopOptions(**known)
