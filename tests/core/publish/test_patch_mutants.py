"""``core.publish.patch`` cases that mutation testing (``scripts/mutation``) found no test pinned:
a volatile key that is not desired is passed over, and the volatile keys after it still follow
the rule."""

from __future__ import annotations

from omaticaya_py.core.publish.patch import NodeMeta, diff

P = "omaticaya.io"
TEL = f"{P}/telemetry"


def test_a_volatile_key_not_desired_does_not_stop_the_others() -> None:
    current = NodeMeta(name="n", labels={f"{P}/gpu.count": "1"}, annotations={TEL: "{}"})
    volatile = (f"{P}/not-desired", TEL)  # in this order: the one not desired first
    got = diff({f"{P}/gpu.count": "1"}, {TEL: "{}"}, current, P, volatile=volatile, refresh=True)
    assert got == {"metadata": {"annotations": {TEL: "{}"}}}  # the heartbeat rewrites it
