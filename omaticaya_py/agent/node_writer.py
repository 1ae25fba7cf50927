"""The Node writer: brings the Node's labels and telemetry to the desired state, within budget.

The Node's metadata is cached from the last GET or merge-patch response, so a tick in which no
value changed sends no request at all. The telemetry annotation goes with any label change
(``core.publish.patch.volatile_due``), and with the heartbeat where no Lease carries liveness. Each
patch response is checked against the desired state, so a Node that was re-created or edited by
hand is put right at once. The write budget (``min_patch_interval_s``, decided by
``core.publish.publisher.Publisher`` with ``core.publish.node_budget``, as for the ResourceSlice) holds
back a change that makes the Node more attractive until that label has been calm (not got
worse) for an interval, and the last patch is an interval old or a patch goes anyway
(``core.publish.budget.held_keys``, each label on its own clock: a neighbour GPU's churn never holds a
recovered GPU's labels); one that makes it less attractive goes at once. The telemetry also
follows what no label shows (``core.publish.budget.telemetry_change``): a GPU's exact free memory down
by more than ``telemetry_free_drop_mib`` or a new pod holding it rewrites it at once, the same
rise or a holder leaving once each unit that rose has been calm for an interval (per GPU or MIG
device) and the budget lets a change for the better go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from loguru import logger

from ..core.config.settings import Settings
from ..core.model.sharing import Sharing, is_shared
from ..core.model.snapshot import NodeSnapshot
from ..core.model.window import PeakWindow
from ..core.publish.budget import UnitMark
from ..core.publish.node_budget import NodeKey, calm_changes, labels_within_budget, telemetry_behind
from ..core.publish.patch import (
    MergePatch,
    NodeMeta,
    apply_patch,
    diff,
    diff_section,
    removal_patch,
    volatile_due,
)
from ..core.publish.publisher import Publisher
from ..core.publish.render import Desired, is_static, telemetry_annotation
from ..core.publish.render_telemetry import UnitKey, published_marks, telemetry_marks
from ..core.rules.attribution import GpuAttribution
from ..core.rules.health import NodeHealth
from ..core.schema import TELEMETRY, Telemetry
from ..kube import NodeClient
from .heartbeat import Heartbeat
from .state import SnapshotCache

__all__ = ["NodeWriter", "TelemetryFeed", "remove_keys"]


@dataclass(frozen=True, slots=True)
class TelemetryFeed:
    """What the Node's telemetry annotation carries besides the reading: ``refresh_s`` (the
    longest it goes unrewritten, published in annotation-heartbeat mode, seconds), ``window``
    (the peak signal, ``None``: off) and ``mps`` (shared GPU UUIDs -> their MPS enforcement
    now, ``"up"`` or the reason it is not, asked once per write for the ``mps`` fields,
    ``agent.events.mps_enforcement``; ``None``: enforcement off)."""

    refresh_s: float
    window: PeakWindow | None = None
    mps: Callable[[Iterable[str]], Mapping[str, str]] | None = None


@dataclass(frozen=True, slots=True)
class _Tick:
    """One write's inputs for the telemetry: the reading, its health, who uses each GPU, the
    shared GPUs' MPS enforcement (by UUID; ``None``: off)."""

    snapshot: NodeSnapshot
    health: NodeHealth
    attribution: Mapping[str, GpuAttribution] | None
    mps: Mapping[str, str] | None


