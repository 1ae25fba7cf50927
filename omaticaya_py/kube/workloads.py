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

__all__ = ["DaemonSetStop", "StopWait", "label_selector", "owned_pods", "stop_daemonset"]

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


@dataclass(frozen=True, slots=True)
class StopWait:
    """How ``stop_daemonset`` waits for the pods: at most ``timeout_s`` seconds, listing them
    every ``poll_s`` seconds; ``clock`` (monotonic seconds) and ``sleep`` are replaced in
    tests."""

    timeout_s: float
    poll_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def stop_daemonset(session: ApiSession, namespace: str, name: str,
                   wait: StopWait) -> DaemonSetStop:  # fmt: skip
    """Delete DaemonSet ``namespace/name`` (propagationPolicy Foreground, precondition: its uid)
    and poll until no pod it owns is left, as ``wait`` says (at most ``wait.timeout_s``
    seconds).

    A DaemonSet that is not there is nothing to stop (``found`` False). Returns a
    ``DaemonSetStop``: ``stopped`` False when pods were left at the timeout. Raises
    ``KubeError`` when the API refuses or does not answer."""
    target = _Target(namespace, name)
    try:
        response = _get_daemonset(session, target)
    except KubeNotFound:
        return DaemonSetStop(namespace, name, found=False, stopped=True)
    ds = json.loads(response.data)
    uid = ds["metadata"]["uid"]
    selector = label_selector((ds.get("spec") or {}).get("selector") or {})
    start = wait.clock()
    if not ds["metadata"].get("deletionTimestamp"):
        try:
            _delete_daemonset(session, target, uid)
        except (KubeNotFound, KubeConflict):  # gone already, or replaced (uid precondition)
            pass
    seen: set[str] = set()
    while True:
        left = owned_pods(json.loads(_list_pods(session, target, selector).data).get("items") or [], uid)
        seen.update(p["metadata"]["uid"] for p in left)
        waited = wait.clock() - start
        if not left:
            return DaemonSetStop(
                namespace, name, found=True, stopped=True, waited_s=waited, pods_seen=len(seen)
            )
        if waited >= wait.timeout_s:
            return DaemonSetStop(
                namespace,
                name,
                found=True,
                stopped=False,
                waited_s=waited,
                pods_seen=len(seen),
                left=sorted(_where(p) for p in left),
            )
        wait.sleep(min(wait.poll_s, max(wait.timeout_s - waited, 0.0)))


@dataclass(frozen=True, slots=True)
class _Target:
    """The DaemonSet ``namespace/name`` that ``stop_daemonset``'s requests are about."""

    namespace: str
    name: str

    @property
    def what(self) -> str:
        """How errors name it."""
        return f"daemonset {self.namespace}/{self.name}"

    @property
    def rbac(self) -> str:
        """What a refused request lacked."""
        return f"stop-daemonset needs get and delete on daemonsets, list on pods in {self.namespace}"

    @property
    def params(self) -> dict[str, str]:
        """The DaemonSet's path parameters."""
        return {"namespace": self.namespace, "name": self.name}


def _get_daemonset(session: ApiSession, target: _Target) -> Any:
    """GET the DaemonSet; the response. Raises ``KubeError``."""
    return session.call(
        "get", target.what, lambda: session.http("GET", _DS_PATH, path_params=target.params),
        rbac=target.rbac,
    )  # fmt: skip


def _delete_daemonset(session: ApiSession, target: _Target, uid: str) -> None:
    """DELETE the DaemonSet, propagationPolicy Foreground, precondition: ``uid``. Raises
    ``KubeError``."""
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Foreground",
        "preconditions": {"uid": uid},
    }
    session.call(
        "delete",
        target.what,
        lambda: session.http(
            "DELETE",
            _DS_PATH,
            path_params=target.params,
            body=body,
            content_type="application/json",
        ),
        rbac=target.rbac,
    )


def _list_pods(session: ApiSession, target: _Target, selector: str) -> Any:
    """GET the pods of the DaemonSet's namespace that match ``selector`` (``""``: all); the
    response. Raises ``KubeError``."""
    return session.call(
        "list",
        f"pods of {target.what}",
        lambda: session.http(
            "GET",
            _PODS_PATH,
            path_params={"namespace": target.namespace},
            query={"labelSelector": selector} if selector else None,
        ),
        rbac=target.rbac,
    )
