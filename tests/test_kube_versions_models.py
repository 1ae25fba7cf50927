"""Typed models of KubeSchedulerConfiguration, one per API version, with the fields that version
has and no others (``extra="forbid"``: an unknown or misspelt field fails, as kube-scheduler's
strict decoding does).

Each class mirrors an upstream Go type; the field names are the ``json:"..."`` tags read from
kubernetes/kubernetes ``staging/src/k8s.io/kube-scheduler/config/<version>/types.go`` (published
as github.com/kubernetes/kube-scheduler ``config/<version>/types.go``) at the tags named below, and
``staging/src/k8s.io/component-base/config/v1alpha1/types.go`` for the embedded
leader-election, client-connection and debugging structs. Field types are loose (``Any`` where
the Go type is a nested struct we never write); the point is the field set.

Which kube-scheduler minors read which version (the directories present in
kubernetes/kube-scheduler ``config/`` at tags v0.20.0 ... v0.36.0):
v1beta1 1.19-1.22 (gone at v0.23.0), v1beta2 1.22-1.27 (gone at v0.28.0), v1beta3 1.23-1.28
(gone at v0.29.0), v1 from 1.25 (``config/v1`` before 1.23 is the legacy Policy API, not
KubeSchedulerConfiguration).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

GROUP = "kubescheduler.config.k8s.io/"

#: version -> (first minor that reads it, first minor that no longer does, or None)
SERVED: dict[str, tuple[str, str | None]] = {
    "v1beta1": ("1.19", "1.23"),
    "v1beta2": ("1.22", "1.28"),
    "v1beta3": ("1.23", "1.29"),
    "v1": ("1.25", None),
}


def _minor(version: str) -> int:
    return int(version.lstrip("v").split(".")[1].split("-")[0].split("+")[0])


def served_by(kube_version: str) -> list[str]:
    """The KubeSchedulerConfiguration versions kube-scheduler ``kube_version`` reads, oldest first."""
    m = _minor(kube_version)
    return [
        v
        for v, (first, removed) in SERVED.items()
        if _minor(first) <= m and (removed is None or m < _minor(removed))
    ]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)


# --- k8s.io/component-base/config/v1alpha1/types.go (v0.20.0 and v0.36.0: same fields) ---------


class LeaderElectionConfiguration(_Strict):
    leaderElect: bool | None = None
    leaseDuration: str | None = None
    renewDeadline: str | None = None
    retryPeriod: str | None = None
    resourceLock: str | None = None
    resourceName: str | None = None
    resourceNamespace: str | None = None


class ClientConnectionConfiguration(_Strict):
    kubeconfig: str | None = None
    acceptContentTypes: str | None = None
    contentType: str | None = None
    qps: float | None = None
    burst: int | None = None


# --- shared by every version: Plugin, PluginSet, PluginConfig, Extender and its parts -----------
# v1beta1 types.go (v0.20.0) uses v1.ExtenderManagedResource / v1.ExtenderTLSConfig from the
# legacy config/v1/types.go; v1beta3 and v1 define them in their own types.go. Same fields.


class Plugin(_Strict):
    name: str
    weight: int | None = None


class PluginSet(_Strict):
    enabled: list[Plugin] | None = None
    disabled: list[Plugin] | None = None


class PluginConfig(_Strict):
    name: str
    args: dict[str, Any] | None = None


class ExtenderManagedResource(_Strict):
    name: str
    ignoredByScheduler: bool | None = None


class ExtenderTLSConfig(_Strict):
    insecure: bool | None = None
    serverName: str | None = None
    certFile: str | None = None
    keyFile: str | None = None
    caFile: str | None = None
    certData: str | None = None
    keyData: str | None = None
    caData: str | None = None


class Extender(_Strict):
    """``Extender`` in config/{v1beta1,v1beta2,v1beta3,v1}/types.go: the same 12 fields in all."""

    urlPrefix: str
    filterVerb: str | None = None
    preemptVerb: str | None = None
    prioritizeVerb: str | None = None
    weight: int | None = None
    bindVerb: str | None = None
    enableHTTPS: bool | None = None
    tlsConfig: ExtenderTLSConfig | None = None
    httpTimeout: str | None = None
    nodeCacheCapable: bool | None = None
    managedResources: list[ExtenderManagedResource] | None = None
    ignorable: bool | None = None


# --- config/v1beta1/types.go at v0.20.0; config/v1beta2/types.go at v0.22.0 (same field set) ----


class PluginsV1beta1(_Strict):
    queueSort: PluginSet | None = None
    preFilter: PluginSet | None = None
    filter: PluginSet | None = None
    postFilter: PluginSet | None = None
    preScore: PluginSet | None = None
    score: PluginSet | None = None
    reserve: PluginSet | None = None
    permit: PluginSet | None = None
    preBind: PluginSet | None = None
    bind: PluginSet | None = None
    postBind: PluginSet | None = None


class ProfileV1beta1(_Strict):
    schedulerName: str | None = None
    plugins: PluginsV1beta1 | None = None
    pluginConfig: list[PluginConfig] | None = None


class _Common(_Strict):
    kind: Literal["KubeSchedulerConfiguration"]
    parallelism: int | None = None
    leaderElection: LeaderElectionConfiguration | None = None
    clientConnection: ClientConnectionConfiguration | None = None
    # component-base DebuggingConfiguration, inlined
    enableProfiling: bool | None = None
    enableContentionProfiling: bool | None = None
    percentageOfNodesToScore: int | None = None
    podInitialBackoffSeconds: int | None = None
    podMaxBackoffSeconds: int | None = None
    extenders: list[Extender] | None = None


class KubeSchedulerConfigurationV1beta1(_Common):
    """kubernetes/kube-scheduler config/v1beta1/types.go @ v0.20.0."""

    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta1"]
    healthzBindAddress: str | None = None
    metricsBindAddress: str | None = None
    profiles: list[ProfileV1beta1] | None = None


class KubeSchedulerConfigurationV1beta2(_Common):
    """kubernetes/kube-scheduler config/v1beta2/types.go @ v0.22.0 (fields as v1beta1)."""

    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta2"]
    healthzBindAddress: str | None = None
    metricsBindAddress: str | None = None
    profiles: list[ProfileV1beta1] | None = None


# --- config/v1beta3/types.go at v0.23.0-v0.28.0: no healthz/metrics bind addresses, multiPoint,
# preEnqueue from v0.26.0 --------------------------------------------------------------------


class PluginsV1beta3(PluginsV1beta1):
    multiPoint: PluginSet | None = None
    preEnqueue: PluginSet | None = None


class ProfileV1beta3(_Strict):
    schedulerName: str | None = None
    plugins: PluginsV1beta3 | None = None
    pluginConfig: list[PluginConfig] | None = None


class KubeSchedulerConfigurationV1beta3(_Common):
    """kubernetes/kube-scheduler config/v1beta3/types.go @ v0.23.0 .. v0.28.0."""

    apiVersion: Literal["kubescheduler.config.k8s.io/v1beta3"]
    profiles: list[ProfileV1beta3] | None = None


# --- config/v1/types.go at v0.25.0 .. v0.36.0: as v1beta3, plus the profile's
# percentageOfNodesToScore (v0.26.0), delayCacheUntilActive (v0.29.0) and the placementGenerate /
# placementScore plugin points (v0.36.0). A model is the union of its version's minors. ----------


class PluginsV1(PluginsV1beta3):
    placementGenerate: PluginSet | None = None
    placementScore: PluginSet | None = None


class ProfileV1(_Strict):
    schedulerName: str | None = None
    percentageOfNodesToScore: int | None = None
    plugins: PluginsV1 | None = None
    pluginConfig: list[PluginConfig] | None = None


class KubeSchedulerConfigurationV1(_Common):
    """kubernetes/kube-scheduler config/v1/types.go @ v0.25.0 .. v0.36.0."""

    apiVersion: Literal["kubescheduler.config.k8s.io/v1"]
    delayCacheUntilActive: bool | None = None
    profiles: list[ProfileV1] | None = None


MODELS: dict[str, type[_Common]] = {
    "v1beta1": KubeSchedulerConfigurationV1beta1,
    "v1beta2": KubeSchedulerConfigurationV1beta2,
    "v1beta3": KubeSchedulerConfigurationV1beta3,
    "v1": KubeSchedulerConfigurationV1,
}
