"""What the MPS tests share: the stand-in ``nvidia-cuda-mps-control`` (devtools/mps-standin) and a
supervisor run as ``omaticaya mps`` runs it (``Running``)."""

from __future__ import annotations

import threading
from pathlib import Path

from omaticaya_py.mps.supervisor import Supervisor

__all__ = ["STANDIN", "Running"]

#: the stand-in control daemon: real processes and sockets, no GPU
STANDIN = (
    Path(__file__).resolve().parent.parent / "devtools" / "mps-standin" / "nvidia-cuda-mps-control"
)


class Running:
    """A supervisor started, syncing and checking in a thread (``run_forever``), stopped at exit
    (``with Running(sup) as sup: ...``)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=sup.run_forever, args=(self.stop_event,), daemon=True)

    def __enter__(self) -> Supervisor:
        self.sup.start()
        self.thread.start()
        return self.sup

    def __exit__(self, *_: object) -> None:
        self.stop_event.set()
        self.thread.join(10)
        self.sup.stop()
