"""A pod's GPU need (pure): what the filter and the placements judge by.

Whole GPUs by annotation (``<prefix>/gpu-memory-mib``, ``<prefix>/gpu-count``), or memory
slices of shared GPUs by resource (``resources.limits`` or ``requests`` of the shared resource,
``omaticaya.io/gpu-memory`` by default, in units: ``core.model.sharing``); ``pod_need`` adds the pods
that ask for whole devices (``nvidia.com/gpu``, a MIG profile) without the memory annotation:
every GPU pod counts in flight.

A pod's containers are counted as Kubernetes counts them (``container_asks``): its app
containers (``spec.containers``) and its init containers (``spec.initContainers``), of which a
*sidecar* (``restartPolicy: Always``, a restartable init container, GA in 1.29) holds its
devices for the pod's whole life, while a plain one runs to completion before the next starts
and leaves its devices for the pod's later containers to reuse. One rule gives how many
devices a pod takes (``effective_request``: whole GPUs, and the total of its slices); its
slices are the same devices grouped by the GPU each group is on (``held_slices``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.allocation.placement import Need
from ..core.model.sharing import DEFAULT_GPU_RESOURCE, DEFAULT_SHARED_RESOURCE
from ..core.schema import json_int, json_mapping

__all__ = ["DEFAULT_GPU_RESOURCE", "MAX_GPU_COUNT", "MAX_MEMORY_MIB", "MAX_UNITS", "MIB", "Asks",
           "Need", "container_asks", "effective_request", "held_groups", "held_slices",
           "mig_resource_prefix", "need_reader", "parse_need", "parse_slices",
           "pod_need"]  # fmt: skip


#: a plain whole number: MiB (the annotation's unit)
_PLAIN_MIB = re.compile(r"^[0-9]{1,15}$")
#: a memory quantity with a binary or decimal suffix (``1.5Gi``, ``30G``; ``MiB`` spellings
#: too); negative numbers, exponents and milli-units are not memory sizes
_MEMORY_QUANTITY = re.compile(r"^([0-9]{1,15}(?:\.[0-9]{1,9})?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)(?:B)?$")
MIB = 1 << 20
#: the most a pod can ask for on one GPU (1 EiB), and GPUs per pod
MAX_MEMORY_MIB = 1 << 40
MAX_GPU_COUNT = 1_000_000
#: the most units one container can ask for (a 1 GiB unit: 1 PiB)
MAX_UNITS = 1 << 20
_UNITS = re.compile(r"^[0-9]{1,15}$")
#: a Kubernetes quantity (apimachinery's ``resource.Quantity`` grammar): a signed decimal
#: number, then a binary suffix, a decimal suffix or a decimal exponent (``1k``, ``1e3``,
#: ``1Ki``, ``1000m``), which the API server may write for a whole number of units (it
#: serialises the quantity 1000 as ``1k``)
_QUANTITY = re.compile(
    r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4}|[KMGTPE]i|[numkMGTPE])?$"
)


def _memory_mib(raw: str) -> int | None:
    """MiB from a plain whole number (MiB) or a quantity with a memory suffix, rounded up to
    whole MiB (``30G`` asks for 28611 MiB, never less than it said); ``None`` otherwise. The
    suffix arithmetic is the Kubernetes client's (``kube.parse_quantity``)."""
    text = raw.strip()
    if _PLAIN_MIB.match(text):
        return int(text)
    m = _MEMORY_QUANTITY.match(text)
    if not m:
        return None
    from ..kube import parse_quantity  # the kubernetes client loads only for a suffixed value

    try:
        size = parse_quantity(m.group(1) + m.group(2))
    except ValueError:
        return None
    return int(math.ceil(size / MIB))


