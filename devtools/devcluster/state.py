"""What a dev cluster is, as one JSON file (``<state dir>/state.json``) and its dataclasses.

Written by ``scripts/dev-cluster`` after every change (``up``, a process started or stopped),
read by it and by tests/devcluster.py and bench/common.py. Ports are TCP ports on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


class DevClusterError(RuntimeError):
    """The dev cluster could not be built, started or read (message says which part, and its
    log file)."""


@dataclass(frozen=True)
class Proc:
    """A process the supervisor started: ``pid`` (also its session and process group id), its
    start time in clock ticks since boot (``/proc/<pid>/stat`` field 22; with the pid, the
    process's identity) and the command it runs."""

    pid: int
    start_ticks: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Ports:
    """The control plane's ports on 127.0.0.1, chosen free by ``up``."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int


@dataclass(frozen=True)
class KubeletState:
    """The kubelet's Node name and ports (kept across ``down``/``up``)."""

    node: str
    port: int
    healthz_port: int


@dataclass(frozen=True)
class FullState:
    """A full cluster's network (``up --full``): the pod bridge, its subnet and gateway (where
    the API server is advertised and the kubelet listens), and the extra components' ports."""

    pod_bridge: str
    pod_subnet: str
    pod_gateway: str
    kcm_port: int
    proxy_healthz_port: int
    proxy_metrics_port: int


@dataclass
class State:
    """A dev cluster: ``ports``, the running ``procs`` by name (etcd, apiserver, scheduler,
    containerd, kubelet, controller-manager, proxy), ``kubelet`` once it was started, ``full``
    in a full cluster, ``image_key`` once the agent image is imported
    (``omaticaya-<version>-<hash>``, the name of scripts/build-image's tarball) and
    ``scheduler_image_key`` once the kube-scheduler image is (``kube-scheduler-<version>-<the
    binary's sha256, 16 hex digits>``), and the release it runs, ``kubernetes_version``."""

    ports: Ports
    procs: dict[str, Proc] = field(default_factory=dict)
    kubelet: KubeletState | None = None
    full: FullState | None = None
    image_key: str | None = None
    scheduler_image_key: str | None = None
    #: the Kubernetes release the processes run (``v1.37.2``); None in a state written before
    #: releases could be chosen (v1.20.2, no longer built)
    kubernetes_version: str | None = None

    def to_json(self) -> str:
        """The state as JSON (one object; ``procs`` maps names to ``{pid, start_ticks, argv}``)."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> State:
        """Parse ``to_json``'s output. Raises ``DevClusterError`` on anything else."""
        try:
            raw: dict[str, Any] = json.loads(text)
            return cls(
                ports=Ports(**raw["ports"]),
                procs={
                    name: Proc(int(p["pid"]), int(p["start_ticks"]), tuple(p["argv"]))
                    for name, p in (raw.get("procs") or {}).items()
                },
                kubelet=KubeletState(**raw["kubelet"]) if raw.get("kubelet") else None,
                full=FullState(**raw["full"]) if raw.get("full") else None,
                image_key=raw.get("image_key"),
                scheduler_image_key=raw.get("scheduler_image_key"),
                kubernetes_version=raw.get("kubernetes_version"),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise DevClusterError(f"unreadable dev cluster state: {e!r}") from e

    def save(self, state_dir: Path) -> None:
        """Write ``<state_dir>/state.json`` atomically (temp file + rename)."""
        tmp = state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, state_dir / STATE_FILE)


def load_state(state_dir: Path) -> State | None:
    """``<state_dir>/state.json``, or None when there is none (never ``up``). Raises
    ``DevClusterError`` when it is unreadable."""
    try:
        text = (Path(state_dir) / STATE_FILE).read_text()
    except FileNotFoundError:
        return None
    return State.from_json(text)
