"""The extender's settings: ``OMATICAYA_EXTENDER_*`` environment, ``.env`` and flags."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from ..core.config.settings import PlacementSection, load, parse_schedule
from ..core.config.settings_base import CommonSettings, check_bind_address
from ..core.rules.liveness import DEFAULT_MAX_CLOCK_SKEW_S

#: kube-scheduler's default ``httpTimeout`` for an extender, and the one our examples and the
#: chart's KubeSchedulerConfiguration set
DEFAULT_HTTP_TIMEOUT_S = 5.0

# ---------------------------------------------------------------------------- settings ----


class ExtenderSection(CommonSettings):
    """The extender's own settings: environment ``OMATICAYA_EXTENDER_<FIELD>``, ``.env``,
    flags (``ExtenderSettings`` combines it with the placement section)."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_EXTENDER_", populate_by_name=True)

    address: str = Field(
        default="127.0.0.1",
        description="Address to listen on (the scheduler runs in the same pod: loopback).",
    )
    port: int = Field(default=8888, ge=1, le=65535, description="Port to listen on.")
    scrape_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="A second port serving /metrics alone (never the filter, prioritize or "
        "preempt verbs, nor the probes), on scrape_address: for Prometheus to scrape from the "
        "pod's IP while the verbs stay on the loopback (the chart: scheduler.extender.metricsPort, "
        "9404, container port ext-metrics). 0: none. /metrics is served on port either way.",
    )
    scrape_address: str = Field(
        default="0.0.0.0",
        description="Address scrape_port binds to ('::' for IPv6, and IPv4 too on a "
        "dual-stack host).",
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
        description="Allowance on top of ttl_s, expires_at or a Lease's duration (agent "
        "schedule, clock skew).",
    )
    max_clock_skew_s: float = Field(
        default=DEFAULT_MAX_CLOCK_SKEW_S,
        ge=0,
        le=86400,
        description="A telemetry read_at or Lease renewTime further ahead of the extender's "
        "clock than this is that node's problem: its telemetry is unusable (the unknown "
        "policy), counted in omaticaya_extender_node_problems_total. Liveness itself is judged "
        "by when the extender saw the value change, on its own monotonic clock.",
    )
    fail_open: bool = Field(
        default=False,
        description="Let nodes whose GPU state is unknown or stale pass the filter.",
    )
    stale_policy: Literal["reject", "allow", "score-zero"] | None = Field(
        default=None,
        description="Nodes whose telemetry is stale: reject (fail the filter), allow (judge "
        "the last reading as fresh) or score-zero (pass, ranked last). Default: reject, or "
        "score-zero with fail_open. A Node's scheduler.<prefix>/stale-policy annotation overrides it.",
    )
    unknown_policy: Literal["reject", "allow", "score-zero"] | None = Field(
        default=None,
        description="Nodes with no usable telemetry: reject, allow or score-zero (both pass, "
        "scored 0). Default: reject, or score-zero with fail_open.",
    )
    signal: Literal["now", "window-min"] = Field(
        default="now",
        description="Free memory to decide on: now (the last reading) or window-min (the "
        "least of now and the agent's window minimum, OMATICAYA_WINDOW_S).",
    )
    assume_s: float = Field(
        default=30,
        gt=0,
        le=86400,
        description="A pod's reservation, made when the filter narrows it to one node, counts "
        "this long while the pod is not seen bound (the window Filter -> Bind; must exceed a "
        "Permit plugin's wait).",
    )
    scheduler_name: str = Field(
        default="omaticaya-scheduler",
        max_length=253,
        description="schedulerName of the pods whose placements are watched (empty: the bound "
        "pods of every scheduler; of those, the ones that ask for GPU memory, slices or whole "
        "GPUs count).",
    )
    lease_namespace: str = Field(
        default="",
        max_length=63,
        pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$",
        description="Watch the agents' liveness Leases in this namespace (the chart: the "
        "release namespace): a node whose telemetry names a Lease is fresh while the Lease is "
        "held and renewTime + leaseDurationSeconds + grace_s is ahead. Empty: no Lease watch, "
        "every node judged by its telemetry's expires_at or read_at + ttl_s.",
    )
    http_timeout_s: float = Field(
        default=DEFAULT_HTTP_TIMEOUT_S,
        gt=0,
        le=3600,
        description="The httpTimeout of this extender in kube-scheduler's "
        "KubeSchedulerConfiguration (5s: kube-scheduler's default and the examples'); set both "
        "to the same value. /preempt answers within it: it reads candidate nodes for at most "
        "this less 1 s (a fifth when that is less) and starts no node whose reads could run "
        "past that. Seconds, or a Go duration as the configuration writes it (5s, 1m30s, 500ms).",
    )
    preempt_unasked: bool = Field(
        default=False,
        description="Preempt where kube-scheduler does not ask: when a pod's filter failed "
        "for GPU memory alone and no /preempt call came for it within 5 s (kube-scheduler's "
        "dry run names no victim where its own GPU count fits, so it never asks), evict the "
        "fewest lower-priority pods whose GPUs then hold it, by /preempt's rule, through the "
        "Eviction API (PodDisruptionBudgets obeyed), with Events on both. Off by default: "
        "kube-scheduler does not nominate the pod, and it needs create on pods/eviction "
        "cluster-wide (the chart grants it with scheduler.extender.preemptUnasked).",
    )
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig path (unset: in-cluster, then $KUBECONFIG)."
    )

    @field_validator("http_timeout_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        """``5s``, ``1m30s``, ``500ms`` (a Go duration, as KubeSchedulerConfiguration writes
        ``httpTimeout``) in seconds; a plain number is seconds already."""
        if not isinstance(value, str) or not value.strip() or value.strip()[-1] not in "hms":
            return value
        try:
            return parse_schedule(f"@every {value.strip()}").interval_s
        except ValueError:
            raise ValueError(
                "expected seconds (5) or a Go duration of at least 100ms (5s, 1m30s, 500ms)"
            ) from None

    @field_validator("stale_policy", "unknown_policy", "signal", mode="before")
    @classmethod
    def _lower_strategy(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        return check_bind_address(value, "'127.0.0.1' or '0.0.0.0'")

    @field_validator("scrape_address")
    @classmethod
    def _check_scrape_address(cls, value: str) -> str:
        return check_bind_address(value)

    @model_validator(mode="after")
    def _two_ports(self) -> ExtenderSection:
        if self.scrape_port == self.port:
            raise ValueError(
                f"OMATICAYA_EXTENDER_SCRAPE_PORT must differ from OMATICAYA_EXTENDER_PORT (both "
                f"{self.port}): the metrics port serves /metrics alone, the extender's port its "
                "verbs; set 0 for no metrics port"
            )
        return self


class ExtenderSettings(ExtenderSection, PlacementSection):
    """Every setting of ``omaticaya extender``: its own section (``OMATICAYA_EXTENDER_*``) and
    the placement section it shares with the node's plugins (``OMATICAYA_PLACEMENT_POLICY``,
    ``OMATICAYA_SETTLE_S``, ``OMATICAYA_SHARED_RESOURCE``, ``OMATICAYA_DEVICE_PLUGIN_RESOURCE``:
    one name each for both sides; the extender's former names are still read)."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_EXTENDER_", populate_by_name=True)


def load_extender_settings(**overrides: Any) -> ExtenderSettings:
    """``ExtenderSettings`` from the environment and ``.env``, with ``overrides`` (flags; ``None``
    ignored) on top. Raises ``SettingsError``: one line per bad setting, naming the variable."""
    return load(ExtenderSettings, **overrides)
