"""What an agent sub-command reads and writes: the GPU reader (NVML or a trace) and the Node."""

from __future__ import annotations

import argparse
from typing import Any

from ..core.config.settings import Settings
from .errors import UsageError

__all__ = ["node_client", "reader"]


def reader(settings: Settings, args: argparse.Namespace) -> Any:
    """The GPU reader: a ``TraceReader`` of ``settings.trace`` (at ``--trace-at`` seconds, at
    ``--trace-speed``), else an ``NvmlReader`` (which watches Xids for ``run`` and
    ``device-plugin``). Raises ``UsageError`` for ``--trace-at`` without a trace, ``TraceError``
    for a trace that cannot be read."""
    at_s = getattr(args, "trace_at", None)
    if settings.trace is not None:
        from ..sources.replay import TraceReader

        return TraceReader(
            settings.trace,
            at_s=at_s,
            window_s=settings.schedule.period_s(),
            speed=getattr(args, "trace_speed", 1.0),
        )
    if at_s is not None:
        raise UsageError("--trace-at needs --trace or OMATICAYA_TRACE")
    from ..sources.nvml import NvmlReader

    return NvmlReader(watch_xid=args.command in ("run", "device-plugin"))


def node_client(settings: Settings, args: argparse.Namespace) -> Any:
    """The ``NodeClient`` of ``settings.node_name`` (``--kubeconfig``, else in-cluster or
    ``$KUBECONFIG``). Raises ``UsageError`` when no Node is named, ``KubeError`` when there is
    no Kubernetes configuration."""
    if not settings.node_name:
        raise UsageError(
            "NODE_NAME is not set: expected the Node name (the downward API's spec.nodeName) "
            "or --node NAME"
        )
    from ..kube import NodeClient

    return NodeClient(
        settings.node_name, kubeconfig=args.kubeconfig, timeout_s=settings.kube_timeout_s
    )
