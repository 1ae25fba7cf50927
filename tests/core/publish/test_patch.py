"""Diff: (desired, current Node) -> the whole JSON merge patch, or None; removal; apply."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.patch import (
    NodeMeta,
    apply_patch,
    diff,
    diff_section,
    owned,
    removal_patch,
)

P = "omaticaya.io"
TEL = f"{P}/telemetry"

FOREIGN_LABELS = {
    "kubernetes.io/hostname": "gpu-node-1",
    "nvidia.com/gpu.present": "true",
    "omaticaya.io.evil/x": "1",  # starts with the prefix text, but is not under it
    "omaticaya.iox/gpu.count": "9",
    "omaticaya.io": "bare",
}
FOREIGN_ANNOTATIONS = {
    "node.alpha.kubernetes.io/ttl": "0",
    "omaticaya.io.evil/telemetry": "{}",
}
LABELS = {f"{P}/gpu.count": "1", f"{P}/gpu.memory.free-mib": "80896", f"{P}/gpu.health": "Healthy"}


def node(labels=None, annotations=None) -> NodeMeta:
    return NodeMeta(
        name="gpu-node-1",
        uid="uid-1",
        labels={**FOREIGN_LABELS, **(labels or {})},
        annotations={**FOREIGN_ANNOTATIONS, **(annotations or {})},
    )


DIFF_CASES = [
    # (id, desired labels, desired annotations, current, kwargs, expected patch)
    ("nothing-changed", LABELS, {TEL: "{a}"}, node(LABELS, {TEL: "{a}"}), {}, None),
    ("nothing-desired-nothing-owned", {}, {}, node(), {}, None),
    (
        "changed-value",
        {**LABELS, f"{P}/gpu.memory.free-mib": "49152"},
        {TEL: "{a}"},
        node(LABELS, {TEL: "{a}"}),
        {},
        {"metadata": {"labels": {f"{P}/gpu.memory.free-mib": "49152"}}},
    ),
    (
        "new-key",
        {**LABELS, f"{P}/gpu.utilization-pct": "0"},
        {TEL: "{a}"},
        node(LABELS, {TEL: "{a}"}),
        {},
        {"metadata": {"labels": {f"{P}/gpu.utilization-pct": "0"}}},
    ),
    (
        "first-write-on-bare-node",
        LABELS,
        {TEL: "{a}"},
        node(),
        {},
        {"metadata": {"labels": LABELS, "annotations": {TEL: "{a}"}}},
    ),
    (
        "stale-key-removed",
        LABELS,
        {TEL: "{a}"},
        node({**LABELS, f"{P}/gpu-7.health": "Healthy", f"{P}/gpu-7.memory.free-mib": "0"}, {TEL: "{a}"}),
        {},
        {"metadata": {"labels": {f"{P}/gpu-7.health": None, f"{P}/gpu-7.memory.free-mib": None}}},
    ),
    (
        "stale-annotation-removed",
        LABELS,
        {TEL: "{a}"},
        node(LABELS, {TEL: "{a}", f"{P}/old": "x"}),
        {},
        {"metadata": {"annotations": {f"{P}/old": None}}},
    ),
    (
        "foreign-keys-never-touched-even-when-desired-is-empty",
        {},
        {},
        node(LABELS, {TEL: "{a}"}),
        {},
        {"metadata": {"labels": {k: None for k in LABELS}, "annotations": {TEL: None}}},
    ),
    (
        "volatile-alone-not-sent",
        LABELS,
        {TEL: "{b}"},
        node(LABELS, {TEL: "{a}"}),
        {"volatile": [TEL]},
        None,
    ),
    (
        "volatile-sent-when-missing",
        LABELS,
        {TEL: "{b}"},
        node(LABELS),
        {"volatile": [TEL]},
        {"metadata": {"annotations": {TEL: "{b}"}}},
    ),
    (
        "volatile-sent-on-refresh",
        LABELS,
        {TEL: "{b}"},
        node(LABELS, {TEL: "{a}"}),
        {"volatile": [TEL], "refresh": True},
        {"metadata": {"annotations": {TEL: "{b}"}}},
    ),
    (
        "volatile-sent-with-label-change",
        {**LABELS, f"{P}/gpu.health": "Degraded"},
        {TEL: "{b}"},
        node(LABELS, {TEL: "{a}"}),
        {"volatile": [TEL]},
        {"metadata": {"labels": {f"{P}/gpu.health": "Degraded"}, "annotations": {TEL: "{b}"}}},
    ),
    (
        "volatile-rewritten-on-refresh-even-if-equal",
        LABELS,
        {TEL: "{a}"},
        node(LABELS, {TEL: "{a}"}),
        {"volatile": [TEL], "refresh": True},
        {"metadata": {"annotations": {TEL: "{a}"}}},
    ),
    (
        "refresh-without-volatile-unchanged-is-nothing",
        LABELS,
        {TEL: "{a}"},
        node(LABELS, {TEL: "{a}"}),
        {"refresh": True},
        None,
    ),
    (
        "not-volatile-annotation-sent-alone",
        LABELS,
        {TEL: "{b}"},
        node(LABELS, {TEL: "{a}"}),
        {},
        {"metadata": {"annotations": {TEL: "{b}"}}},
    ),
]


@pytest.mark.parametrize(
    ("name", "labels", "annotations", "current", "kwargs", "expected"),
    DIFF_CASES,
    ids=[c[0] for c in DIFF_CASES],
)
def test_diff_whole_patch(name, labels, annotations, current, kwargs, expected) -> None:
    patch = diff(labels, annotations, current, P, **kwargs)
    assert patch == expected
    if patch is not None:
        for section in patch["metadata"].values():
            assert all(k.startswith(P + "/") for k in section)
        after = apply_patch(current, patch)
        assert {k: v for k, v in after.labels.items() if k in FOREIGN_LABELS} == FOREIGN_LABELS
        assert {k: v for k, v in after.annotations.items() if k in FOREIGN_ANNOTATIONS} == FOREIGN_ANNOTATIONS


def test_custom_prefix_leaves_default_prefix_alone() -> None:
    current = node({f"{P}/gpu.count": "1", "gpu.example.com/gpu.count": "2"})
    patch = diff({"gpu.example.com/gpu.count": "3"}, {}, current, "gpu.example.com")
    assert patch == {"metadata": {"labels": {"gpu.example.com/gpu.count": "3"}}}


@pytest.mark.parametrize(
    "key",
    ["nvidia.com/gpu.present", "kubernetes.io/hostname", "omaticaya.io.evil/x", "gpu.count", "omaticaya.io"],
)
def test_desired_key_outside_prefix_raises(key) -> None:
    with pytest.raises(ValueError, match="outside the prefix"):
        diff({key: "1"}, {}, node(), P)
    with pytest.raises(ValueError, match="outside the prefix"):
        diff({}, {key: "1"}, node(), P)


def test_diff_section() -> None:
    assert diff_section({f"{P}/a": "1", f"{P}/b": "2"}, {f"{P}/a": "1", f"{P}/c": "3", "x/c": "3"}, P) == {
        f"{P}/b": "2",
        f"{P}/c": None,
    }


def test_owned() -> None:
    keys = [*FOREIGN_LABELS, f"{P}/a", f"{P}/b"]
    assert owned(keys, P) == [f"{P}/a", f"{P}/b"]


OWNED_NOW = {f"{P}/gpu.count": "1", f"{P}/gpu.product": "NVIDIA-H100-80GB-HBM3", f"{P}/gpu.health": "Healthy"}

REMOVAL_CASES = [
    (
        "remove-everything-owned",
        node(OWNED_NOW, {TEL: "{a}"}),
        (),
        {
            "metadata": {
                "labels": {k: None for k in OWNED_NOW},
                "annotations": {TEL: None},
            }
        },
    ),
    (
        "keep-static",
        node(OWNED_NOW, {TEL: "{a}"}),
        (f"{P}/gpu.count", f"{P}/gpu.product"),
        {"metadata": {"labels": {f"{P}/gpu.health": None}, "annotations": {TEL: None}}},
    ),
    (
        "keep-everything",
        node(OWNED_NOW, {TEL: "{a}"}),
        (*OWNED_NOW, TEL),
        None,
    ),
    ("nothing-owned", node(), (), None),
    (
        "labels-only",
        node(OWNED_NOW),
        (),
        {"metadata": {"labels": {k: None for k in OWNED_NOW}}},
    ),
]


@pytest.mark.parametrize(("name", "current", "keep", "expected"), REMOVAL_CASES, ids=[c[0] for c in REMOVAL_CASES])
def test_removal_patch(name, current, keep, expected) -> None:
    patch = removal_patch(current, P, keep)
    assert patch == expected
    if patch is not None:
        after = apply_patch(current, patch)
        assert after.labels == {**FOREIGN_LABELS, **{k: v for k, v in OWNED_NOW.items() if k in keep}}
        assert after.annotations == {**FOREIGN_ANNOTATIONS, **({TEL: "{a}"} if TEL in keep else {})}


APPLY_CASES = [
    ("empty-patch", {}, node()),
    (
        "set-and-remove",
        {"metadata": {"labels": {f"{P}/a": "1", "nvidia.com/gpu.present": None}, "annotations": {TEL: "{}"}}},
        NodeMeta(
            name="gpu-node-1",
            uid="uid-1",
            labels={k: v for k, v in {**FOREIGN_LABELS, f"{P}/a": "1"}.items() if k != "nvidia.com/gpu.present"},
            annotations={**FOREIGN_ANNOTATIONS, TEL: "{}"},
        ),
    ),
    (
        "remove-missing-key-is-fine",
        {"metadata": {"labels": {f"{P}/gone": None}}},
        node(),
    ),
]


@pytest.mark.parametrize(("name", "patch", "expected"), APPLY_CASES, ids=[c[0] for c in APPLY_CASES])
def test_apply_patch(name, patch, expected) -> None:
    before = node()
    assert apply_patch(before, patch) == expected
    assert before == node()  # the input is not mutated


def test_diff_then_apply_reaches_desired_and_second_diff_is_none() -> None:
    current = node({f"{P}/gpu-3.health": "Healthy", f"{P}/gpu.count": "4"}, {TEL: "{old}"})
    desired_labels = {**LABELS, f"{P}/gpu.count": "3"}
    patch = diff(desired_labels, {TEL: "{new}"}, current, P, volatile=[TEL])
    after = apply_patch(current, patch)
    assert after.labels == {**FOREIGN_LABELS, **desired_labels}
    assert after.annotations == {**FOREIGN_ANNOTATIONS, TEL: "{new}"}
    assert diff(desired_labels, {TEL: "{new}"}, after, P, volatile=[TEL]) is None
