"""Derive ``multi-gpu-lost-trace.json`` from ``multi-gpu-trace.json``: the same node after a
reboot that lost GPU 3 (issue 48: a GPU fallen off the bus is not enumerated at boot).

    python tests/data/make_lost_gpu_trace.py    # rewrites multi-gpu-lost-trace.json

Seven GPUs: GPU 3 (``GPU-00000003-...``) is gone from the devices and from every sample, and
GPUs 4-7 keep their UUIDs, serials and PCI bus IDs but are renumbered 3-6, as NVML numbers GPUs
in PCI order. Deterministic: the same input gives byte-identical output, and
``tests/dra/test_dra_identity.py`` checks the file is current.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SOURCE = "multi-gpu-trace.json"
NAME = "multi-gpu-lost-trace.json"
#: the NVML index, in the source trace, of the GPU the reboot lost
LOST = 3


def _renumber(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` (devices, or one sample's GPUs) without the lost GPU, the later ones moved down."""
    out = []
    for item in items:
        if item["index"] == LOST:
            continue
        moved = copy.deepcopy(item)
        if moved["index"] > LOST:
            moved["index"] -= 1
        out.append(moved)
    return out


def make(src: dict[str, Any]) -> dict[str, Any]:
    """The trace after the reboot, from the multi-GPU trace ``src``."""
    out = copy.deepcopy(src)
    out["source"] = (f"synthetic, for tests: {SOURCE} after a reboot that lost GPU {LOST} "
                     f"(its UUID gone; GPUs {LOST + 1}-{src['device_count'] - 1} renumbered "
                     f"{LOST}-{src['device_count'] - 2}, same UUIDs)")  # fmt: skip
    out["device_count"] = src["device_count"] - 1
    out["devices"] = _renumber(src["devices"])
    out["samples"] = [{**s, "gpus": _renumber(s["gpus"])} for s in src["samples"]]
    return out


def render() -> str:
    """The JSON text ``multi-gpu-lost-trace.json`` must hold."""
    return json.dumps(make(json.loads((HERE / SOURCE).read_text())), indent=1) + "\n"


if __name__ == "__main__":
    text = render()
    (HERE / NAME).write_text(text)
    print(f"wrote {HERE / NAME} ({len(text)} bytes)")
