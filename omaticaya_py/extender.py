"""``omaticaya extender``: a kube-scheduler extender that places pods by live GPU state.

The scheduler POSTs ``ExtenderArgs`` (``k8s.io/kube-scheduler/extender/v1``: ``Pod``, and
``Nodes`` (a v1.NodeList) or, when the extender is ``nodeCacheCapable``, ``NodeNames``) to
``/filter`` and ``/prioritize``. Answers: ``ExtenderFilterResult`` (``Nodes`` or ``NodeNames``,
``FailedNodes`` name -> reason, ``Error``) and a ``HostPriorityList`` (``[{"Host", "Score"}]``,
scores 0..10 = ``MaxExtenderPriority`` of the 1.20 scheduler). Field names are the Go names: the
Go types have no JSON tags.

A pod states its need with the annotation ``<prefix>/gpu-memory-mib`` (free MiB on each GPU) and
optionally ``<prefix>/gpu-count`` (GPUs, default 1). A pod without it passes through untouched
(every node passes, every score is 0).

Filter, per node, from the agent's labels and its ``<prefix>/telemetry`` annotation:

- no Omaticaya data on the node (or the node is unknown to the cache), or stale telemetry: past
  its ``expires_at`` (the agent's promise: heartbeat + schedule period + jitter after
  ``read_at``) plus ``grace_s``, or, from an agent that does not publish ``expires_at``, older
  than ``ttl_s + grace_s``: the node's GPU state is unknown; it fails, unless ``fail_open``
  (then it passes, with score 0);
- ``gpu.health`` Unhealthy or Unknown: fails;
- fewer than ``gpu-count`` healthy GPUs with ``gpu-memory-mib`` free: fails.

Prioritize: among the nodes that fit, ``binpack`` gives 10 to the node with the least free
memory on its healthy GPUs and 1 to the one with the most; ``spread`` the reverse. Nodes that do
not fit (or are unknown) get 0.

The pure part (``parse_node``, ``parse_need``, ``filter_nodes``, ``prioritize_nodes``,
``handle_filter``, ``handle_prioritize``) has no I/O; ``create_app`` wraps it in a Starlette app;
``run`` serves it with uvicorn, node data from ``kube.NodeCache`` (list + watch of Nodes).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from loguru import logger as log
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .labels import TELEMETRY
from .settings import SettingsError, check_prefix, load

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_GPU_COUNT",
    "MAX_MEMORY_MIB",
    "MAX_PRIORITY",
    "MAX_TELEMETRY_BYTES",
    "args_problem",
    "ExtenderSettings",
    "GpuInfo",
    "Need",
    "NodeGpuState",
    "NodeProblems",
    "Verdict",
    "add_subcommand",
    "create_app",
    "filter_nodes",
    "handle_filter",
    "handle_prioritize",
    "load_extender_settings",
    "metrics_registry",
    "parse_need",
    "parse_node",
    "prioritize_nodes",
    "run",
]

#: ``MaxExtenderPriority`` of ``k8s.io/kube-scheduler/extender/v1`` in Kubernetes 1.20.
MAX_PRIORITY = 10
MIN_PRIORITY = 0

BAD_HEALTH = frozenset({"Unhealthy", "Unknown"})


# ---------------------------------------------------------------------------- settings ----


class ExtenderSettings(BaseSettings):
    """Settings of the extender: environment ``OMATICAYA_EXTENDER_<FIELD>``, ``.env``, flags."""

    model_config = SettingsConfigDict(
        env_prefix="OMATICAYA_EXTENDER_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,  # 'inf' and 'nan' parse as floats: no setting means them
    )

    address: str = Field(
        default="127.0.0.1",
        description="Address to listen on (the scheduler runs in the same pod: loopback).",
    )
    port: int = Field(default=8888, ge=1, le=65535, description="Port to listen on.")
    strategy: Literal["binpack", "spread"] = Field(
        default="binpack",
        description="binpack: prefer the least free GPU memory that fits; spread: the most.",
    )
    ttl_s: float = Field(
        default=300,
        gt=0,
        le=30 * 86400,
        description="Telemetry older than this (plus grace_s) is stale, for agents that do not "
        "publish expires_at (newer ones do: their heartbeat + schedule period + jitter).",
    )
    grace_s: float = Field(
        default=60,
        ge=0,
        le=86400,
        description="Allowance on top of ttl_s (agent schedule, clock skew).",
    )
    fail_open: bool = Field(
        default=False,
        description="Let nodes whose GPU state is unknown or stale pass the filter.",
    )
    prefix: str = Field(default="omaticaya.io", description="Label/annotation key prefix.")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path.")
    log_level: Literal["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_json: bool = Field(default=False, description="Log JSON lines instead of text.")

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return check_prefix(value)

    @field_validator("strategy", "log_level", mode="before")
    @classmethod
    def _normalise(cls, value: Any, info: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = value.strip()
        return value.upper() if info.field_name == "log_level" else value.lower()

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                "expected an IP address to bind, like '127.0.0.1' or '0.0.0.0'"
            ) from None
        return value


def load_extender_settings(**overrides: Any) -> ExtenderSettings:
    """``ExtenderSettings`` from the environment and ``.env``, with ``overrides`` (flags; ``None``
    ignored) on top. Raises ``SettingsError``: one line per bad setting, naming the variable."""
    return load(ExtenderSettings, **overrides)


# ------------------------------------------------------------------------- node state ----


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    free_mib: int
    healthy: bool


@dataclass(frozen=True, slots=True)
class NodeGpuState:
    """What the extender knows about one node's GPUs, parsed once per Node change.

    ``known`` is False when the node carries no Omaticaya data at all; ``health`` is the
    ``gpu.health`` label (or the telemetry's); ``read_at`` is epoch seconds (``None``: no
    telemetry annotation); ``expires_at`` is epoch seconds, the agent's own promise of its next
    rewrite (``None``: an agent that does not publish it, or a value not to be trusted);
    ``gpus`` per GPU; ``free_total_mib`` over healthy GPUs."""

    name: str
    known: bool = False
    health: str | None = None
    read_at: float | None = None
    expires_at: float | None = None
    gpus: tuple[GpuInfo, ...] = ()
    free_total_mib: int = 0
    problem: str | None = None


_INT_TEXT = re.compile(r"^\s*-?[0-9]{1,18}\s*$")


def _int(value: Any) -> int | None:
    """A whole number from JSON or a label value, or ``None`` for anything else: booleans,
    NaN, infinities, floats or text beyond 18 digits (no GPU has 10^18 MiB), non-ASCII digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 10**18 else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and abs(value) < 1e18 else None
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(value)
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _read_at(text: Any) -> float | None:
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    return stamp.timestamp()


