"""The long-running agent: ``run`` (label the Node) and ``device-plugin`` (serve the kubelet),
each with /metrics, until SIGTERM."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..core.config.settings import Settings
from .errors import UsageError
from .inputs import node_client, reader

if TYPE_CHECKING:
    from ..agent import Agent
    from ..agent.daemon import Daemon

__all__ = ["run_daemon"]


def run_daemon(args: argparse.Namespace, settings: Settings, *, label_node: bool = True) -> int:
    """The daemon: ``run`` (label the Node, and serve the device plugin when
    ``settings.device_plugin``, the DRA kubelet plugin when ``settings.dra``), or ``device-plugin`` (``label_node=False``: no API server).

    Returns 0 after SIGTERM/SIGINT, 1 when NVML fails to start and
    ``settings.fail_on_init_error``. Raises ``UsageError`` when /metrics cannot be served,
    ``KubeError`` when there is no Kubernetes configuration."""
    from loguru import logger

    from ..agent import Agent, NodeApi
    from ..agent.daemon import Daemon

    gpus = reader(settings, args)
    if settings.fail_on_init_error:
        first = gpus.read()
        if first.error is not None:
            logger.error("NVML failed to start ({}) and fail_on_init_error is set", first.error)
            return 1
    if label_node:
        agent = Agent(settings, gpus, NodeApi(node_client(settings, args)))
    else:
        agent = Agent(settings, gpus, NodeApi(None, dry_run=True))
    daemon = Daemon(agent)
    daemon.install_signal_handlers()  # before any server starts: a SIGTERM must find them
    dra_counts = None
    plugins: list[Any] = []  # the device plugin set, once made (for its gauge on /metrics)
    if settings.dra:
        from ..dra.metrics import DraCounts

        dra_counts = DraCounts()
    if settings.metrics_port:
        try:
            _serve_metrics(daemon, agent, settings, dra_counts, plugins)
        except UsageError:
            gpus.close()
            raise
    if settings.device_plugin and not agent.stopping:
        from ..deviceplugin import DevicePluginSet

        plugin = DevicePluginSet.from_settings(agent, settings)
        plugins.append(plugin)
        daemon.serve(plugin.start, plugin.stop)
    if settings.dra and not agent.stopping:
        _serve_dra(daemon, agent, settings, dra_counts)
    daemon.run()
    return 0


def _serve_metrics(daemon: Daemon, agent: Agent, settings: Settings, dra_counts: Any,
                   plugins: list[Any]) -> None:  # fmt: skip
    """Serve /metrics (``settings.metrics_address``, ``metrics_port``) for the ``daemon``'s
    life: the agent's collectors, and the DRA plugin's counters (``dra_counts``) or the device
    plugin's moved shared indices (``plugins``, filled once made). Raises ``UsageError`` when
    it cannot be served."""
    from ..agent.metrics import serve

    extra: list[Any] = []
    if dra_counts is not None:
        from ..dra.metrics import DraCounters

        extra.append(DraCounters(dra_counts))
    elif settings.device_plugin:
        # the device plugin's moved shared indices (the DRA plugin's counters carry the same
        # gauge when it runs: one family of that name on /metrics)
        from ..kube.index_moved import MovedGauge

        extra.append(MovedGauge(lambda: plugins[0].moved if plugins else ()))
    try:
        server = serve(agent, settings.metrics_address, settings.metrics_port, collectors=extra)
    except OSError as exc:  # port in use, address not on this host, no IPv6
        where = f"{settings.metrics_address}:{settings.metrics_port}"
        if ":" in settings.metrics_address:
            where = f"[{settings.metrics_address}]:{settings.metrics_port}"
        raise UsageError(
            f"cannot serve /metrics on {where}: {exc.strerror or exc}; set another "
            "--metrics-port / OMATICAYA_METRICS_PORT (0: off) or OMATICAYA_METRICS_ADDRESS"
        ) from None
    daemon.serve(None, server.shutdown)


def _serve_dra(daemon: Daemon, agent: Agent, settings: Settings, dra_counts: Any) -> None:
    """Serve the DRA kubelet plugin for the ``daemon``'s life (it needs the API: with none, a
    warning and no plugin), counting in ``dra_counts``."""
    from loguru import logger

    if agent.node is None:
        logger.warning("OMATICAYA_DRA is set, but the DRA plugin needs the Kubernetes API "
                       "(it reads each ResourceClaim): run 'omaticaya run', not 'device-plugin'")
        return
    from ..dra import DraPlugin

    dra_plugin = DraPlugin(agent, settings, agent.node.session, agent.mps, counts=dra_counts)
    daemon.serve(dra_plugin.start, dra_plugin.stop)
