"""The last start's NVML index -> GPU UUID map on disk, and the step both kubelet plugins take
with it at each start (``check_indices``): the DRA plugin (``<plugin dir>/gpu-indices.json``)
and the device plugin (``<device-plugins dir>/omaticaya-gpu-indices.json``).

An ``OMATICAYA_SHARED_GPUS`` index that names another GPU than it did at the last start (a GPU
lost or added at boot renumbers the others) is found by ``core.model.sharing.moved_indices`` and said
here as a warning log line; the caller adds the Event (``kube.index_moved.post_index_moved``)
and the gauge (``kube.index_moved.moved_family``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from loguru import logger

from ..core.model.sharing import IndexMoved, SharedGpus, moved_indices, parse_indices
from .files import write_atomic

__all__ = ["check_indices", "load_indices", "save_indices"]


def load_indices(path: Path) -> dict[int, str]:
    """The map at ``path`` (``core.model.sharing.INDICES_FORM``): each GPU's NVML index -> UUID at the
    last start; empty when there is none. A file that cannot be read or parsed is logged and
    taken as empty (nothing to compare with: nothing reported). Never raises."""
    try:
        return parse_indices(json.loads(Path(path).read_bytes()))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        logger.warning("{} unreadable ({}): no GPU index compared with the last start", path, exc)
        return {}


def save_indices(path: Path, gpus: Mapping[int, str]) -> None:
    """Write ``path`` whole (``sources.files.write_atomic``) with ``gpus`` (NVML index -> GPU
    UUID). Raises ``OSError``."""
    doc = {"version": 1, "gpus": {str(i): u for i, u in sorted(gpus.items())}}
    write_atomic(Path(path), (json.dumps(doc, indent=1) + "\n").encode(), mode=0o644)


def check_indices(path: Path, shared: SharedGpus, now: Mapping[int, str], who: str
                  ) -> tuple[IndexMoved, ...]:  # fmt: skip
    """One start's check: compare ``now`` (NVML index -> GPU UUID of the first readable reading,
    ``core.model.sharing.gpu_indices``) with the map at ``path`` from the last start, log a warning
    (prefixed ``who``: ``DRA plugin``, ``device plugin``) for each ``shared`` index that names
    another GPU now (``core.model.sharing.moved_indices``), then write ``now`` to ``path``. Returns
    what moved, in index order. Never raises: a file that cannot be written is logged (the next
    start then compares with the older map, or nothing)."""
    moved = tuple(moved_indices(shared, load_indices(path), now))
    for m in moved:
        logger.warning("{}: {}", who, m.message())
    try:
        save_indices(path, now)
    except OSError as exc:
        logger.warning("{}: cannot write {}: {} (the next start compares nothing new)",
                       who, path, exc)  # fmt: skip
    return moved
