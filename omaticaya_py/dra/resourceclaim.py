"""A ResourceClaim as the DRA plugin reads it: the claim the kubelet names (``ClaimRef``), its
JSON as the API server returns it (``obj``, ``items``: a field of the wrong shape is ``Refused``
naming it), the opaque configuration of our driver (``OpaqueConfig``) and a slice's
``consumedCapacity`` (``capacity_mib``). Pure.

Opaque configuration (``status.allocation.devices.config`` entries whose ``opaque.driver`` is
ours): ``{"apiVersion": "gpu.omaticaya.io/v1alpha1", "kind": "GpuConfig"}`` with an optional
``mpsActiveThreadPercentage`` (1..100); anything else is refused, naming the field. Entries
apply to their ``requests`` (all when empty); a claim's entry wins over its class's, a later
over an earlier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..core.publish.dra import DRIVER

__all__ = [
    "CONFIG_API_VERSION",
    "CONFIG_KIND",
    "MAX_SLICE_MIB",
    "THREADS_FIELD",
    "ClaimRef",
    "OpaqueConfig",
    "Refused",
    "applies",
    "capacity_mib",
    "items",
    "obj",
    "opaque_configs",
    "threads_for",
]

#: the opaque configuration this driver accepts
CONFIG_API_VERSION = "gpu.omaticaya.io/v1alpha1"
CONFIG_KIND = "GpuConfig"
#: its one field: a slice's share of the GPU's threads under MPS, percent
THREADS_FIELD = "mpsActiveThreadPercentage"

MIB_BYTES = Decimal(1 << 20)
#: the largest slice ``capacity_mib`` takes, MiB (1 PiB: more than any GPU has; a bound so that
#: an absurd quantity such as ``1e400`` is refused, not carried into the arithmetic)
MAX_SLICE_MIB = 1 << 30


class Refused(Exception):
    """A claim that cannot be prepared; ``str()`` is the reason (the pod's event)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """The claim the kubelet names: ``namespace``, ``name``, ``uid``."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """One opaque ``GpuConfig`` entry of ours: the ``requests`` it applies to (empty: all),
    ``threads_pct`` (its ``mpsActiveThreadPercentage``, 1..100; ``None``: not set) and
    ``where`` (its field path in the claim, for a refusal's reason)."""

    requests: tuple[str, ...]
    threads_pct: int | None
    where: str


def capacity_mib(quantity: object) -> int:
    """A ``consumedCapacity`` ``memory`` (a Kubernetes quantity: ``20Gi``, ``20480Mi``) in MiB,
    from 1 to ``MAX_SLICE_MIB``. Raises ``Refused`` when it is no quantity (``NaN``, a list), not
    a whole positive number of MiB (``-1``, ``1000k``) or out of range (``1e400``)."""
    from ..kube.quantity import parse_quantity

    if not isinstance(quantity, str):
        raise Refused(f"consumedCapacity memory: expected a quantity like '20Gi'; got {quantity!r:.64}")
    try:
        amount = Decimal(parse_quantity(quantity))
        if not amount.is_finite():
            raise ValueError("not finite")
        mib = amount / MIB_BYTES
        whole = amount > 0 and mib == mib.to_integral_value()
    except (ValueError, ArithmeticError):
        raise Refused(f"consumedCapacity memory: not a quantity: {quantity!r:.64}") from None
    if not whole:
        raise Refused(f"consumedCapacity memory {quantity:.64}: not a whole positive number of MiB")
    if mib > MAX_SLICE_MIB:
        raise Refused(f"consumedCapacity memory {quantity:.64}: more than {MAX_SLICE_MIB} MiB, "
                      "larger than any GPU")  # fmt: skip
    return int(mib)


def obj(value: object, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; raises ``Refused`` naming ``where`` otherwise."""
    if not isinstance(value, dict):
        raise Refused(f"{where}: expected an object")
    return value


def items(value: object, where: str) -> list[Any]:
    """``value`` when it is a JSON list (``None``: empty); raises ``Refused`` naming ``where``
    otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Refused(f"{where}: expected a list")
    return value


def applies(requests: Sequence[str], request: str) -> bool:
    """Whether a config entry for ``requests`` (empty: all) applies to a result of
    ``request`` (``<request>`` or ``<request>/<subrequest>``)."""
    if not requests:
        return True
    return any(request == r or request.startswith(r + "/") for r in requests)


def _config_threads(entry: Mapping[str, Any], where: str) -> int | None:
    """One opaque entry of ours, checked: its ``mpsActiveThreadPercentage`` (``None``: not
    set). Raises ``Refused`` naming the field."""
    opaque = obj(entry.get("opaque"), f"{where}.opaque")
    params = opaque.get("parameters")
    if not isinstance(params, dict):
        raise Refused(f"{where}.opaque.parameters: expected an object with apiVersion "
                      f"{CONFIG_API_VERSION} and kind {CONFIG_KIND}")  # fmt: skip
    if params.get("apiVersion") != CONFIG_API_VERSION:
        raise Refused(f"{where}.opaque.parameters.apiVersion: expected {CONFIG_API_VERSION}; "
                      f"got {params.get('apiVersion')!r:.64}")  # fmt: skip
    if params.get("kind") != CONFIG_KIND:
        raise Refused(f"{where}.opaque.parameters.kind: expected {CONFIG_KIND}; got "
                      f"{params.get('kind')!r:.64}")  # fmt: skip
    for key in params:
        if key not in ("apiVersion", "kind", THREADS_FIELD):
            raise Refused(f"{where}.opaque.parameters.{key:.64}: unknown field (GpuConfig has "
                          f"only {THREADS_FIELD})")  # fmt: skip
    threads = params.get(THREADS_FIELD)
    if threads is None:
        return None
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 100:
        raise Refused(f"{where}.opaque.parameters.{THREADS_FIELD}: expected an integer from 1 to "
                      f"100; got {threads!r:.32}")  # fmt: skip
    return threads


def opaque_configs(allocation: Mapping[str, Any]) -> list[OpaqueConfig]:
    """Our opaque entries of ``status.allocation`` (``devices.config``), checked, in the order
    they apply (class first, then claim; each in order): a later entry wins. Raises
    ``Refused`` naming the field of a bad one."""
    out: list[tuple[int, int, OpaqueConfig]] = []
    entries = items(obj(allocation.get("devices") or {}, "status.allocation.devices").get("config"),
                    "status.allocation.devices.config")  # fmt: skip
    for i, raw in enumerate(entries):
        where = f"status.allocation.devices.config[{i}]"
        entry = obj(raw, where)
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER:
            continue  # another driver's, or not opaque
        requests = tuple(str(r) for r in items(entry.get("requests"), f"{where}.requests"))
        threads = _config_threads(entry, where)
        rank = 1 if entry.get("source") == "FromClaim" else 0
        out.append((rank, i, OpaqueConfig(requests, threads, where)))
    out.sort(key=lambda e: (e[0], e[1]))
    return [config for _, _, config in out]


def threads_for(configs: Sequence[OpaqueConfig], request: str) -> OpaqueConfig | None:
    """The entry of ``configs`` (in the order they apply) whose ``mpsActiveThreadPercentage``
    applies to a result of ``request``: the last that sets it (``None``: none)."""
    found = None
    for config in configs:
        if applies(config.requests, request) and config.threads_pct is not None:
            found = config
    return found
