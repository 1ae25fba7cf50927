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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.allocation.placement import Need
from ..core.model.sharing import DEFAULT_GPU_RESOURCE, DEFAULT_SHARED_RESOURCE
from ..core.schema import json_int, json_mapping
from .container_asks import MAX_UNITS, container_asks, effective_request, held_groups, shown_value

__all__ = ["DEFAULT_GPU_RESOURCE", "MAX_GPU_COUNT", "MAX_MEMORY_MIB", "MIB", "Need",
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
    shown_mem, shown_count = shown_value(raw_mem), shown_value(raw_count)
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
