"""The plugins' slice requests as the MPS supervisor reads them: ``<state dir>/slices/<slice
id>.json`` each (``core.allocation.mps.SliceRequest``). A request that cannot be read, or that
names a GPU not shared here, is skipped and counted once
(``omaticaya_mps_slice_requests_skipped_total``), said once, and its state written ``down``
with the reason, so that the plugin waiting for it learns why at once; the state goes when the
request does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

from loguru import logger

from ..core.allocation.mps import DaemonState, Layout, SliceRequest, parse_request, state_json
from ..sources.files import write_atomic
from .metrics import MpsMetrics
from .slots import DOWN, Gpu

__all__ = ["UNKNOWN_GPU", "UNREADABLE", "SliceRequests"]

#: the reasons a slice request is skipped (``omaticaya_mps_slice_requests_skipped_total``)
UNREADABLE = "unreadable"
UNKNOWN_GPU = "unknown-gpu"

#: the most bytes of a request file read
_MAX_REQUEST_BYTES = 16 * 1024


class SliceRequests:
    """The requests under ``layout.requests_dir`` for the shared ``gpus``; skipped ones counted
    in ``metrics``, their states stamped by ``wall`` (seconds). One thread calls it."""

    def __init__(self, layout: Layout, gpus: Sequence[Gpu], metrics: MpsMetrics,
                 wall: Callable[[], float]) -> None:  # fmt: skip
        self.layout = layout
        self.gpus = tuple(gpus)
        self.by_uuid = {g.uuid: g for g in self.gpus}
        self.metrics = metrics
        self._wall = wall
        self._skipped: dict[str, str] = {}  # slice ID -> why its request was skipped

    def read(self) -> dict[str, SliceRequest]:
        """Slice ID -> its request, of those on file that are requests for a GPU shared here;
        the others skipped (see the module docstring). No requests folder: none."""
        out: dict[str, SliceRequest] = {}
        try:
            names = [e.name for e in os.scandir(self.layout.requests_dir)]
        except FileNotFoundError:
            return out
        seen = set()
        for name in names:
            if not name.endswith(".json") or name.endswith(".state.json"):
                continue
            sid = name[: -len(".json")]
            seen.add(sid)
            request = self._read_one(sid)
            if request is not None:
                self._skipped.pop(sid, None)
                out[sid] = request
        for sid in [sid for sid in self._skipped if sid not in seen]:
            del self._skipped[sid]
            with contextlib.suppress(OSError, ValueError):
                self.layout.slice_state(sid).unlink(missing_ok=True)
        return out

    def _read_one(self, sid: str) -> SliceRequest | None:
        """Slice ``sid``'s request, or ``None``: removed meanwhile, or skipped."""
        try:
            path = self.layout.request(sid)
            with open(path, "rb") as f:
                request = parse_request(f.read(_MAX_REQUEST_BYTES), sid)
        except FileNotFoundError:
            return None  # removed meanwhile
        except (OSError, ValueError) as exc:
            self._skip(sid, UNREADABLE, f"{type(exc).__name__}: {exc}")
            return None
        if request.gpu_uuid not in self.by_uuid:
            self._skip(sid, UNKNOWN_GPU, f"GPU {request.gpu_uuid} is not a shared GPU here",
                       request)  # fmt: skip
            return None
        return request

    def _skip(self, sid: str, reason: str, detail: str,
              request: SliceRequest | None = None) -> None:  # fmt: skip
        if self._skipped.get(sid) == reason:
            return
        self._skipped[sid] = reason
        self.metrics.skipped(reason)
        logger.warning("MPS supervisor: slice request {} skipped ({}): {}", sid[:32], reason,
                       detail[:200])  # fmt: skip
        try:
            uuid = request.gpu_uuid if request is not None else self.gpus[0].uuid if self.gpus else ""
            if uuid:
                state = DaemonState(uuid, request.gpu_index if request else 0, DOWN,
                                    reason=f"{reason}: {detail}"[:256], heartbeat_s=self._wall(),
                                    since_s=self._wall(), sid=sid)  # fmt: skip
                write_atomic(self.layout.slice_state(sid), (state_json(state) + "\n").encode(),
                             fsync=False)  # fmt: skip
        except (OSError, ValueError):
            pass
