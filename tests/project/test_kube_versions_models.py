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

from tests.project.kube_versions_models_support import (  # the names moved out, for this file's tests
    MODELS,  # noqa: F401
    SERVED,  # noqa: F401
    ClientConnectionConfiguration,  # noqa: F401
    Extender,  # noqa: F401
    ExtenderManagedResource,  # noqa: F401
    ExtenderTLSConfig,  # noqa: F401
    KubeSchedulerConfigurationV1,  # noqa: F401
    LeaderElectionConfiguration,  # noqa: F401
    Plugin,  # noqa: F401
    PluginConfig,  # noqa: F401
    PluginSet,  # noqa: F401
    PluginsV1,  # noqa: F401
    ProfileV1,  # noqa: F401
    _minor,  # noqa: F401
    _Strict,  # noqa: F401
    served_by,  # noqa: F401
)

GROUP = "kubescheduler.config.k8s.io/"









# --- k8s.io/component-base config/v1alpha1/types.go (v0.31.0 and v0.37.2: same fields) ----------






# --- k8s.io/kube-scheduler config/v1/types.go at v0.31.0 .. v0.37.2 ------------------------------




