def parse_slices(pod: Any, resource: str = DEFAULT_SHARED_RESOURCE) -> Need | None:
    """The slices ``pod`` asks for: each container's ``resources.limits[resource]`` (else its
    ``requests``), a whole number of units from 0 to ``MAX_UNITS``: a JSON number, or a
    Kubernetes quantity as the API writes it (``20``; ``1k``, ``2k``, ``1e3``, ``1Ki`` are
    1000, 2000, 1000 and 1024 units: ``_units``); ``None`` when the pod asks for none
    (``effective_request`` is 0). A value that is not a whole number of units in range
    (negative, a fraction, ``500m``, not a quantity) gives a ``Need`` with ``error`` naming the
    container and the value.

    App containers, sidecars and plain init containers all count (``container_asks``), grouped
    as the kubelet hands the units out (``held_slices``): a sidecar's slice is held beside the
    app containers' for the pod's life; a plain init container's slice is reused by the
    containers after it, and is bigger than theirs only when it exceeds what they hold. The
    units of the slices add up to the pod's ``effective_request``."""
    asks = container_asks(pod, resource)
    if asks.error is not None:
        return Need(0, 1, f"{asks.error}: expected a whole number of units from 0 to {MAX_UNITS}")
    if effective_request(asks.app, asks.init) == 0:
        return None
    slices, firsts, memory = held_groups(asks.app, asks.init)
    return Need(0, 1, slices=slices, resource=resource,
                firsts=firsts if firsts != slices else (),
                slice_memory=memory if memory != slices else ())  # fmt: skip


