"""Who uses each GPU, once a tick: the kubelet's PodResources, NVML's processes and /proc.

``Attribution.observe(snapshot)`` asks the kubelet which container holds which GPU or MIG device
(``kube.podresources``), reads the cgroup of every compute process NVML listed
(``sources.procs``) and joins the two (``core.rules.attribution.attribute``): per device, the pods
holding it and the memory of processes in no pod (out-of-band). Either half may be missing and
the other still counts: no PodResources socket (said once) leaves the holders empty; PIDs not
visible from here (no ``hostPID``) are unknown, never out-of-band. Nothing here raises.

The holders are those of the device plugin's whole-GPU resource
(``OMATICAYA_DEVICE_PLUGIN_RESOURCE``, renamed or not), of NVIDIA's GPU resources
(``nvidia.com/...``: its plugin may run beside ours) and of the shared resource
(``OMATICAYA_SHARED_RESOURCE``: memory units ``<GPU UUID>::<k>``, held on their GPU). A unit
that names no GPU of this node is skipped and counted (``skipped["unknown-gpu"]``). With
``names`` set (``PodNames``: pods read from the API), processes are named by pod and
container, which is what tells each slice's use on a shared GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.allocation.slice_use import stray_unit_ids
from ..core.config.settings import Settings
from ..core.model.sayonce import SayOnce
from ..core.model.sharing import DEFAULT_SHARED_RESOURCE, Sharing
from ..core.model.snapshot import GpuProcess, NodeSnapshot
from ..core.publish.dra import DRIVER, claim_holders
from ..core.rules.attribution import (
    ContainerDevices,
    GpuAttribution,
    PodIdentity,
    attribute,
)
from ..kube.podresources import PodResourcesAbsent, PodResourcesClient, PodResourcesError
from ..sources.procs import read_pod_refs

__all__ = ["Attribution", "DraPool", "PodNames", "device_processes", "make_attribution", "unread_devices"]

#: the most pods ``PodNames`` reads in one API round (a node holds few slices; a burst waits a
#: round)
_MAX_GETS = 32
#: NVIDIA's device plugin resources, whose holders are reported beside our own resources
GPU_RESOURCE_PREFIX = "nvidia.com/"
#: the device plugin's whole-GPU resource by default (``Settings.device_plugin_resource``)
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


def device_processes(snapshot: NodeSnapshot) -> dict[str, tuple[GpuProcess, ...]]:
    """Device ID (GPU UUID; with MIG on, each MIG device's UUID) -> its compute processes, for
    every unit with a UUID, idle ones included (their holders still count)."""
    out: dict[str, tuple[GpuProcess, ...]] = {}
    for g in snapshot.gpus:
        if g.error is not None:
            continue
        if g.mig_enabled:
            for m in g.mig_devices:
                if m.uuid and m.error is None:
                    out[m.uuid] = m.processes
        elif g.uuid:
            out[g.uuid] = g.processes
    return out


def unread_devices(snapshot: NodeSnapshot) -> list[str]:
    """The device IDs (GPU UUIDs; with MIG on, MIG device UUIDs) of the GPUs and MIG devices
    read with an error this tick whose UUID is known (from an earlier read): their holders are
    kept (``core.rules.attribution.attribute``'s ``unread``), not taken as gone."""
    out: list[str] = []
    for g in snapshot.gpus:
        if g.error is not None and g.uuid and not g.mig_enabled:
            out.append(g.uuid)
        out.extend(m.uuid for m in g.mig_devices if m.uuid and (m.error or g.error))
    return out


@dataclass(frozen=True, slots=True)
class DraPool:
    """The DRA driver's devices an ``Attribution`` reads (``core.publish.dra.claim_holders``):
    those of ``node_name``'s pool only (this Node's ResourceSlice), the slices of ``sharing``'s
    shared GPUs left out."""

    node_name: str
    sharing: Sharing


class Attribution:
    """The attribution edge of one agent.

    - ``socket_path``: the kubelet's PodResources socket (``None``: holders are not asked for).
    - ``gpu_resource``, ``shared_resource``: the device plugin's whole-GPU and shared resources,
      whose holders are reported with those of ``nvidia.com/*``.
    - ``proc_root``: where the host's ``/proc`` is seen (``/proc`` on the host or with
      ``hostPID``; ``None``: processes are not placed, all unknown).
    - ``dra``: the DRA driver's devices to read (``DraPool``); ``None``: DRA devices are not
      read.
    - ``errors``: PodResources failures by gRPC code (``absent`` for no socket), for
      ``/metrics``; ``skipped``: device IDs skipped, by reason (``unknown-gpu``: a unit of
      ``shared_resource`` that names no GPU of this node; ``unknown-dra-device``: a DRA device
      of our driver that names no device of this Node's reading).
    - ``names``: called each tick for ``(pod UID -> (namespace, name), container ID -> name)``
      (``None``: processes are keyed by UID and container ID only).
    """

    def __init__(
        self,
        socket_path: Path | None,
        proc_root: Path | None,
        *,
        client_factory: Callable[[Path], Any] = PodResourcesClient,
        shared_resource: str = DEFAULT_SHARED_RESOURCE,
        gpu_resource: str = DEFAULT_GPU_RESOURCE,
        dra: DraPool | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.dra = dra
        self.shared_resource = shared_resource
        self.gpu_resource = gpu_resource
        self.skipped: Counter[str] = Counter()
        self.names: Callable[[], tuple[dict[str, tuple[str, str]], dict[str, str]]] | None = None
        self.client = client_factory(socket_path) if socket_path is not None else None
        self.socket_path = socket_path
        self.errors: Counter[str] = Counter()
        #: said once: a kind of PodResources failure (until it answers again), stray unit IDs
        self._said: SayOnce[str, str] = SayOnce()
        #: the last ``observe`` listed the kubelet's assignments (False: no socket, or it failed)
        self.listed = False

    def observe(self, snapshot: NodeSnapshot) -> dict[str, GpuAttribution]:
        """Device ID -> ``GpuAttribution`` for this snapshot (``{}`` when NVML could not be
        read)."""
        self.listed = False
        if snapshot.error is not None:
            return {}
        processes = device_processes(snapshot)
        pids = {p.pid for procs in processes.values() for p in procs}
        refs = read_pod_refs(pids, self.proc_root) if pids and self.proc_root else {}
        listed = self._holders()
        holders = tuple(a for a in listed if a.resource_name != DRIVER)
        if self.dra is not None:
            dra, unknown = claim_holders(listed, self.dra.node_name, snapshot, self.dra.sharing)
            holders += tuple(dra)
            if unknown:
                self.skipped["unknown-dra-device"] += unknown
        stray = stray_unit_ids(holders, (g.uuid for g in snapshot.gpus if g.uuid))
        if stray:
            self.skipped["unknown-gpu"] += len(stray)
            if self._said.start("stray", ""):  # once: the checkpoint names another node's GPUs
                logger.warning(
                    "PodResources lists {} unit(s) of {} naming no GPU of this node (first: "
                    "{!r}); skipped, counted", len(stray), self.shared_resource, stray[0][:80],
                )
        pod_names, container_names = self.names() if self.names is not None else ({}, {})
        return attribute(
            processes, refs, holders, pod_names=pod_names, container_names=container_names,
            unread=unread_devices(snapshot),
        )

    def _holders(self) -> tuple[ContainerDevices, ...]:
        if self.client is None:
            return ()
        try:
            listed = self.client.list()
        except PodResourcesError as exc:
            code = "absent" if isinstance(exc, PodResourcesAbsent) else getattr(exc, "code", "")
            self.errors[code or "unknown"] += 1
            if self._said.start("podresources", code):  # once per kind, not every tick
                # no socket: not on a kubelet's node (or not mounted): expected, said quietly
                log = logger.info if code == "absent" else logger.warning
                log(
                    "no pod attribution from the kubelet ({}); GPUs are published without "
                    "their pods, retrying each tick", exc,
                )
            return ()
        if self._said.end("podresources") is not None:
            logger.info("kubelet PodResources answering again on {}", self.socket_path)
        self.listed = True
        return tuple(
            a for a in listed
            if a.resource_name.startswith(GPU_RESOURCE_PREFIX)
            or a.resource_name in (self.gpu_resource, self.shared_resource, DRIVER)
        )

    def close(self) -> None:
        """Close the gRPC channel."""
        if self.client is not None:
            self.client.close()


def make_attribution(settings: Settings) -> Attribution | None:
    """The attribution edge the settings ask for: PodResources on ``pod_resources_socket``
    and processes through ``proc_root`` (either may be off); ``None`` when both are."""
    if settings.pod_resources_socket is None and settings.proc_root is None:
        return None
    return Attribution(
        settings.pod_resources_socket, settings.proc_root,
        shared_resource=settings.shared_resource,
        gpu_resource=settings.device_plugin_resource,
        dra=DraPool(settings.node_name, Sharing.of(settings))
        if settings.dra and settings.node_name is not None else None,
    )  # fmt: skip


class PodNames:
    """Pods holding slices of shared GPUs, as the API names them (``PodIdentity``), by
    ``(namespace, name)``. ``maps()`` gives the attribution its name lookups."""

    def __init__(self, refetch_s: float = 30.0, stranger_refetch_s: float = 300.0) -> None:
        self.refetch_s = refetch_s
        self.stranger_refetch_s = stranger_refetch_s
        self.known: dict[tuple[str, str], PodIdentity] = {}
        self._asked_s: dict[tuple[str, str], float] = {}

    def maps(self) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
        """``(pod UID -> (namespace, name), container ID -> container name)``."""
        pods = {p.uid: (p.namespace, p.name) for p in self.known.values() if p.uid}
        containers = {cid: n for p in self.known.values() for cid, n in p.containers.items()}
        return pods, containers

    def wanted(
        self, slices_by_gpu: Mapping[str, tuple[GpuAttribution, tuple]], now_s: float
    ) -> list[tuple[str, str]]:
        """Holders to read now: one not read yet; one not known (its read failed, or it was
        gone) ``refetch_s`` after the last read; a known one ``refetch_s`` after the last read
        while a process of it runs in a container the names lack (restarted), or
        ``stranger_refetch_s`` after while a process on its GPU is in a pod no name covers (a
        pod re-created under the same name, or a pod holding no slice: the latter costs one
        read per holder per ``stranger_refetch_s``). Forgets pods no longer holding a slice."""
        holding: set[tuple[str, str]] = set()
        out: list[tuple[str, str]] = []
        for att, slices in slices_by_gpu.values():
            strangers = any(p.pod is None for p in att.pods)
            restarted = {
                (p.namespace, p.pod) for p in att.pods
                if p.pod is not None and p.container is None and p.container_id
            }
            for s in slices:
                key = (s.namespace, s.pod)
                holding.add(key)
                asked = self._asked_s.get(key)
                if asked is None:
                    due = True
                elif key not in self.known or key in restarted:
                    due = now_s - asked >= self.refetch_s
                else:
                    due = strangers and now_s - asked >= self.stranger_refetch_s
                if due and key not in out:
                    out.append(key)
        for key in set(self.known) | set(self._asked_s):
            if key not in holding:
                self.known.pop(key, None)
                self._asked_s.pop(key, None)
        return out[:_MAX_GETS]

    def tried(self, key: tuple[str, str], now_s: float) -> None:
        """Note a read of ``key`` at ``now_s`` that got no answer (what is known stays)."""
        self._asked_s[key] = now_s

    def asked(self, key: tuple[str, str], now_s: float, found: PodIdentity | None) -> None:
        """Note a read of ``key`` at ``now_s``: its answer, or ``None`` (gone)."""
        self._asked_s[key] = now_s
        if found is None:
            self.known.pop(key, None)
        else:
            self.known[key] = found