#: the longest ``expires_at - read_at`` trusted (a weekly schedule plus a day of heartbeat):
#: beyond it the value did not come from a working agent, and the extender's TTL applies
MAX_REFRESH_S = 8 * 24 * 3600.0

#: the most a Node's annotations can hold in total (the API server's limit): a larger telemetry
#: value did not come from the API server and is not parsed
MAX_TELEMETRY_BYTES = 256 * 1024


_PER_GPU = re.compile(r"^gpu-(\d+)\.(memory\.free-mib|health|mig\.enabled)$")


def parse_node(
    name: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    prefix: str = "omaticaya.io",
) -> NodeGpuState:
    """A node's GPU state from its labels and the ``<prefix>/telemetry`` annotation.

    Per-GPU data comes from the telemetry (exact MiB) when it parses, else from the
    ``gpu-N.*`` labels, else from the node aggregates (``gpu.memory.free-mib`` on one GPU,
    ``gpu.healthy-count`` GPUs). Only whole GPUs count: a GPU with MIG on (``mig_enabled`` in
    the telemetry, ``gpu-N.mig.enabled`` label) is given out as MIG devices, not as a GPU.

    Everything here is untrusted (any controller can write a Node's annotations): it never
    raises. Values of the wrong type are ignored; a telemetry annotation that is not a JSON
    object, is over ``MAX_TELEMETRY_BYTES``, nests too deep for the parser, holds a number that
    is not finite where a whole number belongs, or lacks a valid ``read_at`` sets ``problem``
    (the filter then fails the node with that reason)."""
    labels = _mapping(labels)
    annotations = _mapping(annotations)
    p = prefix + "/"
    mine = {
        k[len(p) :]: v
        for k, v in labels.items()
        if isinstance(k, str) and k.startswith(p) and isinstance(v, str)
    }
    raw = annotations.get(p + TELEMETRY)
    doc: Mapping[str, Any] | None = None
    problem = None
    if raw is not None:
        if not isinstance(raw, str):
            problem = "unreadable telemetry annotation (not a string)"
        elif len(raw) > MAX_TELEMETRY_BYTES:
            problem = f"unreadable telemetry annotation (over {MAX_TELEMETRY_BYTES} bytes)"
        else:
            try:
                loaded = json.loads(raw)
                doc = loaded if isinstance(loaded, dict) else None
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                doc = None
            if doc is None:
                problem = "unreadable telemetry annotation"
    health = _str(mine.get("gpu.health")) or (_str(doc.get("health")) if doc else None)
    if not mine and doc is None:
        return NodeGpuState(name=name, problem=problem)
    read_at = _read_at(doc.get("read_at")) if doc else None
    if doc is not None and read_at is None:
        problem = "telemetry annotation without a valid read_at"
    expires_at = _read_at(doc.get("expires_at")) if doc and read_at is not None else None
    if expires_at is not None and not 0 <= expires_at - read_at <= MAX_REFRESH_S:  # type: ignore[operator]
        expires_at = None

    # whole GPUs only: a GPU with MIG on is given out as MIG devices (nvidia.com/mig-<profile>),
    # never as a whole GPU, so its whole-GPU free memory must not make room for a pod
    gpus: list[GpuInfo] = []
    listed = False
    if doc is not None and isinstance(doc.get("gpus"), list):
        for g in doc["gpus"]:
            if not isinstance(g, dict):
                continue
            listed = True
            if g.get("mig_enabled") is True:
                continue
            index, free = _int(g.get("index")), _int(g.get("memory_free_mib"))
            if index is None:
                continue
            if free is None and g.get("memory_free_mib") is not None:
                problem = "telemetry annotation with a bad memory_free_mib"
            gpus.append(
                GpuInfo(index, free or 0, g.get("health") == "Healthy" and free is not None)
            )
    if not gpus and not listed:
        per: dict[int, dict[str, str]] = {}
        for key, value in mine.items():
            m = _PER_GPU.match(key)
            if m:
                per.setdefault(int(m.group(1)), {})[m.group(2)] = value
        for index in sorted(per):
            if per[index].get("mig.enabled") == "true":
                continue
            free = _int(per[index].get("memory.free-mib"))
            gpus.append(
                GpuInfo(
                    index, free or 0, per[index].get("health") == "Healthy" and free is not None
                )
            )
    if not gpus and not listed and "mig.strategy" not in mine:  # aggregates count MIG devices
        free = _int(mine.get("gpu.memory.free-mib"))
        healthy = _int(mine.get("gpu.healthy-count")) or 0
        if free is not None and healthy > 0:
            # only aggregates: the best GPU has `free`; assume no more than that on the others,
            # capped by the free total
            total = _int(mine.get("gpu.memory.free-total-mib")) or free
            left = total
            for index in range(healthy):
                share = min(free, left)
                gpus.append(GpuInfo(index, share, True))
                left -= share
    free_total = sum(g.free_mib for g in gpus if g.healthy)
    return NodeGpuState(
        name=name,
        known=True,
        health=health,
        read_at=read_at,
        expires_at=expires_at,
        gpus=tuple(gpus),
        free_total_mib=free_total,
        problem=problem,
    )


