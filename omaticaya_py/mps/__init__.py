"""CUDA MPS enforcement of slices, the running part (issue 39): one MPS control daemon per
shared GPU, supervised (``omaticaya mps``, the chart's ``mps`` container).

- ``daemon``: ``ControlDaemon``, one GPU's ``nvidia-cuda-mps-control -f``, started, asked
  through the program's client mode, stopped;
- ``supervisor``: ``Supervisor``, every shared GPU's daemon, checked and restarted with
  back-off, the shared-memory tmpfs, the state files the device plugin reads
  (``core.allocation.mps``, ``sources.mps``); ``slots``: one daemon's states and back-off
  (``Keeper``), ``SupervisorOptions``; ``slice_requests``: the plugins' requests read;
  ``host``: the folders, mounts and lock it makes on the host;
- ``metrics``: ``MpsMetrics`` and the ``/metrics``, ``/healthz``, ``/readyz`` app;
- ``settings``: ``MpsSettings``.

A system beside the agent, the device plugin and the extender: it imports ``core``,
``sources``, ``serving`` and ``logs``, none of them.
"""

from __future__ import annotations

from .daemon import ControlDaemon, DaemonError
from .metrics import MpsMetrics
from .supervisor import Gpu, MpsError, Supervisor, SupervisorOptions

__all__ = ["ControlDaemon", "DaemonError", "Gpu", "MpsError", "MpsMetrics", "Supervisor", "SupervisorOptions"]
