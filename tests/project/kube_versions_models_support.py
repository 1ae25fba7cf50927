"""What other test files share of test_kube_versions_models.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

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
    """``Extender``: the same 12 fields at v0.31.0 and v0.37.2 (and in every beta before)."""

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


class PluginsV1(_Strict):
    """``Plugins``: the extension points of v0.31.0, plus placementGenerate and placementScore
    (v0.36.0) and podGroupPostFilter (v0.37.0). A model is the union of the supported minors;
    the real kube-scheduler of the release under test decodes what the chart renders
    (tests/project/test_kube_versions.py)."""

    preEnqueue: PluginSet | None = None
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
    multiPoint: PluginSet | None = None
    placementGenerate: PluginSet | None = None
    placementScore: PluginSet | None = None
    podGroupPostFilter: PluginSet | None = None


class ProfileV1(_Strict):
    """``KubeSchedulerProfile`` (the same fields at v0.31.0 and v0.37.2)."""

    schedulerName: str | None = None
    percentageOfNodesToScore: int | None = None
    plugins: PluginsV1 | None = None
    pluginConfig: list[PluginConfig] | None = None


class KubeSchedulerConfigurationV1(_Strict):
    """``KubeSchedulerConfiguration`` (the same fields at v0.31.0 and v0.37.2; component-base's
    DebuggingConfiguration inlined)."""

    apiVersion: Literal["kubescheduler.config.k8s.io/v1"]
    kind: Literal["KubeSchedulerConfiguration"]
    parallelism: int | None = None
    leaderElection: LeaderElectionConfiguration | None = None
    clientConnection: ClientConnectionConfiguration | None = None
    enableProfiling: bool | None = None
    enableContentionProfiling: bool | None = None
    percentageOfNodesToScore: int | None = None
    podInitialBackoffSeconds: int | None = None
    podMaxBackoffSeconds: int | None = None
    profiles: list[ProfileV1] | None = None
    extenders: list[Extender] | None = None
    delayCacheUntilActive: bool | None = None


#: API version -> model: the versions the chart can render (v1 only, see the module's docstring)
MODELS: dict[str, type[_Strict]] = {
    "v1": KubeSchedulerConfigurationV1,
}
