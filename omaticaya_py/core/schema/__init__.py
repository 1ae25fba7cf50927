"""The label and telemetry contract: every key name, the telemetry model, and their parse.

The agent writes Node labels ``<prefix>/<name>`` (``names``: the label table, ``LABELS``, and
each name) and one annotation
``<prefix>/telemetry`` (``telemetry``: one versioned pydantic model, written by
``core.publish.render`` and parsed by every reader); ``nodestate.parse_node`` turns a Node's labels and
telemetry back into typed state (``NodeGpuState``), treating them as untrusted input
(``values``). Readers import the names from here.
"""

from . import names
from .names import LABELS, STATIC_NAMES, Label, per_gpu
from .nodestate import (
    GpuInfo,
    NodeGpuState,
    parse_gpu_readings,
    parse_node,
    state_from_object,
)
from .telemetry import (
    MAX_TELEMETRY_BYTES,
    TELEMETRY,
    TELEMETRY_VERSION,
    GpuTelemetry,
    MigTelemetry,
    PodTelemetry,
    Telemetry,
)
from .values import json_int, json_mapping, json_str, rfc3339_s

__all__ = [
    "LABELS",
    "MAX_TELEMETRY_BYTES",
    "STATIC_NAMES",
    "TELEMETRY",
    "TELEMETRY_VERSION",
    "GpuInfo",
    "GpuTelemetry",
    "Label",
    "MigTelemetry",
    "NodeGpuState",
    "PodTelemetry",
    "Telemetry",
    "json_int",
    "json_mapping",
    "json_str",
    "names",
    "parse_gpu_readings",
    "parse_node",
    "per_gpu",
    "rfc3339_s",
    "state_from_object",
]
