"""Who uses each GPU: pure rules that turn cgroup paths, NVML process lists and the kubelet's
device assignments into per-GPU attribution (pods holding it, memory per pod, out-of-band).

No I/O here: ``sources.procs`` reads ``/proc/<pid>/cgroup`` and ``kube.podresources`` asks the
kubelet; both hand their findings to these functions as plain values. Device IDs are what the
device plugin advertised, i.e. GPU UUIDs (``GPU-...``), MIG device UUIDs (``MIG-...``), or
memory units of a shared GPU (``GPU-...::<k>``, ``core.model.sharing``), which count on their GPU.

The slices of shared GPUs, who holds which and how much each uses, are ``core.allocation.slice_use``'s,
from these attributions and the pods as the API names them (``PodIdentity``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model.sharing import unit_gpu
from ..model.snapshot import GpuProcess, GpuReading

__all__ = [
    "ContainerDevices",
    "GpuAttribution",
    "PodIdentity",
    "PodMemory",
    "PodRef",
    "attribute",
    "gpu_out_of_band_mib",
    "holder_memory_mib",
    "out_of_band_mib",
    "pod_from_cgroup",
]


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod (and container) a process belongs to, as its cgroup path names them.

    ``pod_uid`` is the pod's ``metadata.uid``, lower case with dashes (``1b2c...-...``), or the
    32-hex hash the kubelet gives a static pod. ``container_id`` is the runtime's 64-hex
    container ID (the pod's sandbox for its pause process); ``None`` when the cgroup names the
    pod only (a process in the pod's own cgroup, CRI-O's conmon).
    """

    pod_uid: str
    container_id: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Devices of one resource that the kubelet assigned to one container.

    Source: one ``ContainerDevices`` entry of the kubelet's PodResources ``List`` (v1), with its
    pod's ``namespace`` and ``name`` (``pod``) and its container's ``name`` (``container``).
    ``device_ids`` are the device plugin's IDs, in the kubelet's order.
    """

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodMemory:
    """GPU memory held on one device by the processes of one container of a pod.

    ``pod_uid``/``container_id`` come from the processes' cgroups (``PodRef``);
    ``namespace``, ``pod`` and ``container`` are filled in from the caller's name lookups and
    are ``None`` when the lookups do not know the UID or container ID. ``used_memory_mib`` is
    the sum over ``pids`` (processes without a memory figure count 0).
    """

    pod_uid: str
    container_id: str | None
    namespace: str | None
    pod: str | None
    container: str | None
    used_memory_mib: int
    pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GpuAttribution:
    """Who uses one GPU or MIG device (``device_id``, its UUID).

    - ``holders``: the containers the kubelet assigned this device to (PodResources), in the
      kubelet's order.
    - ``pods``: memory per pod container, from the device's processes mapped through their
      cgroups; sorted by pod UID, then container ID.
    - ``out_of_band_memory_mib`` / ``out_of_band_pids``: processes whose cgroup names no pod
      (a process on the host, or in a container Kubernetes does not run).
    - ``unknown_memory_mib`` / ``unknown_pids``: processes whose cgroup could not be read (gone,
      or not visible from this PID namespace): neither in a pod nor proved out-of-band.
    - ``named_pods``: the ``(namespace, name)`` of every pod the name lookups knew (``None``:
      none were given); a holder named there whose processes are not among ``pods`` has none
      here (a shared GPU's slice uses nothing). Not compared.
    - ``read``: False when the device could not be read this tick (NVML answered it with an
      error): its ``holders`` still hold it (the kubelet has not freed it: a slice on it is
      not over), its processes and their memory are not known (``holder_memory_mib`` and
      ``out_of_band_mib`` say ``None``).
    """

    device_id: str
    holders: tuple[ContainerDevices, ...] = ()
    pods: tuple[PodMemory, ...] = ()
    out_of_band_memory_mib: int = 0
    out_of_band_pids: tuple[int, ...] = ()
    unknown_memory_mib: int = 0
    unknown_pids: tuple[int, ...] = ()
    named_pods: frozenset[tuple[str, str]] | None = field(default=None, compare=False)
    read: bool = True


# --- cgroup paths ---------------------------------------------------------------------------

_UID_DASHED = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UID_HASH = re.compile(r"[0-9a-f]{32}")  # a static pod's UID (hash of its manifest)
_CONTAINER_ID = r"[0-9a-f]{64}"
#: systemd driver: "[<root>-]kubepods[-<qos>]-pod<uid with _ for ->.slice", optionally with
#: runc's "slice:prefix:name" cgroup spelling appended (seen under containerd.service when the
#: runtime is told a systemd path it does not turn into units)
_SYSTEMD_POD = re.compile(
    r"(?:.+-)?kubepods(?:-(?:burstable|besteffort))?-pod(?P<uid>[0-9a-fA-F_-]+)\.slice"
    rf"(?::(?:cri-containerd|crio|docker):(?P<cid>{_CONTAINER_ID}))?"
)
#: cgroupfs driver: "pod<uid>" under a "kubepods" folder
_CGROUPFS_POD = re.compile(r"pod(?P<uid>[0-9a-fA-F-]+)")
#: a container's own cgroup under its pod: "<runtime>-<id>.scope" (systemd), "<id>" or
#: "crio-<id>" (cgroupfs)
_CONTAINER = re.compile(rf"(?:(?:cri-containerd|crio|docker)-)?(?P<cid>{_CONTAINER_ID})(?:\.scope)?")


def _pod_uid(raw: str) -> str | None:
    """A pod UID from a cgroup name's spelling (``_`` for ``-`` under systemd), or None."""
    uid = raw.replace("_", "-").lower()
    if _UID_DASHED.fullmatch(uid) or _UID_HASH.fullmatch(uid):
        return uid
    return None


def _ref_from_path(path: str) -> PodRef | None:
    """The PodRef named by one cgroup path, or None. The innermost pod folder wins (a
    kubelet nested in a container that itself runs in a pod)."""
    parts = [p for p in path.strip().split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        uid, cid = None, None
        m = _SYSTEMD_POD.fullmatch(parts[i])
        if m:
            uid, cid = _pod_uid(m["uid"]), m["cid"]
        else:
            m = _CGROUPFS_POD.fullmatch(parts[i])
            if m and any("kubepods" in p for p in parts[:i]):
                uid = _pod_uid(m["uid"])
        if uid is None:
            continue
        if cid is None and i + 1 < len(parts):
            c = _CONTAINER.fullmatch(parts[i + 1])
            cid = c["cid"] if c else None
        return PodRef(pod_uid=uid, container_id=cid)
    return None


def pod_from_cgroup(text: str) -> PodRef | None:
    """The pod a process is in, from the content of its ``/proc/<pid>/cgroup``.

    Each line is ``hierarchy-ID:controllers:path`` (cgroup v1: one line per hierarchy; v2: the
    single ``0::path``). Understands the kubelet's pod cgroups under both drivers and every QoS
    class: systemd (``kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``,
    ``crio-<id>.scope``, ``docker-<id>.scope``) and cgroupfs (``/kubepods/besteffort/pod<uid>/<id>``,
    Guaranteed pods directly under ``kubepods``), below any prefix (a kubelet in kind or in a
    container: ``/kubelet.slice/kubelet-kubepods.slice/...``,
    ``/system.slice/containerd.service/kubepods-...``). The first line naming a container wins,
    else the first naming a pod. Returns None for a process in no pod and for text that is not
    a cgroup file; never raises.
    """
    found: PodRef | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ref = _ref_from_path(fields[2])
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        found = found or ref
    return found


# --- the join ---------------------------------------------------------------------------------


def _pod_memory(
    by_container: dict[tuple[str, str | None], list[GpuProcess]],
    pod_names: Mapping[str, tuple[str, str]],
    container_names: Mapping[str, str],
) -> tuple[PodMemory, ...]:
    out: list[PodMemory] = []
    for (uid, cid), procs in sorted(by_container.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        namespace, pod = pod_names.get(uid, (None, None))
        out.append(
            PodMemory(
                pod_uid=uid,
                container_id=cid,
                namespace=namespace,
                pod=pod,
                container=container_names.get(cid) if cid is not None else None,
                used_memory_mib=_sum_mib(procs),
                pids=tuple(sorted(p.pid for p in procs)),
            )
        )
    return tuple(out)


def _sum_mib(procs: Iterable[GpuProcess]) -> int:
    return sum(p.used_memory_mib or 0 for p in procs)


def _sort_processes(
    procs: Iterable[GpuProcess], pod_refs: Mapping[int, PodRef | None]
) -> tuple[dict[tuple[str, str | None], list[GpuProcess]], list[GpuProcess], list[GpuProcess]]:
    """One device's processes by where they run, by ``pod_refs`` (PID -> ``PodRef``, or
    ``None``: in no pod): ``(by (pod UID, container ID), out-of-band, unknown)``, a PID
    missing from ``pod_refs`` unknown."""
    by_container: dict[tuple[str, str | None], list[GpuProcess]] = {}
    out_of_band: list[GpuProcess] = []
    unknown: list[GpuProcess] = []
    for p in procs:
        if p.pid not in pod_refs:
            unknown.append(p)
        elif (ref := pod_refs[p.pid]) is None:
            out_of_band.append(p)
        else:
            by_container.setdefault((ref.pod_uid, ref.container_id), []).append(p)
    return by_container, out_of_band, unknown


def attribute(
    processes: Mapping[str, Sequence[GpuProcess]],
    pod_refs: Mapping[int, PodRef | None],
    assignments: Iterable[ContainerDevices],
    *,
    pod_names: Mapping[str, tuple[str, str]] | None = None,
    container_names: Mapping[str, str] | None = None,
    unread: Iterable[str] = (),
) -> dict[str, GpuAttribution]:
    """Join one tick's three views of the node into a ``GpuAttribution`` per device.

    - ``processes``: device ID (GPU or MIG UUID) -> its NVML compute processes. Its keys are
      the devices reported: one result per key, in the same order (a device with no
      processes gets an entry too; assignments of other device IDs, e.g. another resource's,
      are ignored).
    - ``pod_refs``: PID -> ``PodRef`` (in a pod) or ``None`` (in no pod: out-of-band), as
      ``sources.procs.read_pod_refs`` returns; a PID missing from it is counted as unknown.
    - ``assignments``: the kubelet's PodResources entries (``ContainerDevices``).
    - ``pod_names``: pod UID -> (namespace, name); ``container_names``: container ID -> the
      container's name (both from the API's Pods on this node, e.g. ``status.containerStatuses``
      with the ``containerd://`` prefix removed). Optional: without them the memory is keyed
      by UID and container ID only.
    - ``unread``: device IDs (GPU or MIG UUIDs) of this node that could not be read this tick
      (an NVML error): each gets an entry after those of ``processes`` with its holders and
      ``read`` False, so that one unreadable tick does not read as its holders gone (a
      shared GPU's slices released for good: issue 38, fault 6).
    """
    names = pod_names or {}
    containers = container_names or {}
    holders: dict[str, list[ContainerDevices]] = {d: [] for d in processes}
    skipped = [d for d in dict.fromkeys(unread) if d not in holders]
    holders.update((d, []) for d in skipped)
    for a in assignments:
        # a memory unit of a shared GPU (``<GPU UUID>::<k>``) is held on its GPU: one entry
        # per container, however many units it holds there
        for device_id in dict.fromkeys(unit_gpu(d) or d for d in a.device_ids):
            if device_id in holders:
                holders[device_id].append(a)
    out: dict[str, GpuAttribution] = {}
    for device_id, procs in processes.items():
        by_container, out_of_band, unknown = _sort_processes(procs, pod_refs)
        out[device_id] = GpuAttribution(
            device_id=device_id,
            holders=tuple(holders[device_id]),
            pods=_pod_memory(by_container, names, containers),
            out_of_band_memory_mib=_sum_mib(out_of_band),
            out_of_band_pids=tuple(sorted(p.pid for p in out_of_band)),
            unknown_memory_mib=_sum_mib(unknown),
            unknown_pids=tuple(sorted(p.pid for p in unknown)),
            named_pods=frozenset(names.values()) if pod_names is not None else None,
        )
    for device_id in skipped:
        out[device_id] = GpuAttribution(device_id, tuple(holders[device_id]), read=False)
    return out


def holder_memory_mib(att: GpuAttribution) -> int | None:
    """The memory the holder of a device uses on it: the in-pod processes' memory when the
    device has exactly one holder and every process on it was placed (none unknown), since the
    kubelet gives a device to one container; ``None`` when that cannot be said."""
    if len(att.holders) != 1 or att.unknown_pids or not att.read:
        return None
    return sum(p.used_memory_mib for p in att.pods)


def out_of_band_mib(att: GpuAttribution) -> int | None:
    """The out-of-band memory of a device as far as it is known: the sum when every process on
    it was placed, or when some out-of-band memory was found (then a lower bound); ``None``
    when processes could not be placed (no host ``/proc``) and none was found."""
    if att.read and (att.out_of_band_memory_mib > 0 or not att.unknown_pids):
        return att.out_of_band_memory_mib
    return None


def gpu_out_of_band_mib(
    g: GpuReading, attribution: Mapping[str, GpuAttribution]
) -> int | None:
    """Out-of-band memory on GPU ``g`` as far as known (``out_of_band_mib`` of the GPU, or with
    MIG on the sum over its MIG devices); ``None`` when none of them is known."""
    ids = [m.uuid for m in g.mig_devices] if g.mig_enabled else [g.uuid]
    known = [
        mib
        for i in ids
        if i is not None and i in attribution
        if (mib := out_of_band_mib(attribution[i])) is not None
    ]
    return sum(known) if known else None


# -- the pods holding slices of shared GPUs, as the API names them ------------------------------


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod as the API names it: ``uid`` (``metadata.uid``) and ``containers``, container ID
    (the runtime's, without the ``containerd://`` scheme) -> container name, from
    ``status.containerStatuses`` and ``initContainerStatuses`` (empty before any started).
    What turns a process's cgroup (pod UID, container ID) into the names PodResources uses."""

    namespace: str
    name: str
    uid: str
    containers: Mapping[str, str]
