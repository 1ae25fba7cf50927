"""``core.publish.node_budget`` cases that mutation testing (``scripts/mutation``) found no test
pinned: the pending labels of a Node whose labels mostly did not change (every changed key found,
whatever the order the keys come in), and ``labels_within_budget``'s defaults (nothing going, the
budget on)."""

from __future__ import annotations

from omaticaya_py.core.publish.node_budget import labels_within_budget, pending_labels
from omaticaya_py.core.publish.publisher import Changes, Publisher

P = "omaticaya.io/"


def test_every_changed_label_is_pending_among_unchanged_ones() -> None:
    # 16 unchanged keys and 16 changed ones: a loop that stopped at an unchanged key would miss
    # some changed key unless every changed one came first (1 order in 601,080,390)
    same = {f"{P}gpu-{i}.health": "Healthy" for i in range(16)}
    on_node = {**same, **{f"{P}gpu-{i}.memory.free-mib": "4096" for i in range(16)}}
    desired = {**same, **{f"{P}gpu-{i}.memory.free-mib": "2048" if i % 2 else "8192" for i in range(16)}}
    assert pending_labels(on_node, desired) == Changes.of(
        {f"{P}gpu-{i}.memory.free-mib" for i in range(1, 16, 2)},
        {f"{P}gpu-{i}.memory.free-mib" for i in range(0, 16, 2)},
    )


def test_labels_within_budget_by_default_holds_what_may_wait() -> None:
    """Without ``going`` or ``hold``: the last write 5 s ago, a change for the better waits."""
    on_node, desired = {f"{P}gpu.memory.free-mib": "2048"}, {f"{P}gpu.memory.free-mib": "8192"}
    assert labels_within_budget(on_node, desired, Publisher(30.0, {}, 95.0), 100.0) == on_node