def state_from_object(node: Mapping[str, Any], prefix: str) -> NodeGpuState:
    """``parse_node`` on a v1.Node document (as the scheduler sends in ``Nodes.items``)."""
    meta = _mapping(_mapping(node).get("metadata"))
    name = meta.get("name")
    return parse_node(
        name if isinstance(name, str) else "", meta.get("labels"), meta.get("annotations"), prefix
    )


# ------------------------------------------------------------------------------ rules ----


@dataclass(frozen=True, slots=True)
class Need:
    """What a pod asks for: ``count`` GPUs with ``memory_mib`` free each. ``error`` is set when
    the annotations are malformed (every node then fails with that message)."""

    memory_mib: int
    count: int = 1
    error: str | None = None


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
    from .kube import parse_quantity  # the kubernetes client loads only for a suffixed value

    try:
        size = parse_quantity(m.group(1) + m.group(2))
    except ValueError:
        return None
    return int(math.ceil(size / MIB))


def parse_need(pod: Any, prefix: str = "omaticaya.io") -> Need | None:
    """The pod's need from ``<prefix>/gpu-memory-mib`` and ``<prefix>/gpu-count``; ``None``
    when the pod has no ``gpu-memory-mib`` annotation (or is not a pod object at all).

    Memory is MiB per GPU: a plain whole number is MiB, a quantity with a memory suffix
    (``30Gi``, ``1.5Gi``, ``30G``) is converted by the Kubernetes client's parser and rounded up
    to whole MiB; at most ``MAX_MEMORY_MIB``. The count is a whole number from 1 to
    ``MAX_GPU_COUNT`` (default 1). A bad value gives a ``Need`` with ``error`` set, naming the
    annotation and the expected form: every node then fails with it."""
    meta = _mapping(_mapping(pod).get("metadata"))
    annotations = _mapping(meta.get("annotations"))
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
    count = _int(raw_count)
    if count is None or not 1 <= count <= MAX_GPU_COUNT:
        return Need(
            memory, 1,
            f"pod annotation {count_key}={shown_count} is not a whole number from 1 to "
            f"{MAX_GPU_COUNT}",
        )  # fmt: skip
    return Need(memory, count)


