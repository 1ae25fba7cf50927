"""A pod's GPU need (pure): what the filter and the placements judge by.

Whole GPUs by annotation (``<prefix>/gpu-memory-mib``, ``<prefix>/gpu-count``), or memory
slices of shared GPUs by resource (``resources.limits`` or ``requests`` of the shared resource,
``omaticaya.io/gpu-memory`` by default, in units: ``core.sharing``), one slice per container."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.schema import json_int, json_mapping
from ..core.sharing import DEFAULT_SHARED_RESOURCE

#: the device plugin's whole-GPU resource (``OMATICAYA_DEVICE_PLUGIN_RESOURCE``)
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"

__all__ = ["DEFAULT_GPU_RESOURCE", "MAX_GPU_COUNT", "MAX_MEMORY_MIB", "MAX_UNITS", "MIB", "Need",
           "need_reader", "parse_need", "parse_slices"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Need:
    """What a pod asks for: ``count`` GPUs with ``memory_mib`` free each, or, when ``slices``
    is set, one slice per container of a shared GPU: units of the shared resource (MiB: units
    x the node's ``share_unit_mib``). ``error`` is set when the pod's request is malformed
    (every node then fails with that message)."""

    memory_mib: int
    count: int = 1
    error: str | None = None
    slices: tuple[int, ...] = ()
    #: the shared resource the slices are of (for messages)
    resource: str = DEFAULT_SHARED_RESOURCE
    #: the pod also asks for whole devices of the device plugin's GPU resource
    #: (``nvidia.com/gpu``): the kubelet hands it ``count`` whole GPUs, which no other pod gets
    exclusive: bool = False

    def slice_mibs(self, unit_mib: int) -> tuple[int, ...]:
        """Each container's slice in MiB at ``unit_mib`` MiB per unit, in container order: the
        order the kubelet asks the device plugin for them (``slices.place_slices``)."""
        return tuple(u * unit_mib for u in self.slices)


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
    1000, 2000, 1000 and 1024 units: ``_units``); ``None`` when no container asks for any. A
    value that is not a whole number of units in range (negative, a fraction, ``500m``, not a
    quantity) gives a ``Need`` with ``error`` naming the container and the value. Init
    containers are not looked at."""
    asked, bad = _per_container(pod, resource)
    if bad is not None:
        return Need(0, 1, f"{bad}: expected a whole number of units from 0 to {MAX_UNITS}")
    units = [n for n in asked if n > 0]
    return Need(0, 1, slices=tuple(units), resource=resource) if units else None


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


def _per_container(pod: Any, resource: str) -> tuple[list[int], str | None]:
    """(the whole number of ``resource`` each container asking for it asks for, in container
    order; the first malformed value, described as ``pod container 'c' asks for R='v'``, or
    ``None``): each container's ``limits`` (else ``requests``), read by ``_units``. Init
    containers are not looked at (the kubelet reuses their devices for the app containers)."""
    spec = json_mapping(json_mapping(pod).get("spec"))
    containers = spec.get("containers")
    out: list[int] = []
    for c in containers if isinstance(containers, list) else ():
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
            return out, f"pod container {shown} asks for {resource}={_shown(str(raw))}"
        out.append(n)
    return out, None


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
    ``nvidia.com/gpu``) is ``exclusive``: its count is that many GPUs (the annotation may say
    so too; a count that differs is an error), and each GPU it gets is taken whole.

    A pod that asks for slices of ``shared_resource`` (``parse_slices``) has that need
    instead: its annotations are not read."""
    if (sliced := parse_slices(pod, shared_resource)) is not None:
        return sliced
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
    asked, bad = _per_container(pod, gpu_resource)
    if bad is not None:
        return Need(memory, 1, f"{bad}: expected a whole number of GPUs")
    devices = sum(asked)
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
    return Need(memory, count, exclusive=devices > 0)


def need_reader(settings: Any) -> Callable[[Any], Need | None]:
    """``parse_need`` with the prefix and resources of ``settings`` (``ExtenderSettings``:
    ``prefix``, ``shared_resource``, ``device_plugin_resource``)."""
    prefix, shared, gpu = settings.prefix, settings.shared_resource, settings.device_plugin_resource
    return lambda pod: parse_need(pod, prefix, shared, gpu)


def _shown(raw: str) -> str:
    """``repr`` of a value for a message, cut to 40 characters."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")
