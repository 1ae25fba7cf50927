"""Why a node fails the filter (pure): the codes, and the text kube-scheduler shows for each.

Why a node fails is a ``Reason`` code; the text kube-scheduler shows is made from the code in
one place (``TEXTS``, ``reason_text``) and carries its code (``ReasonText.code``), which the
metrics, the logs and ``FailedAndUnresolvableNodes`` read. ``wanted_text`` says a pod's need.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from ..core.allocation.placement import Need

__all__ = ["TEXTS", "Reason", "ReasonText", "reason_text", "wanted_text"]


class Reason(StrEnum):
    """Why a node failed the filter: the value is the ``reason`` label of
    ``omaticaya_extender_decisions_total``."""

    NOT_SYNCED = "not-synced"
    NOT_IN_CACHE = "not-in-cache"
    NO_TELEMETRY = "no-telemetry"
    UNUSABLE_TELEMETRY = "unusable-telemetry"
    STALE = "stale"
    UNHEALTHY = "unhealthy"
    NO_ROOM = "no-room"
    IN_FLIGHT = "in-flight"
    OTHER_NODE = "other-node"
    BAD_POD = "bad-pod"
    JUDGING_FAILED = "judging-failed"


#: the text kube-scheduler shows in the pod's FailedScheduling event, per code. Fields:
#: ``prefix`` (the label prefix), ``wanted`` (the pod's need, ``wanted_text``), ``why`` (the
#: detail: an age, a problem, the pod's own error), ``health`` (the node's ``gpu.health``)
TEXTS: Mapping[Reason, str] = {
    Reason.NOT_SYNCED: "node(s) not checked: the omaticaya extender's node cache is not synced yet",
    Reason.NOT_IN_CACHE: "node(s) not yet in the omaticaya extender's cache",
    Reason.NO_TELEMETRY: "node(s) had no GPU telemetry ({prefix} labels missing: no agent)",
    Reason.UNUSABLE_TELEMETRY: "node(s) had unusable GPU telemetry ({why})",
    Reason.STALE: "node(s) had stale GPU telemetry ({why}: agent not reporting)",
    Reason.UNHEALTHY: "node(s) had GPU health {health} ({prefix})",
    Reason.NO_ROOM: "node(s) had no room: {wanted} ({prefix})",
    Reason.IN_FLIGHT: "node(s) had room taken by in-flight pods: {wanted}, and pods placed "
                      "there are not in its telemetry yet ({prefix})",  # fmt: skip
    Reason.OTHER_NODE: "node(s) fit, another was chosen ({prefix})",
    Reason.BAD_POD: "{why}",
    Reason.JUDGING_FAILED: "node(s) could not be judged by the omaticaya extender ({why})",
}


class ReasonText(str):
    """The text of a failure as kube-scheduler shows it, carrying its ``code``."""

    code: Reason

    def __new__(cls, code: Reason, text: str) -> ReasonText:
        obj = super().__new__(cls, text)
        obj.code = code
        return obj


def reason_text(code: Reason, **fields: Any) -> ReasonText:
    """``TEXTS[code]`` with ``fields`` filled in. Raises ``KeyError`` for a field the text
    names and ``fields`` lacks."""
    return ReasonText(code, TEXTS[code].format(**fields))


def wanted_text(need: Need) -> str:
    """How a reason names the need: ``pod needs 2 GPUs with 40960 MiB free``; MIG devices
    ``pod needs a MIG device 1g.10gb with ...``; for slices ``pod needs 20 units of
    omaticaya.io/gpu-memory on one shared GPU with the slice free`` (several containers:
    ``slices of 20 + 10 units of ... (each on one shared GPU)``); both parts joined by ``and``."""
    parts = []
    if need.whole_count:
        n = need.whole_count
        what = (f"MIG device{'s' if n > 1 else ''} {need.profile}" if need.profile
                else "GPU" + ("s" if n > 1 else ""))  # fmt: skip
        count = ("a " if n == 1 else f"{n} ") + what
        if need.exclusive and not need.memory_mib:
            parts.append(f"pod needs {count} no container holds")
        else:
            parts.append(f"pod needs {count} with {need.memory_mib} MiB free")
    if need.slices:
        units, resource = sorted(need.slices, reverse=True), need.resource
        if len(units) == 1:
            what = f"{units[0]} units of {resource} on one shared GPU"
        else:
            what = (f"slices of {' + '.join(str(u) for u in units)} units of {resource} (each "
                    "on one shared GPU)")  # fmt: skip
        parts.append(f"pod needs {what} with the slice free")
    return " and ".join(parts).replace(" and pod needs ", " and ")