def _units(raw: Any) -> int | None:
    """Units from a JSON integer or a Kubernetes quantity string that is a whole number from 0
    to ``MAX_UNITS`` (``20``, ``1k``, ``1e3``, ``1Ki``, ``1000m``); ``None`` otherwise (``1.5``,
    ``500m``, ``-1``, ``2Mi``, a float, a bool). Digits are read directly; any other form by the
    Kubernetes client's parser (``kube.parse_quantity``, loaded only then)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if 0 <= raw <= MAX_UNITS else None
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    if _UNITS.match(text):
        n = int(text)
        return n if n <= MAX_UNITS else None
    if len(text) > 64 or not _QUANTITY.match(text):
        return None
    from ..kube import parse_quantity  # the kubernetes client loads only for a suffixed value

    try:
        value = parse_quantity(text)
    except ValueError:
        return None
    # range first: a huge exponent is never turned into an int
    if not 0 <= value <= MAX_UNITS or value != value.to_integral_value():
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class Asks:
    """What a pod's containers ask for of one resource, whole devices each (a container asking
    for none, or 0, is left out), in the order the kubelet allocates them: ``init``, each init
    container's ``(devices, sidecar)`` in ``spec.initContainers`` order (``sidecar``: its
    ``restartPolicy`` is ``Always``), then ``app``, each app container's in ``spec.containers``
    order. ``error``: the first malformed value, described as ``pod container 'c' asks for
    R='v'`` (``pod init container 'c' ...`` for an init container), or ``None``."""

    init: tuple[tuple[int, bool], ...] = ()
    app: tuple[int, ...] = ()
    error: str | None = None


def container_asks(pod: Any, resource: str) -> Asks:
    """The ``Asks`` of ``pod`` for ``resource``: each container's ``limits`` (else
    ``requests``), read by ``_units``. The pod is untrusted: ``spec.initContainers`` or
    ``spec.containers`` that is not a list, and an entry that is not an object, ask for
    nothing; an init container is a sidecar only when its ``restartPolicy`` is exactly
    ``Always`` (Kubernetes' ``IsRestartableInitContainer``; the API server accepts no other
    value there), any other value or none makes it a plain one."""
    spec = json_mapping(json_mapping(pod).get("spec"))
    init: list[tuple[int, bool]] = []
    app: list[int] = []
    for key, kind in (("initContainers", "init container"), ("containers", "container")):
        listed = spec.get(key)
        for c in listed if isinstance(listed, list) else ():
            c = json_mapping(c)
            res = json_mapping(c.get("resources"))
            limits, requests = json_mapping(res.get("limits")), json_mapping(res.get("requests"))
            raw = limits.get(resource, requests.get(resource))
            if raw is None:
                continue
            n = _units(raw)
            if n is None:
                name = c.get("name")
                shown = _shown(str(name) if isinstance(name, str) else "?")
                error = f"pod {kind} {shown} asks for {resource}={_shown(str(raw))}"
                return Asks(tuple(init), tuple(app), error)
            if n == 0:
                continue
            if key == "containers":
                app.append(n)
            else:
                init.append((n, c.get("restartPolicy") == "Always"))
    return Asks(tuple(init), tuple(app))


def effective_request(app: Sequence[int], init: Sequence[tuple[int, bool]] = ()) -> int:
    """The devices a pod takes of one resource, by Kubernetes' own rule (kube-scheduler's
    ``NodeResourcesFit`` and the kubelet's admission: ``resource.PodRequests``, sidecars
    included since 1.29): the larger of

    - the app containers' ``app`` plus every sidecar's (``init`` entries ``(n, True)``): all of
      them hold their devices at once, for the pod's life, and
    - for each plain init container (``(n, False)``), its ``n`` plus the sidecars declared
      before it, which run beside it (those after it start only once it is done).

    ``init`` in ``spec.initContainers`` order (``Asks.init``). Pure."""
    sidecars = peak = 0
    for n, sidecar in init:
        if sidecar:
            sidecars += n
        else:
            peak = max(peak, n + sidecars)
    return max(sum(app) + sidecars, peak)


def held_slices(app: Sequence[int], init: Sequence[tuple[int, bool]] = ()) -> tuple[int, ...]:
    """The slices a pod of ``app`` and ``init`` units (``Asks``) holds on shared GPUs: the
    units grouped by the GPU each group must be on, in the order the groups are first handed
    out. Their sum is ``effective_request(app, init)``.

    The kubelet's device manager (``devicemanager.Allocate``) hands out every container's
    units at admission, init containers first, each container's all on one GPU (the device
    plugin refuses a slice across two). A container first takes units the plain init
    containers before it leave for reuse (they run to completion first), then the rest from
    the GPU those are on (the kubelet asks the plugin to include the reused units, and the
    plugin takes a slice from one GPU); only when none is left does it start a GPU of its own.
    A plain init container's units, reused ones included, stay the pod's and are left for
    reuse; a sidecar's and an app container's are its own for the pod's life (taken out of
    reuse).

    So the tuple is modelled on that, not on the scalar rule alone:

    - app containers and sidecars with no plain init container's units left before them: a
      slice each, held together for the pod's life (a 20-unit sidecar and a 5-unit app:
      ``(20, 5)``);
    - a plain init container's slice is reused by the containers after it, which then share
      its GPU: it matters only where it exceeds what they hold there (an init of 5 then an app
      of 10: ``(10,)``; an init of 20 then apps of 10 and 10: ``(20,)``, both apps on its GPU,
      which must have 20 where two GPUs of 10 would not do; an init of 20 then apps of 15 and
      10: ``(25,)``; a sidecar of 10 then an init of 30 then an app of 5: ``(10, 30)``, the
      sidecar's beside the init's).

    Pure."""
    return held_groups(app, init)[0]


def held_groups(app: Sequence[int], init: Sequence[tuple[int, bool]] = ()
                ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """``(held_slices, firsts, memory)``: the slices; the units of each one's first container,
    the one the kubelet asks the device plugin to place it by (the later containers reusing
    its units stay on its GPU); and the units of each slice whose memory the device plugin
    counts once the pod is admitted: a plain init container whose units a later container
    reuses is over by then (``deviceplugin.slices.superseded``), so its slice counts no more,
    the reusing container's does (a 40-unit init before a 1-unit app: 40 units held, 1 counted
    in memory). Pure."""
    slices: list[int] = []
    firsts: list[int] = []
    live: list[list[tuple[int, bool]]] = []  # per slice: (units, plain init) still counting
    pool = 0  # units left for reuse, all on the GPU of ``slices[at]``
    at = -1
    plain = [not sidecar for _, sidecar in init] + [False] * len(app)
    for n, left in zip([n for n, _ in init] + list(app), plain, strict=True):
        taken = min(n, pool)
        if taken:
            slices[at] += n - taken  # the rest from the reused units' GPU
            live[at] = [(0, True) if was_plain else (u, False) for u, was_plain in live[at]]
            live[at].append((n, left))
        else:
            slices.append(n)
            firsts.append(n)
            live.append([(n, left)])
        if left:  # a plain init container: its units, reused ones included, left for reuse
            if not taken:
                at = len(slices) - 1
            pool += n - taken
        else:  # a sidecar or an app container keeps what it took
            pool -= taken
    return tuple(slices), tuple(firsts), tuple(sum(u for u, _ in g) for g in live)


def parse_need(
    pod: Any,
    prefix: str = "omaticaya.io",
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> Need | None:
    """The pod's need from ``<prefix>/gpu-memory-mib`` and ``<prefix>/gpu-count``; ``None``
    when the pod has no ``gpu-memory-mib`` annotation (or is not a pod object at all).

    Memory is MiB per GPU: a plain whole number is MiB, a quantity with a memory suffix
    (``30Gi``, ``1.5Gi``, ``30G``) is converted by the Kubernetes client's parser and rounded up
    to whole MiB; at most ``MAX_MEMORY_MIB``. The count is a whole number from 1 to
    ``MAX_GPU_COUNT`` (default 1). A bad value gives a ``Need`` with ``error`` set, naming the
    annotation and the expected form: every node then fails with it.

    A pod whose containers also ask for whole devices of ``gpu_resource`` (the device plugin's,
    ``nvidia.com/gpu``) is ``exclusive``: its count is the GPUs the kubelet hands it,
    ``effective_request`` of its app containers, sidecars and plain init containers (a 2-GPU
    sidecar beside a 1-GPU app container: 3; the annotation may say so too; a count that
    differs is an error), and each GPU it gets is taken whole.

    A pod whose containers ask for MIG devices of one profile (``nvidia.com/mig-1g.10gb``:
    ``mig_resource_prefix``) and no whole GPU is judged against the free MIG devices of that
    profile (``Need.profile``), never against whole GPUs; one that asks for two profiles is not
    judged here (``None``: kube-scheduler's own count decides).

    A pod that asks for slices of ``shared_resource`` (``parse_slices``) has that need; if its
    containers also ask for whole devices of ``gpu_resource``, it takes those too (``count``
    of them, ``exclusive``, each with ``gpu-memory-mib`` free when the annotation says so),
    and they are checked and reserved beside its slices."""
    sliced = parse_slices(pod, shared_resource)
    if sliced is not None and sliced.error:
        return sliced
    if sliced is not None:
        asks = container_asks(pod, gpu_resource)
        if asks.error is not None:
            return Need(0, 0, f"{asks.error}: expected a whole number of GPUs")
        devices = effective_request(asks.app, asks.init)
        if not devices:
            return sliced
        whole = _whole_need(pod, prefix, gpu_resource)
        if whole is not None and whole.error:
            return whole
        memory = whole.memory_mib if whole is not None else 0
        return replace(sliced, memory_mib=memory, count=devices, exclusive=True)
    return _whole_need(pod, prefix, gpu_resource)


def mig_resource_prefix(gpu_resource: str) -> str:
    """The prefix of the MIG resources beside ``gpu_resource``, NVIDIA's ``mixed`` naming:
    ``nvidia.com/gpu`` -> ``nvidia.com/mig-``."""
    domain, slash, _ = gpu_resource.rpartition("/")
    return f"{domain}{slash}mig-"


def _mig_profiles(pod: Any, gpu_resource: str) -> list[str]:
    """The MIG profiles ``pod``'s containers ask for (``limits`` or ``requests`` keys under
    ``mig_resource_prefix``), in first-seen order."""
    prefix = mig_resource_prefix(gpu_resource)
    spec = json_mapping(json_mapping(pod).get("spec"))
    found: dict[str, None] = {}
    for key in ("initContainers", "containers"):
        listed = spec.get(key)
        for c in listed if isinstance(listed, list) else ():
            res = json_mapping(json_mapping(c).get("resources"))
            for part in (json_mapping(res.get("limits")), json_mapping(res.get("requests"))):
                for name in part:
                    if isinstance(name, str) and name.startswith(prefix) and len(name) > len(prefix):
                        found.setdefault(name[len(prefix):], None)
    return list(found)


def _whole_need(pod: Any, prefix: str, gpu_resource: str) -> Need | None:
    """The annotation part of ``parse_need``: whole GPUs (or MIG devices) with memory free."""
    meta = json_mapping(json_mapping(pod).get("metadata"))
    annotations = json_mapping(meta.get("annotations"))
    mem_key, count_key = f"{prefix}/gpu-memory-mib", f"{prefix}/gpu-count"
    if mem_key not in annotations:
        return None
    raw_mem, raw_count = str(annotations[mem_key]), str(annotations.get(count_key, "1"))
    shown_mem, shown_count = _shown(raw_mem), _shown(raw_count)
    memory = _memory_mib(raw_mem) if len(raw_mem) <= 64 else None
    if memory is None:
        return Need(
            0, 1, f"pod annotation {mem_key}={shown_mem} is not a memory size: expected MiB as "
            "a whole number (30720) or a quantity (30Gi, 1.5Gi)",
        )  # fmt: skip
    if memory > MAX_MEMORY_MIB:
        return Need(0, 1, f"pod annotation {mem_key}={shown_mem} asks for more than 1 EiB")
    asks = container_asks(pod, gpu_resource)
    if asks.error is not None:
        return Need(memory, 1, f"{asks.error}: expected a whole number of GPUs")
    devices = effective_request(asks.app, asks.init)
    profile = None
    if not devices and (profiles := _mig_profiles(pod, gpu_resource)):
        if len(profiles) > 1:
            return None
        profile = profiles[0]
        mig = mig_resource_prefix(gpu_resource) + profile
        asks = container_asks(pod, mig)
        if asks.error is not None:
            return Need(memory, 1, f"{asks.error}: expected a whole number of MIG devices")
        devices = effective_request(asks.app, asks.init)
        gpu_resource = mig
    if devices and count_key not in annotations:
        raw_count = str(devices)
    count = json_int(raw_count)
    if count is None or not 1 <= count <= MAX_GPU_COUNT:
        return Need(
            memory, 1,
            f"pod annotation {count_key}={shown_count} is not a whole number from 1 to "
            f"{MAX_GPU_COUNT}",
        )  # fmt: skip
    if devices and devices != count:
        return Need(
            memory, count,
            f"pod annotation {count_key}={shown_count} differs from the {devices} "
            f"{gpu_resource} its containers ask for: the kubelet hands it {devices} GPUs",
        )  # fmt: skip
    return Need(memory, count, exclusive=devices > 0, profile=profile if devices else None)


def _devices_alone(pod: Any, gpu_resource: str) -> Need | None:
    """The need of a pod without the memory annotation: ``effective_request`` whole devices of
    ``gpu_resource`` (else of the one MIG profile it asks for), each taken whole with no memory
    asked (``Need(0, n, exclusive=True)``); ``None`` when it asks for none, or for two MIG
    profiles; a malformed count is the ``Need``'s ``error``."""
    resource, profile = gpu_resource, None
    asks = container_asks(pod, resource)
    if asks.error is None and not effective_request(asks.app, asks.init):
        profiles = _mig_profiles(pod, gpu_resource)
        if len(profiles) != 1:
            return None
        profile = profiles[0]
        resource = mig_resource_prefix(gpu_resource) + profile
        asks = container_asks(pod, resource)
    if asks.error is not None:
        what = "MIG devices" if profile else "GPUs"
        return Need(0, 1, f"{asks.error}: expected a whole number of {what}")
    devices = effective_request(asks.app, asks.init)
    if not devices:
        return None
    return Need(0, devices, exclusive=True, profile=profile)


