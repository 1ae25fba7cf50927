"""Stop a DaemonSet and wait for its pods: the chart's pre-delete hook (``omaticaya
stop-daemonset``).

``helm uninstall`` deletes the DaemonSet and the agent's RBAC in one pass; the pods stop after
the RBAC is gone and their SIGTERM cleanup is refused. The hook runs first: it deletes the
DaemonSet with propagationPolicy Foreground and waits until the pods it owns are gone, so that
each agent removes its dynamic labels while its ClusterRoleBinding still exists.

RBAC: ``get`` and ``delete`` on ``daemonsets`` (apps) and ``list`` on ``pods``, in the
DaemonSet's namespace only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import KubeConflict, KubeNotFound
from .session import ApiSession

__all__ = ["DaemonSetStop", "label_selector", "owned_pods", "stop_daemonset"]

_DS_PATH = "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
_PODS_PATH = "/api/v1/namespaces/{namespace}/pods"


@dataclass
class DaemonSetStop:
    """What ``stop_daemonset`` saw: ``found`` (the DaemonSet existed), ``stopped`` (its pods are
    gone), ``waited_s``, and ``left`` ("pod on node" for each pod still there at the timeout)."""

    namespace: str
    name: str
    found: bool
    stopped: bool
    waited_s: float = 0.0
    pods_seen: int = 0
    left: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the log of the hook."""
        where = f"DaemonSet {self.namespace}/{self.name}"
        if not self.found:
            return f"{where} not found: nothing to stop"
        if self.stopped:
            return (
                f"{where} deleted; its {self.pods_seen} pod(s) stopped within "
                f"{self.waited_s:.0f} s"
            )
        return (
            f"{where} deleted, but after {self.waited_s:.0f} s {len(self.left)} pod(s) still "
            f"run: {', '.join(self.left)}; their dynamic labels may stay (run `omaticaya cleanup` "
            "with NODE_NAME set on those nodes)"
        )


def label_selector(selector: Mapping[str, Any]) -> str:
    """A LabelSelector object (``matchLabels``, ``matchExpressions``) as the ``labelSelector``
    query text: ``a=b,c in (d,e),!f``. An empty selector is the empty string (every pod)."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ValueError(f"unknown label selector operator {op!r}")
    return ",".join(parts)


def owned_pods(pods: list[Mapping[str, Any]], owner_uid: str) -> list[Mapping[str, Any]]:
    """The pods among ``pods`` that the object ``owner_uid`` owns (an ownerReference)."""
    return [
        p
        for p in pods
        if any(
            ref.get("uid") == owner_uid
            for ref in (p.get("metadata", {}).get("ownerReferences") or [])
        )
    ]


def _where(pod: Mapping[str, Any]) -> str:
    name = pod.get("metadata", {}).get("name", "?")
    node = (pod.get("spec") or {}).get("nodeName")
    return f"{name} on {node}" if node else name


def stop_daemonset(
    session: ApiSession,
    namespace: str,
    name: str,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DaemonSetStop:
    """Delete DaemonSet ``namespace/name`` (propagationPolicy Foreground, precondition: its uid)
    and poll until no pod it owns is left, at most ``timeout_s`` seconds.

    A DaemonSet that is not there is nothing to stop (``found`` False). Returns a
    ``DaemonSetStop``: ``stopped`` False when pods were left at the timeout. Raises
    ``KubeError`` when the API refuses or does not answer."""
    what = f"daemonset {namespace}/{name}"
    rbac = f"stop-daemonset needs get and delete on daemonsets, list on pods in {namespace}"
    params = {"namespace": namespace, "name": name}
    try:
        response = session.call(
            "get", what, lambda: session.http("GET", _DS_PATH, path_params=params), rbac=rbac
        )
    except KubeNotFound:
        return DaemonSetStop(namespace, name, found=False, stopped=True)
    ds = json.loads(response.data)
    uid = ds["metadata"]["uid"]
    selector = label_selector((ds.get("spec") or {}).get("selector") or {})
    start = clock()
    if not ds["metadata"].get("deletionTimestamp"):
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Foreground",
            "preconditions": {"uid": uid},
        }
        try:
            session.call(
                "delete",
                what,
                lambda: session.http(
                    "DELETE",
                    _DS_PATH,
                    path_params=params,
                    body=body,
                    content_type="application/json",
                ),
                rbac=rbac,
            )
        except (KubeNotFound, KubeConflict):  # gone already, or replaced (uid precondition)
            pass
    seen: set[str] = set()
    while True:
        response = session.call(
            "list",
            f"pods of {what}",
            lambda: session.http(
                "GET",
                _PODS_PATH,
                path_params={"namespace": namespace},
                query={"labelSelector": selector} if selector else None,
            ),
            rbac=rbac,
        )
        left = owned_pods(json.loads(response.data).get("items") or [], uid)
        seen.update(p["metadata"]["uid"] for p in left)
        waited = clock() - start
        if not left:
            return DaemonSetStop(
                namespace, name, found=True, stopped=True, waited_s=waited, pods_seen=len(seen)
            )
        if waited >= timeout_s:
            return DaemonSetStop(
                namespace,
                name,
                found=True,
                stopped=False,
                waited_s=waited,
                pods_seen=len(seen),
                left=sorted(_where(p) for p in left),
            )
        sleep(min(poll_s, max(timeout_s - waited, 0.0)))