def _shown(raw: str) -> str:
    """``repr`` of a value for a message, cut to 40 characters."""
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's filter result: ``ok`` (passes), ``reason`` (why not: ends up in the pod's
    FailedScheduling event), ``fits`` (passes on known, fresh data: it gets a score)."""

    ok: bool
    reason: str = ""
    fits: bool = False


def _gpus_text(count: int) -> str:
    return "a GPU" if count == 1 else f"{count} GPUs"


def judge(
    state: NodeGpuState | None,
    need: Need,
    *,
    now: float,
    ttl_s: float,
    grace_s: float,
    fail_open: bool,
    prefix: str = "omaticaya.io",
) -> Verdict:
    """The filter rule for one node (``state`` ``None``: the node is not in the cache)."""
    unknown = Verdict(True) if fail_open else None
    if need.error:
        return Verdict(False, need.error)
    if state is None:
        return unknown or Verdict(False, "node(s) not yet in the omaticaya extender's cache")
    if not state.known:
        return unknown or Verdict(
            False, f"node(s) had no GPU telemetry ({prefix} labels missing: no agent)"
        )
    if state.read_at is None or state.problem:
        why = state.problem or "no telemetry annotation"
        return unknown or Verdict(False, f"node(s) had unusable GPU telemetry ({why})")
    if state.expires_at is not None:
        if now > state.expires_at + grace_s:
            stamp = datetime.fromtimestamp(state.expires_at, timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
            return unknown or Verdict(
                False,
                f"node(s) had stale GPU telemetry ({prefix}/telemetry expired at {stamp}, "
                f"grace {grace_s:g}s: agent not reporting)",
            )
    elif now - state.read_at > ttl_s + grace_s:
        return unknown or Verdict(
            False,
            f"node(s) had stale GPU telemetry ({prefix}/telemetry read_at older than "
            f"{ttl_s + grace_s:g}s: agent not reporting)",
        )
    if state.health in BAD_HEALTH or state.health is None:
        return Verdict(False, f"node(s) had GPU health {state.health or 'Unknown'} ({prefix})")
    fitting = sum(1 for g in state.gpus if g.healthy and g.free_mib >= need.memory_mib)
    if fitting < need.count:
        return Verdict(
            False,
            f"node(s) had no room: pod needs {_gpus_text(need.count)} with "
            f"{need.memory_mib} MiB free ({prefix})",
        )
    return Verdict(True, fits=True)


def filter_nodes(
    need: Need | None,
    states: Iterable[tuple[str, NodeGpuState | None]],
    *,
    now: float,
    ttl_s: float,
    grace_s: float,
    fail_open: bool,
    prefix: str = "omaticaya.io",
) -> tuple[list[str], dict[str, str]]:
    """(names that pass, {name: reason} for those that fail), in input order."""
    passed: list[str] = []
    failed: dict[str, str] = {}
    if need is None:
        return [name for name, _ in states], failed
    for name, state in states:
        v = judge(
            state, need, now=now, ttl_s=ttl_s, grace_s=grace_s, fail_open=fail_open, prefix=prefix
        )
        if v.ok:
            passed.append(name)
        else:
            failed[name] = v.reason
    return passed, failed


def prioritize_nodes(
    need: Need | None,
    states: Iterable[tuple[str, NodeGpuState | None]],
    *,
    strategy: str,
    now: float,
    ttl_s: float,
    grace_s: float,
    prefix: str = "omaticaya.io",
) -> list[dict[str, Any]]:
    """A HostPriorityList: ``[{"Host": name, "Score": 0..10}]`` in input order.

    Fitting nodes score 1..10 by the free memory on their healthy GPUs, linearly between the
    least and the most free among them (all equal: 10); ``binpack`` gives 10 to the least free,
    ``spread`` to the most. Others (or every node for a pod without a need): 0."""
    items = list(states)
    if need is None or need.error:
        return [{"Host": name, "Score": MIN_PRIORITY} for name, _ in items]
    free: dict[str, int] = {}
    for name, state in items:
        v = judge(
            state, need, now=now, ttl_s=ttl_s, grace_s=grace_s, fail_open=False, prefix=prefix
        )
        if v.fits and state is not None:
            free[name] = state.free_total_mib
    out = []
    lo, hi = (min(free.values()), max(free.values())) if free else (0, 0)
    span = hi - lo
    for name, _ in items:
        if name not in free:
            score = MIN_PRIORITY
        elif span == 0:
            score = MAX_PRIORITY
        else:
            frac = (free[name] - lo) / span  # 0: least free, 1: most free
            if strategy == "binpack":
                frac = 1.0 - frac
            score = 1 + round(frac * (MAX_PRIORITY - 1))
        out.append({"Host": name, "Score": score})
    return out


# ------------------------------------------------------------------- protocol handlers ----


Lookup = Callable[[str], "NodeGpuState | None"]


@dataclass
class Extender:
    """The protocol handlers bound to settings and a node lookup (the cache's ``get``)."""

    settings: ExtenderSettings
    lookup: Lookup = field(default=lambda name: None)
    clock: Callable[[], float] = time.time
    synced: Callable[[], bool] = field(default=lambda: True)
    #: (ready, reason) of the node cache (``NodeCache.health``): a dead or stalled watch
    health: Callable[[], tuple[bool, str]] = field(default=lambda: (True, "ok"))

    def _states(
        self, args: Mapping[str, Any]
    ) -> tuple[list[tuple[str, NodeGpuState | None]], bool]:
        """[(name, state)] and whether the request used NodeNames (cache mode)."""
        prefix = self.settings.prefix
        if args.get("NodeNames") is not None:
            return [(n, self.lookup(n)) for n in args["NodeNames"]], True
        items = ((args.get("Nodes") or {}).get("items")) or []
        return [
            ((node.get("metadata") or {}).get("name", ""), state_from_object(node, prefix))
            for node in items
        ], False

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        s = self.settings
        need = parse_need(args.get("Pod"), s.prefix)
        states, by_name = self._states(args)
        if by_name and need is not None and not self.synced() and not s.fail_open:
            # no data yet: say so instead of failing every node one by one
            passed, failed = (
                [],
                {
                    n: "node(s) not checked: the omaticaya extender's node cache is not synced yet"
                    for n, _ in states
                },
            )
        else:
            passed, failed = filter_nodes(
                need,
                states,
                now=self.clock(),
                ttl_s=s.ttl_s,
                grace_s=s.grace_s,
                fail_open=s.fail_open,
                prefix=s.prefix,
            )
        result: dict[str, Any] = {"FailedNodes": failed, "Error": ""}
        if by_name:
            result["NodeNames"] = passed
            result["Nodes"] = None
        else:
            keep = set(passed)
            nodes = args.get("Nodes") or {}
            result["Nodes"] = {
                **{k: v for k, v in nodes.items() if k != "items"},
                "items": [
                    n
                    for n in nodes.get("items") or []
                    if (n.get("metadata") or {}).get("name") in keep
                ],
            }
            result["NodeNames"] = None
        return result

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        s = self.settings
        need = parse_need(args.get("Pod"), s.prefix)
        states, _ = self._states(args)
        return prioritize_nodes(
            need,
            states,
            strategy=s.strategy,
            now=self.clock(),
            ttl_s=s.ttl_s,
            grace_s=s.grace_s,
            prefix=s.prefix,
        )


def handle_filter(
    args: Mapping[str, Any],
    settings: ExtenderSettings,
    lookup: Lookup | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """ExtenderArgs -> ExtenderFilterResult (pure; ``lookup`` resolves ``NodeNames``)."""
    ext = Extender(settings, lookup or (lambda name: None))
    if now is not None:
        ext.clock = lambda: now
    return ext.filter(args)


def handle_prioritize(
    args: Mapping[str, Any],
    settings: ExtenderSettings,
    lookup: Lookup | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """ExtenderArgs -> HostPriorityList (pure; ``lookup`` resolves ``NodeNames``)."""
    ext = Extender(settings, lookup or (lambda name: None))
    if now is not None:
        ext.clock = lambda: now
    return ext.prioritize(args)


# ------------------------------------------------------------------------------- app ----


#: the largest request body read: a NodeList of 1,000 Nodes of 32 KiB (without
#: ``nodeCacheCapable`` the scheduler sends whole Nodes); larger is answered 413
MAX_BODY_BYTES = 32 << 20


def args_problem(args: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of an ExtenderArgs object, or ``None``: ``NodeNames`` must
    be null or a list of names, ``Nodes`` null or an object whose ``items`` is null or a list
    of objects. (``Pod`` may be anything: a pod without a readable need passes through.)"""
    names = args.get("NodeNames")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(n, str) for n in names)
    ):
        return "NodeNames must be null or a list of Node names"
    nodes = args.get("Nodes")
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else ()
        if not isinstance(nodes, dict) or not (
            items is None or (isinstance(items, list) and all(isinstance(n, dict) for n in items))
        ):
            return "Nodes must be null or a NodeList object whose items are Node objects"
    return None


class NodeProblems:
    """Bad Node data seen by the cache, logged once per Node and problem and counted.

    ``seen(state)`` is called with each parsed Node (``NodeGpuState.problem``: why its telemetry
    is unusable); ``skipped(name, exc)`` when parsing a Node raised. ``counts`` maps a problem
    (or ``"skipped: <exception type>"``) to how many times a Node turned to it. A Node whose data
    is good again is logged once more, at INFO."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._current: dict[str, str] = {}
        self._lock = threading.Lock()

    def _set(self, name: str, problem: str | None, detail: str = "") -> None:
        with self._lock:
            before = self._current.get(name)
            if problem == before:
                return
            if problem is None:
                self._current.pop(name, None)
            else:
                self._current[name] = problem
                self.counts[problem] += 1
        if problem is None:
            log.info("node {}: GPU telemetry usable again", name)
        else:
            log.warning("node {}: {}{} (the node fails the filter)", name, problem, detail)

    def seen(self, state: NodeGpuState) -> NodeGpuState:
        """Record ``state`` (logging a new problem once) and return it."""
        self._set(state.name, state.problem)
        return state

    def skipped(self, name: str, exc: Exception) -> None:
        """Record a Node that could not be parsed at all (dropped from the cache)."""
        self._set(name, f"skipped: {type(exc).__name__}", f": {str(exc)[:200]}")


def metrics_registry(cache: Any, problems: NodeProblems) -> Any:
    """A prometheus-client ``CollectorRegistry`` over the node cache (``kube.NodeCache``) and
    ``problems``: ``omaticaya_extender_cache_nodes`` (Nodes held), ``_cache_synced``,
    ``_cache_ready`` (``cache.health()``), ``_cache_lists_total``, ``_cache_events_total``,
    ``_nodes_skipped_total`` (Nodes whose parsing raised), ``_node_problems_total{problem}``
    (Nodes whose telemetry turned unusable) and ``_api_requests_total{verb,result}``."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterable[Any]:
            yield GaugeMetricFamily(
                "omaticaya_extender_cache_nodes", "Nodes in the cache.", value=len(cache)
            )
            yield GaugeMetricFamily(
                "omaticaya_extender_cache_synced", "1 once the first LIST is stored.",
                value=1 if cache.synced else 0,
            )
            yield GaugeMetricFamily(
                "omaticaya_extender_cache_ready", "1 while the list+watch is alive and current.",
                value=1 if cache.health()[0] else 0,
            )
            for name, doc, value in (
                ("omaticaya_extender_cache_lists", "LISTs of every Node.", cache.lists),
                ("omaticaya_extender_cache_events", "WATCH events received.", cache.events),
                ("omaticaya_extender_nodes_skipped", "Nodes whose parsing raised (dropped).",
                 cache.skipped),
            ):  # fmt: skip
                yield CounterMetricFamily(name, doc, value=value)
            bad = CounterMetricFamily(
                "omaticaya_extender_node_problems",
                "Times a Node's GPU telemetry turned unusable, by problem.",
                labels=["problem"],
            )
            for problem, n in sorted(problems.counts.items()):
                bad.add_metric([problem], n)
            yield bad
            requests = CounterMetricFamily(
                "omaticaya_extender_api_requests", "Kubernetes API requests, by verb and result.",
                labels=["verb", "result"],
            )
            client = getattr(cache, "_client", None)
            for (verb, result), n in sorted(getattr(client, "requests", {}).items()):
                requests.add_metric([verb, result], n)
            yield requests

    registry = CollectorRegistry()
    registry.register(_Collector())  # type: ignore[arg-type]
    return registry


def create_app(extender: Extender, registry: Any = None) -> Any:
    """The Starlette app: ``POST /filter``, ``POST /prioritize``, ``GET /healthz``,
    ``GET /readyz`` (503 with the reason until the node cache has synced, and while its
    list+watch is dead or stalled: ``Extender.health``), and ``GET /metrics`` (Prometheus text,
    from ``registry``; absent without one)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Mount, Route

    def answer(body: Any) -> Response:
        return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")

    async def read_args(request: Request) -> dict[str, Any] | tuple[int, str]:
        """The ExtenderArgs object, or (HTTP status, reason) for a body that is not one."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return 413, f"bad ExtenderArgs: body larger than {MAX_BODY_BYTES} bytes"
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return 413, f"bad ExtenderArgs: body larger than {MAX_BODY_BYTES} bytes"
            chunks.append(chunk)
        try:
            args = json.loads(b"".join(chunks))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return 400, "bad ExtenderArgs: not JSON"
        if not isinstance(args, dict):
            return 400, "bad ExtenderArgs: not a JSON object"
        problem = args_problem(args)
        return (400, f"bad ExtenderArgs: {problem}") if problem else args

    async def filter_(request: Request) -> Response:
        args = await read_args(request)
        if isinstance(args, tuple):
            status, reason = args
            return JSONResponse(
                {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "Error": reason},
                status_code=status,
            )
        try:
            return answer(extender.filter(args))
        except Exception as exc:  # noqa: BLE001 - answer the scheduler, never drop the request
            log.exception("filter failed")
            return answer(
                {
                    "Nodes": None,
                    "NodeNames": None,
                    "FailedNodes": {},
                    "Error": f"omaticaya extender: {exc}",
                }
            )

    async def prioritize(request: Request) -> Response:
        args = await read_args(request)
        if isinstance(args, tuple):
            status, reason = args
            return JSONResponse({"Error": reason}, status_code=status)
        try:
            return answer(extender.prioritize(args))
        except Exception as exc:  # noqa: BLE001 - answer the scheduler, never drop the request
            log.exception("prioritize failed")
            return JSONResponse({"Error": f"omaticaya extender: {exc}"}, status_code=500)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if not extender.synced():
            return PlainTextResponse("node cache not synced", status_code=503)
        ok, reason = extender.health()
        return PlainTextResponse(reason, status_code=200 if ok else 503)

    routes: list[Any] = [
        Route("/filter", filter_, methods=["POST"]),
        Route("/prioritize", prioritize, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    if registry is not None:
        from prometheus_client import make_asgi_app

        routes.append(Mount("/metrics", make_asgi_app(registry)))
    return Starlette(routes=routes)


# ----------------------------------------------------------------------- command line ----


def add_subcommand(sub: Any) -> None:
    """Add ``extender`` to the ``omaticaya`` sub-parsers (``argparse`` ``add_subparsers()``)."""
    p = sub.add_parser(
        "extender", help="kube-scheduler extender: filter/prioritize pods by live GPU state"
    )
    p.set_defaults(command="extender")
    p.add_argument("--address", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=str, help="port to listen on (default 8888)")
    p.add_argument("--strategy", help="binpack (default) or spread")
    p.add_argument("--ttl-s", dest="ttl_s", type=str, help="telemetry TTL in seconds (default 300)")
    p.add_argument(
        "--grace-s", dest="grace_s", type=str, help="grace on top of the TTL (default 60)"
    )
    p.add_argument(
        "--fail-open",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let nodes with unknown or stale GPU state pass (default: fail closed)",
    )
    p.add_argument("--prefix", help="label key prefix (default omaticaya.io)")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster or $KUBECONFIG)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    p.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction, default=None, help="JSON log lines"
    )


class _Server:
    """uvicorn in this thread, stopped by ``stop()`` (from a signal handler or another thread)."""

    def __init__(self, app: Any, settings: ExtenderSettings) -> None:
        import uvicorn

        config = uvicorn.Config(
            app,
            host=settings.address,
            port=settings.port,
            log_level=settings.log_level.lower(),
            access_log=settings.log_level == "DEBUG",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)

    def stop(self) -> None:
        self.server.should_exit = True


def serve(
    settings: ExtenderSettings,
    *,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    cache_factory: Callable[..., Any] | None = None,
) -> int:
    """Start the node cache and serve until ``stop`` is set (or SIGTERM/SIGINT when run in the
    main thread). Returns the exit status. ``ready`` is set once the socket listens."""
    from .kube import KubeError, NodeCache

    prefix = settings.prefix
    problems = NodeProblems()

    def transform(meta: Any) -> NodeGpuState:
        return problems.seen(parse_node(meta.name, meta.labels, meta.annotations, prefix))

    def on_error(err: KubeError) -> None:
        log.warning("node cache: {}", err)

    try:
        cache = (cache_factory or NodeCache)(
            transform,
            kubeconfig=settings.kubeconfig,
            on_error=on_error,
            on_skip=problems.skipped,
        )
    except KubeError as err:
        log.error("{}", err)
        return 1
    cache.start()
    ext = Extender(settings, cache.get, synced=lambda: cache.synced, health=cache.health)
    server = _Server(create_app(ext, metrics_registry(cache, problems)), settings)
    stopper = None
    if stop is not None:
        stopper = threading.Thread(
            target=lambda: (stop.wait(), server.stop()), name="extender-stop", daemon=True
        )
        stopper.start()
    if ready is not None:

        def watch_started() -> None:
            while not server.server.started and not server.server.should_exit:
                time.sleep(0.02)
            ready.set()

        threading.Thread(target=watch_started, daemon=True).start()
    log.info(
        "extender on {}:{} strategy={} ttl={:g}s+{:g}s fail_open={} prefix={}",
        settings.address,
        settings.port,
        settings.strategy,
        settings.ttl_s,
        settings.grace_s,
        settings.fail_open,
        prefix,
    )
    try:
        server.server.run()
    finally:
        cache.stop()
    return 0 if server.server.started else 1


def run(args: argparse.Namespace) -> int:
    """``omaticaya extender``: serve until SIGTERM/SIGINT. Exit 2 with one line per bad setting."""
    fields = set(ExtenderSettings.model_fields)
    overrides = {k: v for k, v in vars(args).items() if k in fields}
    try:
        settings = load_extender_settings(**overrides)
    except SettingsError as err:
        print(f"omaticaya extender: {err}".replace("\n", "\nomaticaya extender: "), file=sys.stderr)
        return 2
    from .logs import setup_logging

    setup_logging(settings.log_level, settings.log_json)
    # uvicorn handles SIGTERM/SIGINT in the main thread: it stops accepting, finishes the
    # requests in flight and returns
    return serve(settings)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m omaticaya_py.extender [flags]``."""
    parser = argparse.ArgumentParser(prog="omaticaya")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommand(sub)
    return run(parser.parse_args(["extender", *(argv or [])]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
