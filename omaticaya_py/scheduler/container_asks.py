"""What a pod's containers ask for of one resource, as Kubernetes counts it (pure).

``container_asks`` reads each container's ``limits`` (else ``requests``) as a whole number of
units (``_units``: a JSON integer or a Kubernetes quantity); ``effective_request`` is the
devices the pod takes by Kubernetes' own rule (sidecars included); ``held_slices`` and
``held_groups`` group a pod's units of shared GPUs as the kubelet's device manager hands them
out, init containers first, each container's on one GPU. ``scheduler.need`` builds a pod's
``Need`` from them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.schema import json_mapping

__all__ = ["MAX_UNITS", "Asks", "container_asks", "effective_request", "held_groups",
           "held_slices", "shown_value"]  # fmt: skip

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
                shown = shown_value(str(name) if isinstance(name, str) else "?")
                error = f"pod {kind} {shown} asks for {resource}={shown_value(str(raw))}"
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


def shown_value(raw: str) -> str:
    """``repr`` of a value for a message, cut to 40 characters."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")