def pod_need(
    pod: Any,
    prefix: str = "omaticaya.io",
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> Need | None:
    """Every GPU pod's need, what the filter narrows, reserves and the ledger counts in flight:
    ``parse_need``'s, and for a pod without the ``<prefix>/gpu-memory-mib`` annotation that
    asks for whole devices of ``gpu_resource`` (``nvidia.com/gpu``: ``effective_request`` of
    its containers), or of one MIG profile, those devices with no memory asked
    (``Need(0, n, exclusive=True)``, ``profile`` for MIG): the device plugin hands it the
    devices first in its order (``core.allocation.placement.first_whole``) as it would any pod, so the
    next pod must be judged without them. ``None`` for a pod that asks for no GPU at all (or
    for two MIG profiles). A malformed device count (``1.5``) is the ``Need``'s ``error``."""
    need = parse_need(pod, prefix, shared_resource, gpu_resource)
    return need if need is not None else _devices_alone(pod, gpu_resource)


def need_reader(settings: Any) -> Callable[[Any], Need | None]:
    """``pod_need`` with the prefix and resources of ``settings`` (``ExtenderSettings``:
    ``prefix``, ``shared_resource``, ``device_plugin_resource``)."""
    prefix, shared, gpu = settings.prefix, settings.shared_resource, settings.device_plugin_resource
    return lambda pod: pod_need(pod, prefix, shared, gpu)


def _shown(raw: str) -> str:
    """``repr`` of a value for a message, cut to 40 characters."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")
