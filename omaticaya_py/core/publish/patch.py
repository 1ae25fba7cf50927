"""Diff: desired keys vs the Node's current metadata -> a JSON merge patch (RFC 7386), or None.

Pure functions over plain dicts. The agent owns every key under its prefix and nothing else:
keys outside the prefix are never set nor removed; keys under the prefix that are no longer
desired are removed (``null`` in the merge patch).

Volatile annotations (the telemetry JSON, whose numbers move every tick) are written only
when some label changed, when they are missing on the Node, or when ``refresh`` is set (the
heartbeat is due): a quiet GPU costs no API request.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NodeMeta",
    "apply_patch",
    "diff",
    "diff_section",
    "owned",
    "removal_patch",
    "volatile_due",
]

MergePatch = dict[str, Any]


@dataclass(frozen=True)
class NodeMeta:
    """The parts of a Node the agent reads: ``metadata.name``, ``uid``, ``labels``,
    ``annotations`` (from GET or the merge patch response of ``/api/v1/nodes/{name}``)."""

    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def owned(keys: Collection[str], prefix: str) -> list[str]:
    """The keys that sit under ``prefix/``."""
    mark = prefix + "/"
    return [k for k in keys if k.startswith(mark)]


def diff_section(
    desired: Mapping[str, str], current: Mapping[str, str], prefix: str
) -> dict[str, str | None]:
    """Changes for one map (labels or annotations): ``{key: new value}`` for set or changed
    keys, ``{key: None}`` for keys under the prefix that are no longer desired. Desired keys
    outside the prefix are a programming error and raise ``ValueError``."""
    mark = prefix + "/"
    changes: dict[str, str | None] = {}
    for key, value in desired.items():
        if not key.startswith(mark):
            raise ValueError(f"desired key {key!r} is outside the prefix {prefix!r}")
        if current.get(key) != value:
            changes[key] = value
    for key in current:
        if key.startswith(mark) and key not in desired:
            changes[key] = None
    return changes


def volatile_due(label_changes: bool, on_node: bool, refresh: bool) -> bool:
    """The one rule for when a volatile annotation (the telemetry) is written: with a label
    change (``label_changes``), when the Node lacks it (``not on_node``), or when ``refresh``
    is set (the heartbeat is due, or the value on the Node must be replaced, e.g. it names
    another liveness Lease). ``diff`` applies it, and the agent asks it before building the
    annotation, so that a quiet tick encodes no JSON."""
    return label_changes or not on_node or refresh


def diff(
    desired_labels: Mapping[str, str],
    desired_annotations: Mapping[str, str],
    current: NodeMeta,
    prefix: str,
    *,
    volatile: Collection[str] = (),
    refresh: bool = False,
) -> MergePatch | None:
    """The merge patch that brings ``current`` to the desired state under ``prefix``.

    Returns ``{"metadata": {"labels": {...}, "annotations": {...}}}`` with only the sections
    that change, or ``None`` when nothing would change (then no API request is made).
    ``volatile`` names annotation keys written only with a label change or when missing;
    ``refresh`` (the heartbeat is due) writes them even when unchanged, so that the patch
    response shows the Node as it is (re-created, or edited by hand).
    """
    labels = diff_section(desired_labels, current.labels, prefix)
    annotations = diff_section(desired_annotations, current.annotations, prefix)
    for key in volatile:
        if key not in desired_annotations:
            continue
        if not volatile_due(bool(labels), key in current.annotations, refresh):
            annotations.pop(key, None)
        elif refresh:
            annotations[key] = desired_annotations[key]  # heartbeat: rewrite even if equal
    if not labels and not annotations:
        return None
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata}


def removal_patch(current: NodeMeta, prefix: str, keep: Collection[str] = ()) -> MergePatch | None:
    """A merge patch that removes every label and annotation under ``prefix`` except ``keep``;
    ``None`` when there is nothing to remove."""
    keep = set(keep)
    labels = {k: None for k in owned(current.labels, prefix) if k not in keep}
    annotations = {k: None for k in owned(current.annotations, prefix) if k not in keep}
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata} if metadata else None


def apply_patch(current: NodeMeta, patch: MergePatch) -> NodeMeta:
    """``current`` with a metadata merge patch applied (what the API server will store)."""
    meta = patch.get("metadata", {})

    def merged(base: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
        out = dict(base)
        for k, v in changes.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    return NodeMeta(
        name=current.name,
        uid=current.uid,
        labels=merged(current.labels, meta.get("labels", {})),
        annotations=merged(current.annotations, meta.get("annotations", {})),
    )
