"""Where an agent's Node writes come from: which labels each patch changes, and which of them
made it urgent (a change that makes the Node less attractive, ``core.publish.budget.worse``: it goes at
once, past the write budget).

``WriteTally.wrap(agent, client)`` counts every ``patch_node`` call of ``client`` against the
Node as the agent's writer last saw it; ``rows()`` is the table: per label name (``gpu-N.``
folded to ``gpu-*.``), the patches that change it and those in which it got worse.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

__all__ = ["WriteTally"]

_GPU_N = re.compile(r"^gpu-\d+\.")


def _name(key: str) -> str:
    return _GPU_N.sub("gpu-*.", key.rpartition("/")[2])


class WriteTally:
    """Per label name: patches that change it (``changed``) and patches in which it got worse
    (``worse``); ``urgent``: patches with any worse key; ``patches``: all of them; ``only_telemetry``:
    patches with no label (heartbeat or annotation only)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix + "/"
        self.changed: Counter[str] = Counter()
        self.worse: Counter[str] = Counter()
        self.patches = self.urgent = self.only_telemetry = 0

    def wrap(self, agent: Any, client: Any) -> None:
        """Count each patch ``client`` sends for ``agent`` (its writer's cached Node is the
        state before the patch)."""
        from omaticaya_py.core.publish.budget import worse

        send = client.patch_node

        def counted(patch: Any) -> Any:
            meta = agent.writer.meta
            before = dict(meta.labels) if meta is not None else {}
            labels = patch.get("metadata", {}).get("labels") or {}
            self.patches += 1
            if not labels:
                self.only_telemetry += 1
            bad = set()
            for key, value in labels.items():
                if not key.startswith(self.prefix):
                    continue
                name = _name(key)
                self.changed[name] += 1
                if worse(key.rpartition("/")[2], before.get(key), value):
                    bad.add(name)
            self.worse.update(bad)
            self.urgent += bool(bad)
            return send(patch)

        client.patch_node = counted

    def rows(self, scenario: str, per_hour: float) -> list[list[Any]]:
        """``[scenario, label, changed/h, worse/h]``, most changed first, then the totals."""
        out = [
            [scenario, name, n * per_hour, self.worse[name] * per_hour]
            for name, n in self.changed.most_common()
        ]
        out.append([scenario, "(patches: all / urgent)", self.patches * per_hour,
                    self.urgent * per_hour])  # fmt: skip
        return out
