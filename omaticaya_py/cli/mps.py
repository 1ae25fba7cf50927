"""``omaticaya mps``: the CUDA MPS control daemons (one per slice, a probe per shared GPU),
supervised until SIGTERM
(``mps.Supervisor``), with ``/metrics``, ``/healthz`` and ``/readyz`` on
``OMATICAYA_MPS_METRICS_PORT``.

The shared GPUs (``OMATICAYA_SHARED_GPUS``, MIG off) are read once at start, with their UUIDs
and total memory: from the trace when ``OMATICAYA_TRACE`` is set, else from NVML. With
``OMATICAYA_SHARE_ENFORCEMENT=none`` or no shared GPU it says why and idles until SIGTERM,
ready (so that the chart's container does not restart in a loop). Exit 0 after SIGTERM/SIGINT
(every daemon stopped, every folder it made removed); 2 for bad settings or a bad trace
(naming the variable); 1 when the GPUs cannot be read or the supervisor cannot set up (a mount
refused: ``CAP_SYS_ADMIN``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from ..core.config.settings import SettingsError, load
from .errors import print_lines
from .parser import mps_settings_flags

if TYPE_CHECKING:
    from ..mps.settings import MpsSettings
    from ..mps.supervisor import Gpu

__all__ = ["mps_command", "shared_gpus"]

_PROGRAM = "omaticaya mps"


class _GpusUnreadable(Exception):
    """NVML could not be read: the message says why."""


def mps_command(args: argparse.Namespace) -> int:
    """Run ``omaticaya mps`` (see the module docstring); returns the exit status."""
    from ..mps.settings import MpsSettings
    from ..sources.trace import TraceError

    flags = mps_settings_flags()
    try:
        settings = load(MpsSettings, flags.flag_names(args), **flags.overrides(args))
    except SettingsError as exc:
        print_lines(f"{_PROGRAM}: ", exc)
        return 2
    from ..core.config.settings import Settings
    from ..logs import setup_logging
    from .flags import say_unknown_variables

    setup_logging(settings.log_level, settings.log_json)
    # the chart gives the pod's containers one environment: the agent's names are known too
    say_unknown_variables(_PROGRAM, MpsSettings, Settings, others=("OMATICAYA_EXTENDER_",))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        gpus = [] if settings.share_enforcement == "none" else shared_gpus(settings)
    except TraceError as exc:
        print_lines(f"{_PROGRAM}: ", exc)
        return 2
    except _GpusUnreadable as exc:
        print_lines(f"{_PROGRAM}: ", exc)
        return 1
    return _run(settings, gpus, stop)


def shared_gpus(settings: MpsSettings) -> list[Gpu]:
    """The shared GPUs (``settings.shared_gpus``, by UUID or index, MIG off: ``core.model.sharing``)
    with a UUID and at least one unit, in index order: from ``settings.trace`` (its first
    sample) when set, else from NVML. Raises ``TraceError`` for a bad trace, ``_GpusUnreadable``
    when NVML cannot be read."""
    from loguru import logger

    from ..core.model.sharing import Sharing, is_shared, unit_count
    from ..mps.supervisor import Gpu

    reader: Any
    if settings.trace is not None:
        from ..sources.replay import TraceReader

        reader = TraceReader(settings.trace, at_s=0.0)
    else:
        from ..sources.nvml import NvmlReader

        reader = NvmlReader(watch_xid=False)
    try:
        snap = reader.read()
    finally:
        reader.close()
    if snap.error is not None:
        raise _GpusUnreadable(f"cannot read the GPUs: NVML: {snap.error}")
    sharing = Sharing.of(settings)
    out = []
    for g in sorted(snap.gpus, key=lambda g: g.index):
        if not is_shared(g, sharing):
            continue
        units = unit_count(g.memory_total_mib, settings.share_unit_mib)
        if not g.uuid or units < 1:
            logger.warning("shared GPU {} has no {}: no MPS daemon for it", g.index,
                           "UUID" if not g.uuid else "memory total")  # fmt: skip
            continue
        out.append(Gpu(g.index, g.uuid, units))
    return out


def _run(settings: MpsSettings, gpus: list[Gpu], stop: threading.Event) -> int:
    from loguru import logger

    from ..core.allocation.mps import Layout
    from ..mps import metrics
    from ..mps.supervisor import MpsError, Supervisor, SupervisorOptions

    layout = Layout(settings.mps_root, settings.mps_state_dir)
    supervisor = None
    if settings.share_enforcement == "none" or not gpus:
        why = ("OMATICAYA_SHARE_ENFORCEMENT is none" if settings.share_enforcement == "none"
               else f"no shared GPU (OMATICAYA_SHARED_GPUS={settings.shared_gpus})")  # fmt: skip
        logger.info("{}: {}: no MPS daemon to run; idle until SIGTERM", _PROGRAM, why)
        registry = metrics.MpsMetrics().registry
        healthz = readyz = lambda: (True, f"idle: {why}")  # noqa: E731
    else:
        options = SupervisorOptions(
            settings.mps_control, check_s=settings.mps_check_s,
            start_timeout_s=settings.mps_start_timeout_s, shm_mib=settings.mps_shm_mib,
            host_root=settings.mps_host_root,
        )  # fmt: skip
        supervisor = Supervisor(layout, gpus, settings.share_unit_mib, options)
        registry, healthz, readyz = (
            supervisor.metrics.registry,
            supervisor.healthy,
            supervisor.ready,
        )
    server = None
    try:
        if settings.mps_metrics_port:
            try:
                server = metrics.serve(registry, healthz, readyz, settings.metrics_address,
                                       settings.mps_metrics_port)  # fmt: skip
            except OSError as exc:
                print(f"{_PROGRAM}: cannot serve metrics on {settings.metrics_address}:"
                      f"{settings.mps_metrics_port}: {exc.strerror or exc}", file=sys.stderr)  # fmt: skip
                return 1
        if supervisor is None:
            stop.wait()
            return 0
        logger.info("{}: MPS daemons for GPUs {} ({}), root {}, states in {}", _PROGRAM,
                    ",".join(str(g.index) for g in gpus), settings.mps_control, layout.root,
                    layout.state_dir)  # fmt: skip
        try:
            supervisor.start()
        except MpsError as exc:
            print(f"{_PROGRAM}: {exc}", file=sys.stderr)
            return 1
        supervisor.run_forever(stop)
        logger.info("{}: stopping the MPS daemons", _PROGRAM)
        return 0
    finally:
        if supervisor is not None:
            supervisor.stop()
        if server is not None:
            server.shutdown()
