"""Device health for the kubelet (KEP-4680, ``DRAResourceHealth.NodeWatchResources``): what each
device's health is in one reading, pure.

The kubelet keeps each reported device's health for ``health_check_timeout_seconds`` after the
report that carried it (its own clock), then shows it Unknown; so the plugin reports every
device again at each tick of the agent, with the timeout set to the agent's stuck-reading bound
(``core.config.settings.stuck_after_s``): an agent whose ticks stop has its devices turn Unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..core.publish.dra import DraDevice, parse_device_name

__all__ = ["HEALTHY", "UNHEALTHY", "UNKNOWN", "DeviceHealth", "report"]

#: the kubelet's HealthStatus values (the same numbers in v1 and v1alpha1)
UNKNOWN = 0
HEALTHY = 1
UNHEALTHY = 2


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device's health as reported: ``device`` (its name), ``status`` (``HEALTHY``,
    ``UNHEALTHY``, ``UNKNOWN``) and ``message`` (the health rules' reasons, or why unknown)."""

    device: str
    status: int
    message: str = ""


def report(devices: Sequence[DraDevice] | None, known: Iterable[str],
           why_unknown: str = "no reading of the GPUs yet") -> tuple[DeviceHealth, ...]:  # fmt: skip
    """Each device's health, in name order: every device of ``devices`` (the latest reading's
    ``core.publish.dra.inventory``; ``None``: no usable reading, ``why_unknown`` says why) Healthy, or
    Unhealthy with its reasons; each of ``known`` (devices reported before, or prepared) that
    the reading lacks, Unknown."""
    out: dict[str, DeviceHealth] = {}
    for name in known:
        out[name] = DeviceHealth(name, UNKNOWN, why_unknown if devices is None else "not in the reading")
    for d in devices or ():
        if d.healthy:
            out[d.name] = DeviceHealth(d.name, HEALTHY)
        else:
            out[d.name] = DeviceHealth(d.name, UNHEALTHY, ", ".join(d.reasons))
    return tuple(out[name] for name in sorted(out, key=_order))


def _order(name: str) -> tuple[int, str, int, str]:
    """Our devices first, by GPU then MIG index (the GPU's own device before its MIG devices),
    then any other name."""
    parsed = parse_device_name(name)
    if parsed is None:
        return (1, "", 0, name)
    return (0, parsed[0], -1 if parsed[1] is None else parsed[1], name)