class NodeWriter:
    """Writes one Node through ``node`` (``None``: no API; patches are applied to a local copy;
    ``dry_run``: computed, never sent), its telemetry fed by ``feed``. Times are the agent's
    monotonic seconds. Methods raise ``KubeError`` from the edge.

    What goes when is ``publisher``'s (``core.publish.publisher.Publisher``, keyed by label key
    and telemetry unit, ``core.publish.node_budget``); this class reads the Node, asks it, and
    sends the patch."""

    def __init__(
        self,
        settings: Settings,
        node: NodeClient | None,
        heartbeat: Heartbeat,
        cache: SnapshotCache,
        feed: TelemetryFeed,
        *,
        dry_run: bool = False,
    ) -> None:
        self.settings, self.node, self.heartbeat, self.cache = settings, node, heartbeat, cache
        self.feed = feed
        self.dry_run = dry_run
        self.telemetry_key = f"{settings.prefix}/{TELEMETRY}"
        self.meta: NodeMeta | None = None
        #: the write budget of the Node: each label key's and telemetry unit's calm clock, the
        #: last patch
        self.publisher: Publisher[NodeKey] = Publisher(settings.min_patch_interval_s)
        self._last_desired: dict[str, str] | None = None
        #: the last tick's telemetry marks, and the Node's annotation with its marks (parsed
        #: once per value)
        self._last_marks: dict[UnitKey, UnitMark] | None = None
        self._published: tuple[str, dict[UnitKey, UnitMark]] | None = None

    @property
    def mps(self) -> Callable[[Iterable[str]], Mapping[str, str]] | None:
        """The MPS enforcement the telemetry asks (``TelemetryFeed.mps``)."""
        return self.feed.mps

    @property
    def last_patch_s(self) -> float | None:
        """When the Node was last patched (``None``: not yet: nothing is held)."""
        return self.publisher.last_write_s

    @last_patch_s.setter
    def last_patch_s(self, value: float | None) -> None:
        self.publisher = replace(self.publisher, last_write_s=value)

    def forget(self) -> None:
        """Drop the cached Node: the next write reads it first (re-created or edited)."""
        self.meta = None

    def current(self) -> NodeMeta:
        """The Node as last seen (GET when not cached)."""
        if self.meta is None:
            if self.node is None:
                self.meta = NodeMeta(name=self.settings.node_name or "")
            else:
                self.meta = self.node.get_node()
        return self.meta

    def write(
        self,
        desired: Desired,
        snapshot: NodeSnapshot,
        health: NodeHealth,
        now_s: float,
        attribution: Mapping[str, GpuAttribution] | None = None,
    ) -> tuple[Desired, MergePatch | None, bool]:
        """``(desired with its telemetry, the patch computed or None, whether it was sent)``;
        ``attribution`` (who uses each GPU) goes into the telemetry."""
        drop_mib = self.settings.telemetry_free_drop_mib
        sharing = Sharing.of(self.settings)
        mps = (
            self.mps([g.uuid for g in snapshot.gpus if g.uuid and is_shared(g, sharing)])
            if self.mps is not None else None
        )  # fmt: skip
        marks = telemetry_marks(snapshot, attribution, sharing, mps)
        self.publisher = self.publisher.noted(
            calm_changes(self._last_desired, desired.labels, self._last_marks, marks, drop_mib),
            now_s,
        )
        self._last_desired, self._last_marks = dict(desired.labels), marks
        current = self.current()
        on_node = current.annotations.get(self.telemetry_key)
        refresh = self.heartbeat.refresh(now_s, on_node) or self._telemetry_behind(
            on_node, marks, now_s
        )
        desired = self._within_budget(desired, current, now_s, going=refresh)
        desired = self._with_telemetry(
            desired, _Tick(snapshot, health, attribution, mps), current, refresh
        )
        patch = self._diff(desired, current, refresh)
        sent = False
        if patch is not None and not self.dry_run and self.node is not None:
            self._send(patch, now_s)
            sent = True
            again = self._diff(desired, self.meta, refresh=False)  # type: ignore[arg-type]
            if again is not None:  # re-created or edited behind our back
                self._send(again, now_s)
        elif patch is not None and self.node is None:
            self.meta = apply_patch(current, patch)
        return desired, patch, sent

    def _with_telemetry(
        self, desired: Desired, tick: _Tick, current: NodeMeta, refresh: bool
    ) -> Desired:
        """``desired`` with the telemetry annotation: built afresh only when the patch will
        carry it (``core.publish.patch.volatile_due``), else the Node's own value, so that a quiet tick
        costs no JSON encoding."""
        key, prefix = self.telemetry_key, self.settings.prefix
        label_changes = bool(diff_section(desired.labels, current.labels, prefix))
        if volatile_due(label_changes, key in current.annotations, refresh):
            lease = self.heartbeat.lease
            annotations, bad = telemetry_annotation(
                tick.snapshot,
                tick.health,
                prefix,
                refresh_s=None if lease is not None else self.feed.refresh_s,
                lease=lease.ref if lease is not None else None,
                window=self.feed.window,
                attribution=tick.attribution,
                sharing=Sharing.of(self.settings),
                mps=tick.mps,
            )
            for k, v in bad:
                logger.warning("dropped invalid annotation {}={!r}", k, v)
        else:
            annotations = {key: current.annotations[key]}
        return replace(desired, annotations=annotations)

    def _telemetry_behind(
        self, on_node: str | None, marks: dict[UnitKey, UnitMark], now_s: float
    ) -> bool:
        """Whether the telemetry on the Node (``on_node``) must be rewritten though no label
        changed (``core.publish.node_budget.telemetry_behind``). A value on the Node that
        cannot be read counts as publishing nothing."""
        if on_node is None:
            return False  # missing: written anyway (core.publish.patch.volatile_due)
        if self._published is None or self._published[0] != on_node:
            doc, _ = Telemetry.parse(on_node)
            self._published = (on_node, published_marks(doc) if doc is not None else {})
        return telemetry_behind(self._published[1], marks, self.publisher, now_s,
                                self.settings.telemetry_free_drop_mib)  # fmt: skip

    def _diff(self, desired: Desired, current: NodeMeta, refresh: bool) -> MergePatch | None:
        return diff(
            desired.labels,
            desired.annotations,
            current,
            self.settings.prefix,
            volatile=(self.telemetry_key,),
            refresh=refresh,
        )

    def _send(self, patch: MergePatch, now_s: float) -> None:
        assert self.node is not None
        before = self.meta
        self.meta = self.node.patch_node(patch)
        self.cache.patches_sent += 1
        self.cache.labels_changed += len(patch["metadata"].get("labels", {}))
        self.cache.last_patch_wall_s = time.time()
        self.publisher = self.publisher.wrote(now_s)
        if self.telemetry_key in patch["metadata"].get("annotations", {}):
            self.heartbeat.telemetry_at_s = now_s
        if before is not None and before.uid and self.meta.uid != before.uid:
            logger.warning("Node {} was re-created (uid changed): relabelling", self.meta.name)

    def _within_budget(
        self, desired: Desired, current: NodeMeta, now_s: float, going: bool = False
    ) -> Desired:
        """The write budget: ``desired`` with its changes for the better held back (the Node's
        values kept) per label (``core.publish.node_budget.labels_within_budget``). Changes for
        the worse always go. Never held: with the budget off, at an annotation heartbeat, the
        first patch."""
        mine = self.settings.prefix + "/"
        before = {k: v for k, v in current.labels.items() if k.startswith(mine)}
        labels = labels_within_budget(
            before, desired.labels, self.publisher, now_s, going=going,
            hold=not self.heartbeat.annotation_due(now_s),
        )  # fmt: skip
        if labels is None or labels == desired.labels:
            return desired
        self.cache.patches_held += 1
        logger.debug(
            "write budget: holding back {} label changes",
            len(diff_section(desired.labels, labels, self.settings.prefix)),
        )
        return replace(desired, labels=labels)

    def cleanup(self, *, keep_static: bool) -> MergePatch | None:
        """Remove our keys from the Node: the dynamic ones (``keep_static``) or all of them.

        Reads the Node first (the cache may be stale after an outage). Returns the patch sent,
        or ``None`` when there was nothing to remove (or no API)."""
        if self.node is None:
            return None
        patch, meta = remove_keys(
            self.node, self.settings.prefix, keep_static=keep_static, dry_run=self.dry_run
        )
        if meta is not None:
            self.meta = meta
        return patch


def remove_keys(
    node: NodeClient, prefix: str, *, keep_static: bool, dry_run: bool = False
) -> tuple[MergePatch | None, NodeMeta | None]:
    """Remove every key under ``prefix`` from the Node (the hardware-fact labels stay with
    ``keep_static``), reading it first: the cache may be stale after an outage. Returns the
    patch (``None``: nothing to remove) and the Node as the patch left it (``None``: nothing
    sent, or ``dry_run``). Raises ``KubeError``."""
    current = node.get_node()
    keep = [k for k in current.labels if keep_static and is_static(k, prefix)]
    patch = removal_patch(current, prefix, keep=keep)
    if patch is None or dry_run:
        return patch, None
    return patch, node.patch_node(patch)
