"""The scheduler side: a kube-scheduler extender that places pods by live GPU state.

The scheduler POSTs ``ExtenderArgs`` (``k8s.io/kube-scheduler/extender/v1``: ``Pod``, and
``Nodes`` (a v1.NodeList) or, when the extender is ``nodeCacheCapable``, ``NodeNames``) to
``/filter`` and ``/prioritize``. Answers: ``ExtenderFilterResult`` (``Nodes`` or ``NodeNames``,
``FailedNodes`` name -> reason, ``Error``) and a ``HostPriorityList`` (``[{"Host", "Score"}]``,
scores 0..10 = ``MaxExtenderPriority`` of the 1.20 scheduler). Field names are the Go names: the
Go types have no JSON tags.

A pod states its need with the annotation ``<prefix>/gpu-memory-mib`` (free MiB on each GPU) and
optionally ``<prefix>/gpu-count`` (GPUs, default 1), or asks for memory slices of shared GPUs
by resource (``omaticaya.io/gpu-memory`` in units, per container, sidecars and init containers
counted as Kubernetes counts them: ``container_asks.held_slices``; each slice must fit on one healthy
shared GPU by its live free memory less the reservations there). A pod with
neither passes through untouched (every node passes, every score is 0).

Filter, per node, from the agent's labels and its ``<prefix>/telemetry`` annotation:

- no Omaticaya data on the node (or the node is unknown to the cache), or stale telemetry (the
  agent is not reporting, by ``core.rules.liveness``: its Lease lapsed, or its telemetry past its
  ``expires_at`` (the agent's promise: heartbeat + schedule period + jitter after ``read_at``)
  plus ``grace_s``, or, from an agent that does not publish ``expires_at``, older than ``ttl_s +
  grace_s``; judged by when the extender saw the value change, on its own clock), or a time
  ahead of the clock by more than ``max_clock_skew_s``: the node's GPU state is unknown; it
  fails, unless ``fail_open`` (then it passes, with score 0);
- ``gpu.health`` Unhealthy or Unknown: fails;
- fewer than ``gpu-count`` healthy GPUs with ``gpu-memory-mib`` free: fails.

Prioritize: among the nodes that fit, ``binpack`` gives 10 to the node with the least free
memory on its healthy GPUs and 1 to the one with the most; ``spread`` the reverse. Nodes that do
not fit (or are unknown) get 0.

Modules, in the order a request meets them: ``settings`` (``OMATICAYA_EXTENDER_*``), ``app``
(the Starlette app: /filter, /prioritize, /preempt, /metrics, probes), ``protocol`` (the verbs:
ExtenderArgs in, results out; the narrowing to one node), ``need`` (pure: the pod's need),
``nodeview`` (pure: a Node as the extender sees it: signal, policy override, when it was seen),
``fit`` (pure: the one fit rule of every verb, its reason codes and texts, scores), ``cache``
(the rule's records and verdicts kept between requests), ``inflight`` (pure: reservations not
yet in a reading), ``ledger`` (the reservations' state machine; pods from the watch),
``victims`` (pure: the pods that must go for a pod to fit) and ``preempt`` (the
``preemptVerb``; docs/scheduling.md, "Preemption"), ``metrics`` (decisions by reason code; the
collectors), ``server`` (the caches and uvicorn). The command line is ``cli``'s ``extender``.
"""

from ..core.schema import parse_node
from .app import create_app
from .protocol import Extender
from .settings import ExtenderSettings

__all__ = ["Extender", "ExtenderSettings", "create_app", "parse_node"]
