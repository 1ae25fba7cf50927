"""What ``Agent`` is built from: its way to the Node (``NodeApi``) and the parts the settings
ask for, each made by one function here so that ``Agent.__init__`` only wires them.

- ``NodeApi``: the Node's client, whether writes are sent, where liveness goes (a Lease, or
  the Node's telemetry annotation).
- ``xid_policy``, ``refresh_s``, ``mps_watch``, ``enforcement_now``: the Xid rules, the
  telemetry's longest silence, the MPS daemons' watch and its per-write question.
- ``resourceslice_writer``: the Node's DRA ResourceSlice writer (``OMATICAYA_DRA``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..core.allocation.mps import Layout
from ..core.config.settings import Settings
from ..core.rules.health import XidPolicy
from ..kube import LeaseClient, NodeClient
from ..kube.resourceslice import ResourceSliceClient
from ..sources.mps import MpsWatch
from .events import mps_enforcement
from .heartbeat import make_lease
from .resourceslice_writer import ResourceSliceWriter

__all__ = [
    "NodeApi",
    "enforcement_now",
    "mps_watch",
    "refresh_s",
    "resourceslice_writer",
    "xid_policy",
]


@dataclass(frozen=True, slots=True)
class NodeApi:
    """How the agent reaches its own Node through the Kubernetes API.

    - ``node``: the Node's client; ``None`` (a dry run without API) diffs against an empty Node.
    - ``dry_run``: compute patches but never send them (the Node is still read if reachable).
    - ``lease``: the liveness Lease; ``"auto"`` holds ``omaticaya-node-<node>`` in the agent's
      own namespace (``POD_NAMESPACE`` in ``environ``, else the service account's), or none
      when there is no such namespace (outside a cluster), no ``node``, or a dry run; ``None``:
      no Lease, the heartbeat goes on the Node's telemetry annotation.
    - ``environ``: the environment ``"auto"`` reads (``None``: ``os.environ``).
    """

    node: NodeClient | None
    dry_run: bool = False
    lease: LeaseClient | None | Literal["auto"] = "auto"
    environ: Mapping[str, str] | None = None

    def liveness_lease(self, settings: Settings, duration_s: float) -> LeaseClient | None:
        """The Lease that carries the agent's liveness (``lease``, ``"auto"`` resolved by
        ``agent.heartbeat.make_lease``, held ``duration_s`` seconds); ``None``: none, the
        heartbeat goes on the Node's telemetry annotation."""
        if self.lease != "auto":
            return self.lease
        env = os.environ if self.environ is None else self.environ
        return make_lease(settings, self.node, env, duration_s, self.dry_run)

    def slice_client(self) -> ResourceSliceClient | None:
        """A client of the Node's DRA ResourceSlice; ``None`` without a Node client or in a dry
        run (the writer then computes and sends nothing)."""
        if self.node is None or self.dry_run:
            return None
        return ResourceSliceClient(self.node.session, self.node.node_name)


def xid_policy(settings: Settings) -> XidPolicy:
    """The Xid rules the settings ask for: the codes ignored, every Xid fatal or the known
    ones, and how long a GPU stays unhealthy after its last fatal Xid (``xid_quiet_s``)."""
    return XidPolicy(
        ignore=settings.xid_ignore,
        all_fatal=settings.xid_all_fatal,
        quiet_s=settings.xid_quiet_s,
    )


def refresh_s(settings: Settings, period_s: float) -> float:
    """The longest the telemetry annotation goes unrewritten while the agent runs, seconds: it
    is rewritten on the first tick (every ``period_s``, plus the jitter) after the heartbeat
    (``heartbeat_s``) is due. Published as ``refresh_s`` and ``expires_at``, so that readers
    judge staleness by the publisher's own pace; also the Lease's duration."""
    return settings.heartbeat_s + period_s + settings.jitter_s


def mps_watch(settings: Settings) -> MpsWatch | None:
    """The watch of the CUDA MPS daemons' states (as ``omaticaya mps`` writes them) for shared
    GPUs enforced by MPS (``OMATICAYA_SHARE_ENFORCEMENT=mps``) through this agent's device
    plugin or DRA plugin (``OMATICAYA_DEVICE_PLUGIN``, ``OMATICAYA_DRA``: they make the
    containers clients); ``None``: no GPU shared, enforcement off, or no plugin (no slice is
    ours to enforce)."""
    if not (
        settings.shared_gpus
        and settings.share_enforcement == "mps"
        and (settings.device_plugin or settings.dra)
    ):
        return None
    return MpsWatch(Layout(settings.mps_root, settings.mps_state_dir), settings.mps_stale_s)


def enforcement_now(
    mps: MpsWatch | None,
) -> Callable[[Iterable[str]], Mapping[str, str]] | None:
    """Shared GPU UUIDs -> their MPS enforcement now (``"up"`` or the reason it is not,
    ``agent.events.mps_enforcement``), asked once per write; ``None`` without a watch."""
    if mps is None:
        return None
    return lambda uuids: mps_enforcement(mps, uuids) or {}


def resourceslice_writer(
    settings: Settings, api: NodeApi, cache: Any, mps: MpsWatch | None
) -> ResourceSliceWriter | None:
    """The writer of the Node's DRA ResourceSlice (``OMATICAYA_DRA``; ``None`` without it),
    through ``api`` (no client: computed, never sent), its budget noted in ``cache`` (the
    ``SnapshotCache``), the MPS enforcement of its shared GPUs asked of ``mps``."""
    if not settings.dra:
        return None
    return ResourceSliceWriter(settings, api.slice_client(), cache, mps=enforcement_now(mps))
