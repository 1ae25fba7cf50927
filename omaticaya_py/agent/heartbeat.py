"""The agent's heartbeat (``Heartbeat``), on its ``coordination.k8s.io`` Lease or on the Node.

With a Lease (the chart's default), the Lease is renewed every ``heartbeat_s`` and the Node's
telemetry annotation is written only with a label change. Without one (no namespace of its own,
or RBAC without Leases: an older chart, said once), the heartbeat is the annotation itself,
rewritten every ``heartbeat_s``.
"""

from __future__ import annotations

from collections.abc import Mapping

from loguru import logger

from ..core.config.settings import Settings
from ..core.model.sayonce import SayOnce
from ..core.schema import Telemetry
from ..kube import KubeError, KubeForbidden, LeaseClient, NodeClient
from ..kube.heartbeat_lease import lease_name, lease_namespace
from .state import SnapshotCache

__all__ = ["Heartbeat", "make_lease"]

RENEWAL = "renewal"  # the key of a Lease renewal failing


def make_lease(
    settings: Settings,
    node: NodeClient | None,
    environ: Mapping[str, str],
    duration_s: float,
    dry_run: bool,
) -> LeaseClient | None:
    """The Lease ``omaticaya-node-<node>`` in the agent's own namespace (``POD_NAMESPACE`` in
    ``environ``, else the service account's), held by ``POD_NAME``; ``None`` without a Node
    client, in a dry run, or outside a cluster (no namespace of its own)."""
    if node is None or dry_run:
        return None
    namespace = lease_namespace(environ)
    if namespace is None:
        logger.debug("no namespace of its own (outside a cluster): heartbeat on the Node")
        return None
    name = settings.node_name or node.node_name
    return LeaseClient(
        node.session,
        namespace=namespace,
        name=lease_name(name),
        holder=(environ.get("POD_NAME") or "").strip() or name,
        duration_s=duration_s,
        node=name,  # the Lease's owner: it goes with its Node
    )


class Heartbeat:
    """The agent's heartbeat (what readers judge its liveness by, ``core.rules.liveness``): when it is due, and where it goes. ``lease`` is ``None`` in annotation
    mode; times are the agent's monotonic seconds."""

    def __init__(self, lease: LeaseClient | None, heartbeat_s: float, cache: SnapshotCache):
        self.lease = lease
        self.heartbeat_s = heartbeat_s
        self.cache = cache
        self.telemetry_at_s: float | None = None  # last write of the annotation
        self.lease_at_s: float | None = None  # last renewal of the Lease
        self._said: SayOnce[str, bool] = SayOnce()  # a renewal failing

    def annotation_due(self, now_s: float) -> bool:
        """Whether the Node's telemetry annotation is due for its heartbeat rewrite: never while
        a Lease carries liveness."""
        if self.lease is not None:
            return False
        return self.telemetry_at_s is None or now_s - self.telemetry_at_s >= self.heartbeat_s

    def points_elsewhere(self, on_node: str | None) -> bool:
        """In Lease mode, the Node's telemetry (``on_node``) does not name our Lease (written by
        an older version, or before a fallback): it is rewritten once, so that readers know
        where to look."""
        return (
            self.lease is not None
            and on_node is not None
            and not Telemetry.names_lease(on_node, self.lease.ref)
        )

    def refresh(self, now_s: float, on_node: str | None) -> bool:
        """Whether this tick must rewrite the telemetry even without a label change (the
        ``refresh`` of ``core.publish.patch.volatile_due``)."""
        return self.annotation_due(now_s) or self.points_elsewhere(on_node)

    def lease_due(self, now_s: float) -> bool:
        """Whether the Lease is due for renewal."""
        return self.lease is not None and (
            self.lease_at_s is None or now_s - self.lease_at_s >= self.heartbeat_s
        )

    def renew(self, now_s: float) -> bool:
        """Renew the Lease; True when renewed (the caller re-reads the Node then). A 403 (RBAC
        without Leases: an older chart) turns the Lease off for good and the heartbeat back
        onto the Node annotation, said once; any other failure is logged once per streak and
        tried again next tick, never stopping the Node's patch."""
        assert self.lease is not None
        try:
            self.lease.renew()
        except KubeForbidden as exc:
            if exc.status != 403:  # 401: the credentials, not RBAC; the Node will say so too
                self._failed(exc)
                return False
            self.cache.lease_fallbacks += 1
            logger.warning(
                "no permission on Lease {} ({}): liveness goes on the Node's telemetry annotation "
                "every {:.3g}s instead (an older chart? it needs get/create/update on leases in "
                "the agent's namespace)", self.lease.ref, exc, self.heartbeat_s,
            )
            self.lease = None
            self.telemetry_at_s = None  # the annotation's heartbeat is due now
            return False
        except KubeError as exc:
            self._failed(exc)
            return False
        if self._said.end(RENEWAL) is not None:
            logger.info("Lease {} renewed again", self.lease.ref)
        self.lease_at_s = now_s
        self.cache.lease_renewals += 1
        return True

    def _failed(self, exc: KubeError) -> None:
        assert self.lease is not None
        self.cache.lease_failures += 1
        if self._said.start(RENEWAL, True):
            logger.error("could not renew Lease {}: {}; retrying each tick", self.lease.ref, exc)

    def release(self, delete: bool = False) -> None:
        """Release the Lease on exit (if one was ever renewed); ``delete``: delete it instead
        while this pod still holds it (``cleanup_on_exit``); a failure is logged."""
        if self.lease is None or self.lease_at_s is None:
            return
        try:
            if delete and self.lease.delete(only_if_held=True):
                logger.info("deleted Lease {}", self.lease.ref)
                return
            self.lease.release()
            logger.info("released Lease {}", self.lease.ref)
        except KubeError as exc:
            logger.warning("could not release Lease {}: {}", self.lease.ref, exc)
