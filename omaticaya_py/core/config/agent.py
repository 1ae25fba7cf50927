"""The agent's settings section: when it reads the GPUs, how it writes the Node (labels,
their steps and hysteresis, the write budget, the heartbeat), health rules (Xid), attribution,
its HTTP port and shutdown. Environment names are ``OMATICAYA_<FIELD>`` in upper case, except
the Node name, which is ``NODE_NAME`` as the downward API sets it. Raises ``ValueError``
(``SettingsError`` through ``load``) on a bad value, naming the variable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from .schedule import DAY_S, SCHEDULE_FORM, Schedule, parse_schedule
from .settings_base import DNS_SUBDOMAIN, CommonSettings

__all__ = ["AgentSection"]


class AgentSection(CommonSettings):
    """The agent's own settings (see the module docstring); ``core.config.settings.Settings``
    combines it with the sections of the node's plugins and of sharing."""

    schedule: Annotated[Schedule, NoDecode] = Field(
        default="@every 10s",  # type: ignore[assignment]
        description="When to read the GPUs and update the Node: a 5-field crontab (*/5 * * * *), "
        "6 fields with seconds first (*/5 * * * * ?, ? = *), @every 30s (h, m, s, ms), or "
        "@hourly/@daily; crontab weekdays count 0 or 7 as Sunday.",
    )
    node_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("NODE_NAME", "OMATICAYA_NODE_NAME", "node_name"),
        description="Name of the Node to label (downward API spec.nodeName).",
    )
    memory_step_mib: int = Field(default=1024, ge=1, description="Memory labels round down to this.")
    utilization_step_pct: int = Field(
        default=10, ge=1, le=100, description="Utilisation labels round to this."
    )
    temperature_step_c: int = Field(
        default=5, ge=1, le=50, description="Temperature labels round to this."
    )
    hysteresis_pct: float = Field(
        default=20,
        ge=0,
        le=50,
        description="A rounded label moves only when the reading passes the step edge by this "
        "share of a step (0: off).",
    )
    idle_utilization_pct: float = Field(
        default=5, ge=0, le=100, description="A GPU under this with no process counts as idle."
    )
    per_gpu_labels: bool = Field(default=True, description="Publish gpu-N.* labels.")
    temperature_labels: bool = Field(
        default=False,
        description="Also publish gpu-N.temperature-c (it changes with load and is no scheduling "
        "input; the telemetry annotation and the metrics carry temperature either way).",
    )
    sm_active_labels: bool = Field(
        default=True,
        description="Publish gpu-N.sm-active-pct (GPM SM activity, Hopper and newer; absent "
        "without GPM). On by default: where GPM is it equals gpu-N.utilization-pct, so it "
        "rides on the same Node writes (bench/label_churn.py: no extra patches).",
    )
    cleanup_on_exit: bool = Field(default=True, description="Remove dynamic labels on SIGTERM.")
    xid_ignore: Annotated[frozenset[int], NoDecode] = Field(
        default=frozenset({13, 31, 43, 45, 68, 109}),
        description="Xid codes that are application faults, not GPU faults.",
    )
    xid_all_fatal: bool = Field(default=False, description="Treat every Xid as fatal.")
    xid_quiet_s: float = Field(
        default=600,
        ge=0,
        le=30 * DAY_S,
        description="A fatal Xid keeps the GPU Unhealthy this many seconds.",
    )
    jitter_s: float = Field(
        default=0,
        ge=0,
        le=DAY_S,
        description="Delay each run, the first included, by a random 0..jitter_s seconds from "
        "its planned time, so that a fleet on the same schedule does not write in the same "
        "second (0: off; the chart's default: 5). The delays never add up: a 10 s schedule "
        "still runs every 10 s on average.",
    )
    stuck_tick_periods: float = Field(
        default=3,
        ge=1,
        le=1000,
        description="/healthz fails (503) once no tick finished for this many schedule periods "
        "(plus the jitter): a tick stuck in a hung NVML or kubelet call, said once in the log; "
        "the device plugin reports its devices Unhealthy then too.",
    )
    heartbeat_s: float = Field(
        default=300,
        gt=0,
        le=31 * DAY_S,
        description="Renew the liveness Lease this often; without one (no namespace of its "
        "own, or no Lease RBAC), rewrite the telemetry annotation at least this often.",
    )
    min_patch_interval_s: float = Field(
        default=30,
        ge=0,
        le=DAY_S,
        description="Write budget: at most one Node patch per this many seconds, except changes "
        "that make the Node less attractive (free memory down, health worse, a GPU gone), which "
        "go at once; held-back changes go out once it has passed (0: off).",
    )
    telemetry_free_drop_mib: int = Field(
        default=256,
        ge=0,
        le=10**6,
        description="Rewrite the telemetry annotation at once (a change for the worse) when a "
        "GPU's or MIG device's exact free memory drops by more than this many MiB though no "
        "label changed; a rise as large waits like any change for the better (0: off, the "
        "telemetry follows label changes and the heartbeat only).",
    )
    window_s: float = Field(
        default=300,
        ge=0,
        le=DAY_S,
        description="Peak signal: publish, per GPU, the least free memory and the p95 "
        "utilisation over this many seconds in the telemetry annotation (memory_free_min_mib, "
        "utilization_p95_pct), once half covered (0: off).",
    )
    pod_resources_socket: Path | None = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        description="The kubelet's PodResources socket: publish which pod holds each GPU "
        "(empty: off; absent: said once, nothing else changes).",
    )
    proc_root: Path | None = Field(
        default=None,
        description="Where the host's /proc is seen (/proc on the host or with the chart's "
        "hostPID): place each GPU process in its pod, or out-of-band (empty: off).",
    )
    out_of_band_event_mib: int = Field(
        default=1024,
        ge=0,
        le=10**9,
        description="A Node Event when processes in no pod hold this many MiB on one GPU, once "
        "per episode (0: off).",
    )
    slice_over_limit_action: Literal["event", "evict"] = Field(
        default="event",
        description="What the agent does when a container's processes together hold more than "
        "its slice of a shared GPU: event (a Warning Event on the pod and the "
        "omaticaya_slice_over_limit metric; nothing is stopped) or evict (then also evicts the "
        "pod through the Eviction API, which honours PodDisruptionBudgets; the agent needs "
        "create on pods/eviction). event by default: the agent sees one reading per tick and "
        "cannot tell a transient peak from lasting overuse, and an eviction ends a training "
        "job's run.",
    )
    metrics_port: int = Field(
        default=9402, ge=0, le=65535, description="Port of /metrics, /healthz and /readyz (0: off)."
    )
    fail_on_init_error: bool = Field(
        default=False, description="Exit when NVML cannot start, instead of reporting Unknown."
    )
    kube_timeout_s: float = Field(
        default=10, gt=0, le=300, description="Timeout of one API request."
    )
    shutdown_timeout_s: float = Field(
        default=20,
        gt=0,
        le=3600,
        description="On SIGTERM, finish the tick in flight and remove the dynamic labels within "
        "this many seconds, without retries; keep it below the pod's "
        "terminationGracePeriodSeconds (30), after which the kubelet kills the agent.",
    )

    @field_validator("schedule", mode="before")
    @classmethod
    def _parse_schedule(cls, value: Any) -> Schedule:
        if isinstance(value, Schedule):
            return value
        if not isinstance(value, str):
            raise ValueError(f"expected {SCHEDULE_FORM}")
        return parse_schedule(value)

    @field_validator("pod_resources_socket", "proc_root", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("pod_resources_socket", "proc_root")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("expected an absolute path, like /proc (or empty: off)")
        return value

    @field_validator("xid_ignore", mode="before")
    @classmethod
    def _parse_xids(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [p for p in re.split(r"[,\s]+", value.strip()) if p]
            if not all(p.isdigit() for p in parts):
                raise ValueError("expected a comma-separated list of Xid numbers, like '13,31,43'")
            return frozenset(int(p) for p in parts)
        return value

    @field_validator("node_name")
    @classmethod
    def _check_node(cls, value: str | None) -> str | None:
        if value is not None and not (len(value) <= 253 and DNS_SUBDOMAIN.match(value)):
            raise ValueError("expected a Node name (DNS subdomain), like 'gpu-node-1'")
        return value
