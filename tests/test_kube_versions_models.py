"""A typed model of KubeSchedulerConfiguration ``kubescheduler.config.k8s.io/v1``, the one API
version every supported kube-scheduler (1.31 through 1.37) reads, with the fields it has and no
others (``extra="forbid"``: an unknown or misspelt field fails, as kube-scheduler's strict
decoding does).

Each class mirrors an upstream Go type; the field names are the ``json:"..."`` tags of
``config/v1/types.go`` of the Go module k8s.io/kube-scheduler (``staging/src/k8s.io/kube-scheduler``
in kubernetes/kubernetes) at v0.31.0 and v0.37.2, as the dev cluster's builds fetched them into
the Go module cache, and ``config/v1alpha1/types.go`` of k8s.io/component-base at the same
versions for the embedded leader-election, client-connection and debugging structs (the same
fields at both). Field types are loose (``Any`` where the Go type is a nested struct we never
write); the point is the field set.

Which kube-scheduler minors read which version (the directories present in
kubernetes/kube-scheduler ``config/`` at tags v0.19.0 ... v0.37.2): v1beta1 1.19-1.22 (gone at
v0.23.0), v1beta2 1.22-1.27 (gone at v0.28.0), v1beta3 1.23-1.28 (gone at v0.29.0), v1 from 1.25
(``config/v1`` before 1.23 is the legacy Policy API, not KubeSchedulerConfiguration). So from
1.29 on, v1 is the only one: the chart (Kubernetes >= 1.31) renders v1 and ``examples/`` ships
only ``scheduler-config-v1.yaml``; the older versions stay in ``SERVED`` as the record of why.
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


# --- k8s.io/component-base config/v1alpha1/types.go (v0.31.0 and v0.37.2: same fields) ----------


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


# --- k8s.io/kube-scheduler config/v1/types.go at v0.31.0 .. v0.37.2 ------------------------------


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
    (tests/test_kube_versions.py)."""

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
