"""Settings: environment ``OMATICAYA_*``, a ``.env`` file, and CLI flags (which win).

One class, parsed by pydantic-settings. A bad value raises ``SettingsError`` whose message is
one line per bad setting naming the variable and the expected form; the CLI prints it and exits
with status 2, without a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from ..allocation.mps import DEFAULT_ROOT as DEFAULT_MPS_ROOT
from ..allocation.mps import DEFAULT_STATE_DIR as DEFAULT_MPS_STATE_DIR
from ..allocation.mps import MAX_ROOT_BYTES as MAX_MPS_ROOT_BYTES
from ..model.sharing import (
    DEFAULT_SHARED_RESOURCE,
    DEFAULT_UNIT_MIB,
    SharedGpus,
    parse_shared_gpus,
)
from .schedule import DAY_S, SCHEDULE_FORM, Schedule, parse_schedule
from .settings_base import (
    DNS_SUBDOMAIN,
    RESERVED_PREFIXES,
    CommonSettings,
    SettingsError,
    check_bind_address,
    check_prefix,
    check_trace,
    load,
    placement_policy_field,
)

#: NVIDIA's device list strategies, the ways ``Allocate`` hands a container its GPUs
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
#: the name part of an extended resource (a qualified name: ``gpu``, ``gpu.shared``).
EXTENDED_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

__all__ = [
    "RESERVED_PREFIXES",
    "CommonSettings",
    "DevicePluginSettings",
    "Schedule",
    "Settings",
    "SettingsError",
    "check_prefix",
    "load",
    "load_settings",
    "parse_schedule",
    "stuck_after_s",
]

class DevicePluginSettings(CommonSettings):
    """The device plugin's section of the agent's settings (``deviceplugin.config.plugin_config``
    reads it): whether to serve the GPUs to the kubelet, the resource names and folder, GPU
    sharing by memory (``core.model.sharing``), the placement policy (one setting with the scheduler
    extender's: ``OMATICAYA_PLACEMENT_POLICY``) and the device list strategies. Environment
    names are ``OMATICAYA_<FIELD>`` in upper case, except the policy's. The agent reads some
    of them too (the shared GPUs and resources, for its labels and attribution). Raises
    ``ValueError`` (``SettingsError`` through ``load``) on a bad value, naming the variable."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_", populate_by_name=True)

    device_plugin: bool = Field(
        default=False, description="Also serve the GPUs to the kubelet as a device plugin."
    )
    device_plugin_resource: str = Field(
        default="nvidia.com/gpu",
        description="Extended resource name the device plugin serves whole GPUs as. NVIDIA's "
        "device plugin serves the same name: run one of the two on a node (docs/install.md).",
    )
    device_plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/device-plugins"),
        description="The kubelet's device-plugins folder (kubelet.sock and the plugin socket).",
    )

    # -- GPU sharing by memory (core/model/sharing.py) -----------------------------------------
    shared_gpus: Annotated[SharedGpus, NoDecode] = Field(
        default=SharedGpus(),
        description="GPUs served as memory units instead of whole: none, all, GPU UUIDs "
        "(GPU-4a1b...: the safe form; a reboot that loses a GPU renumbers the others' indices, "
        "never their UUIDs), or indices (0-3; an index that names another GPU than at the last "
        "start is reported).",
    )
    share_unit_mib: int = Field(
        default=DEFAULT_UNIT_MIB, ge=1, le=1 << 20, description="MiB per unit of a shared GPU."
    )
    shared_resource: str = Field(
        default=DEFAULT_SHARED_RESOURCE,
        description="Extended resource name of the memory units of shared GPUs.",
    )
    share_policy: Literal["binpack", "spread"] = placement_policy_field(
        "OMATICAYA_SHARE_POLICY",
        "The placement policy, the scheduler extender's too (the chart's "
        "placement.policy sets both): which shared GPU the device plugin prefers for a slice, "
        "among those with the units and the live free memory: binpack the least room, spread "
        "the most. OMATICAYA_SHARE_POLICY is its old name, still read; both set to different "
        "values is an error.",
    )
    share_settle_s: float = Field(
        default=60,
        ge=0,
        le=86400,
        description="A slice handed out counts against its GPU's live free memory until the "
        "reading shows it in use, or for at most this many seconds.",
    )
    share_enforcement: Literal["mps", "none"] = Field(
        default="mps",
        description="What enforces a slice: mps (each shared GPU's CUDA MPS control daemon, run "
        "by `omaticaya mps`; a slice container becomes its client with exactly its limit; a "
        "shared GPU whose daemon is not up serves no units) or none (nothing: for runtimes that "
        "cannot run MPS; the limit is only in the container's environment).",
    )
    mps_root: Path = Field(
        default=DEFAULT_MPS_ROOT,
        description="Host folder of the MPS daemons: <root>/slices/<slice id>/pipe, /log and "
        "/shm (a slice's daemon and its tmpfs) and <root>/<GPU UUID>/pipe and /log (a GPU's "
        "probe daemon); a slice's pipe folder and tmpfs are mounted in its container.",
    )
    mps_state_dir: Path = Field(
        default=DEFAULT_MPS_STATE_DIR,
        description="Folder where `omaticaya mps` writes each daemon's state and holds its lock, "
        "and the plugins write their slice requests (a host folder the agent and the "
        "supervisor share).",
    )
    mps_thread_share: bool = Field(
        default=False,
        description="Also give each slice container a compute share proportional to its slice "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = units / GPU units, rounded up).",
    )
    mps_stale_s: float = Field(
        default=15,
        gt=0,
        le=3600,
        description="A daemon's state older than this counts as down (the supervisor writes it "
        "every check).",
    )
    # -- the DRA driver gpu.omaticaya.io (omaticaya_py/dra, core/publish/dra.py) -------------------
    dra: bool = Field(
        default=False,
        description="Serve the GPUs through Dynamic Resource Allocation as the driver "
        "gpu.omaticaya.io (Kubernetes 1.34+): publish this Node's ResourceSlice and run the "
        "kubelet DRA plugin. Instead of OMATICAYA_DEVICE_PLUGIN on a node, not with it.",
    )
    dra_plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins/gpu.omaticaya.io"),
        description="The DRA plugin's own folder: its gRPC socket dra.sock, its health socket "
        "and its checkpoint of prepared claims (under the kubelet's plugins folder).",
    )
    dra_registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="The kubelet's plugin registration folder (the registration socket "
        "gpu.omaticaya.io-reg.sock goes there).",
    )
    dra_cdi_dir: Path = Field(
        default=Path("/var/run/cdi"),
        description="Where the DRA plugin writes a prepared claim's CDI spec (a folder "
        "containerd 2 or CRI-O reads CDI specs from).",
    )
    dra_dev_root: Path = Field(
        default=Path("/dev"),
        description="The host's /dev as the DRA plugin sees it: a CDI spec names the device "
        "nodes (/dev/nvidia<minor>, nvidiactl, nvidia-uvm, nvidia-uvm-tools) found there.",
    )
    dra_taint_effect: Literal["NoSchedule", "NoExecute"] = Field(
        default="NoSchedule",
        description="The effect of the taint on an unhealthy GPU's device in the ResourceSlice: "
        "NoSchedule (no new claim gets it) or NoExecute (also evicts the pods of claims that "
        "have it, unless they tolerate it).",
    )
    device_list_strategy: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("envvar", "volume-mounts"),
        description=(
            "How Allocate hands a container its GPUs, any of: envvar, volume-mounts, "
            "cdi-annotations, cdi-cri (comma-separated)."
        ),
    )

    @field_validator("shared_gpus", mode="before")
    @classmethod
    def _parse_shared(cls, value: Any) -> SharedGpus:
        return parse_shared_gpus(value)

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _parse_strategy(cls, value: Any) -> tuple[str, ...]:
        parts = [p for p in re.split(r"[,\s]+", value.strip())] if isinstance(value, str) else list(value)
        parts = [p for p in parts if p]
        if not parts or any(p not in DEVICE_LIST_STRATEGIES for p in parts):
            raise ValueError(
                "expected one or more of " + ", ".join(DEVICE_LIST_STRATEGIES)
                + " separated by commas, like 'envvar,volume-mounts'"
            )
        return tuple(dict.fromkeys(parts))

    @field_validator("device_plugin_resource", "shared_resource")
    @classmethod
    def _check_resource(cls, value: str) -> str:
        return check_resource_name(value)

    @model_validator(mode="after")
    def _two_resources(self) -> DevicePluginSettings:
        if self.shared_resource == self.device_plugin_resource:
            raise ValueError(
                "OMATICAYA_SHARED_RESOURCE must differ from OMATICAYA_DEVICE_PLUGIN_RESOURCE "
                f"(both {self.shared_resource!r}): a GPU is served whole or in units, never both"
            )
        if self.dra and self.device_plugin:
            raise ValueError(
                "OMATICAYA_DRA and OMATICAYA_DEVICE_PLUGIN are both true: a GPU is served by one "
                "of the two on a node (the kubelet would hand it out twice); set one to false"
            )
        return self

    @field_validator("mps_root", "mps_state_dir")
    @classmethod
    def _check_mps_dir(cls, value: Path, info: ValidationInfo) -> Path:
        if not value.is_absolute() or ".." in value.parts:
            raise ValueError("expected an absolute folder path without '..', like '/run/omaticaya/mps'")
        if info.field_name == "mps_root" and len(str(value).encode()) > MAX_MPS_ROOT_BYTES:
            raise ValueError(
                f"expected at most {MAX_MPS_ROOT_BYTES} bytes (the daemons' unix sockets are "
                "<root>/<GPU UUID>/pipe/..., and a socket's path is at most 107 bytes), like "
                "'/run/omaticaya/mps'"
            )
        return value

    @field_validator("dra_plugin_dir", "dra_registry_dir", "dra_cdi_dir", "dra_dev_root")
    @classmethod
    def _check_dra_dir(cls, value: Path) -> Path:
        if not value.is_absolute() or ".." in value.parts:
            raise ValueError("expected an absolute folder path without '..', like '/var/run/cdi'")
        return value

    @field_validator("device_plugin_dir")
    @classmethod
    def _check_plugin_dir(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("expected an absolute folder path, like '/var/lib/kubelet/device-plugins'")
        return value


class Settings(DevicePluginSettings):
    """Every setting of the agent, its device plugin's section (``DevicePluginSettings``)
    first. Environment names are ``OMATICAYA_<FIELD>`` in upper case, except the Node name,
    which is ``NODE_NAME`` as the downward API sets it."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_", populate_by_name=True)

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
    trace: Path | None = Field(default=None, description="Replay this trace instead of NVML.")
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
    metrics_address: str = Field(
        default="0.0.0.0",
        description="Address the metrics and probe port binds to ('::' for IPv6, and IPv4 too "
        "on a dual-stack host).",
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

    @field_validator("trace", "pod_resources_socket", "proc_root", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("pod_resources_socket", "proc_root")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("expected an absolute path, like /proc (or empty: off)")
        return value

    @field_validator("trace")
    @classmethod
    def _trace_exists(cls, value: Path | None) -> Path | None:
        return check_trace(value)

    @field_validator("metrics_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        return check_bind_address(value)

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


def stuck_after_s(settings: Settings) -> float:
    """The stuck-reading bound, seconds: ``stuck_tick_periods`` (``OMATICAYA_STUCK_TICK_PERIODS``)
    schedule periods plus the jitter (``jitter_s``). No tick finished for this long, the agent's
    ``/healthz`` fails (``SnapshotCache.tick_overdue``); a reading this old, the device plugin
    reports every device Unhealthy (``stale-reading``). Pure."""
    return settings.stuck_tick_periods * settings.schedule.period_s() + settings.jitter_s


def load_settings(flag_names: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """``load(Settings, ...)``: the agent's settings (see ``load``)."""
    return load(Settings, flag_names, **overrides)


def check_resource_name(value: str) -> str:
    """``value`` stripped, when it is an extended resource name ``<domain>/<name>`` outside
    ``kubernetes.io`` (the kubelet's rule for a device plugin's resource). Raises
    ``ValueError`` naming the expected form otherwise."""
    value = value.strip()
    domain, slash, name = value.partition("/")
    if (
        not slash
        or len(domain) > 253
        or not DNS_SUBDOMAIN.match(domain)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or len(name) > 63
        or not EXTENDED_RESOURCE_NAME.match(name)
    ):
        raise ValueError(
            "expected an extended resource name <domain>/<name> outside kubernetes.io, "
            "like 'nvidia.com/gpu'"
        )
    return value
