"""Preemption kube-scheduler never asks for (issue 48 item 6): opt in with
``OMATICAYA_EXTENDER_PREEMPT_UNASKED`` (the chart's ``scheduler.extender.preemptUnasked``).

kube-scheduler calls an extender's ``preemptVerb`` only when its own dry run found a candidate
node with at least one victim. Where every node's count fits (one GPU node whose free-by-count
GPUs lack the memory: the multi-GPU trace's GPUs 3 and 7 with 9 and 3 GiB free) its dry run
names no victim anywhere, the preemption fails ("expected at least one victim pod on node")
before any extender is asked, and a high-priority pod stays Pending behind low-priority pods
for ever. No extender answer can change that; this component acts on its own instead:

- the filter tells it each GPU pod's nodes that failed for room alone (``filtered``: the same
  ``victims.RoomSought`` record ``/preempt`` adds); a pod that passed somewhere is forgotten;
- kube-scheduler's ``/preempt`` call for the pod (``asked``) forgets it too: kube-scheduler
  runs PostFilter right after the filter, so a pod not asked for within ``wait_s`` of its first
  failed filter (``ASK_WAIT_S``) is one kube-scheduler will not preempt for;
- then, read fresh (``read_pod``), a pod still unbound, not being deleted, whose
  ``preemptionPolicy`` is not ``Never``, gets the victims ``/preempt`` would give it, by the same
  rule (``preempt.preempt`` over the nodes its filter failed, ``victims.choose_victims``), on
  the node kube-scheduler would pick among them (``pick_node``), each evicted through the Eviction API (``policy/v1``, its
  UID a precondition: a PodDisruptionBudget that forbids it is obeyed, 429, and the rest of
  that set is left alone), with a Normal Event on each victim (``PreemptedForGpuMemory``) and
  on the preemptor (``GpuPreemption``);
- while a preemptor's victims are still bound to their node (terminating), nothing more is
  evicted for it (at most ``hold_s``, ``HOLD_S``): a victim that is going is never a victim
  again, but its GPU still reads as held, and choosing again would charge the node twice.

Counted in ``omaticaya_extender_decisions_total{verb="preempt-unasked"}``: per node, kept or
dropped as ``/preempt`` counts them (never under ``verb="preempt"``: kube-scheduler did not
ask); per pod, ``result`` evicted (pods), refused (an eviction the API refused: ``pdb``, ``gone``, ``forbidden``, ``failed``),
skipped (a pod not acted for: ``bound``, ``going``, ``never``, ``nominated``, ``gone``, ``holding``,
``no-victims``, ``read-failed``). Off by default: it evicts outside kube-scheduler's own
preemption, so kube-scheduler does not nominate the pod to the node (another pending pod that
fits there may take the room first) and it needs ``create`` on ``pods/eviction`` cluster-wide.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger as log

from ..core.schema import json_mapping, json_str
from ..core.schema.events import GPU_PREEMPTION, PREEMPTED_FOR_GPU_MEMORY
from .protocol import pod_name, pod_uid
from .victims import PodOnNode

__all__ = [
    "ASK_WAIT_S",
    "EVERY_S",
    "HOLD_S",
    "MAX_WAITING",
    "READ_BUDGET_S",
    "UnaskedEdges",
    "UnaskedPreemption",
    "Waiting",
    "not_eligible",
    "pick_node",
    "unasked_preemption",
]

#: seconds after a pod's first failed filter (of a streak) without a ``/preempt`` call for it
#: before acting: kube-scheduler asks in the same cycle, right after the filter
ASK_WAIT_S = 5.0
#: the most seconds a preemptor waits for its victims to leave their node before its victims
#: are chosen again (a victim stuck terminating longer does not block it for ever)
HOLD_S = 300.0
#: how often the waiting pods are looked at, seconds
EVERY_S = 1.0
#: the most pods waiting at once (the oldest record goes first)
MAX_WAITING = 1024


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pod whose filter failed for room alone: the pod document as the filter got it, the
    nodes it failed for room (``victims.RoomSought``'s) and ``since_s``, its first failed
    filter of this streak (monotonic seconds)."""

    pod: Mapping[str, Any]
    nodes: tuple[str, ...]
    since_s: float


def not_eligible(pod: Any) -> str:
    """Why a pod (a v1.Pod document, read fresh) is not preempted for: ``bound``
    (``spec.nodeName`` set), ``going`` (``metadata.deletionTimestamp``), ``never``
    (``spec.preemptionPolicy`` ``Never``, as kube-scheduler honours it), ``nominated``
    (``status.nominatedNodeName``: kube-scheduler's own preemption runs for it); ``""``:
    eligible."""
    meta, spec = (
        json_mapping(json_mapping(pod).get("metadata")),
        json_mapping(json_mapping(pod).get("spec")),
    )
    if json_str(spec.get("nodeName")):
        return "bound"
    if meta.get("deletionTimestamp"):
        return "going"
    if spec.get("preemptionPolicy") == "Never":
        return "never"
    if json_str(json_mapping(json_mapping(pod).get("status")).get("nominatedNodeName")):
        # kube-scheduler's own preemption chose a node for it: it waits for those victims
        # (and does not call /preempt meanwhile); evicting more would charge a node twice
        return "nominated"
    return ""


def pick_node(
    result: Any, priority: Mapping[str, int] | None = None
) -> tuple[str, tuple[str, ...]] | None:
    """The node to preempt on from an ExtenderPreemptionResult (``NodeNameToMetaVictims``:
    node -> ``{"Pods": [{"UID"}]}``), as kube-scheduler picks among its candidates: the one
    whose most important victim matters least (``priority``: victim uid -> ``spec.priority``,
    0 when unknown), then the lowest sum of the victims' priorities, then the fewest victims,
    then the earlier in the answer's order (the filter's). ``(node, victim UIDs)``, or
    ``None`` when no node has a victim."""
    rank = priority or {}
    best: tuple[tuple[int, int, int], str, tuple[str, ...]] | None = None
    for node, meta in json_mapping(json_mapping(result).get("NodeNameToMetaVictims")).items():
        pods = json_mapping(meta).get("Pods")
        uids = tuple(
            u for p in (pods if isinstance(pods, list) else ())
            if (u := json_str(json_mapping(p).get("UID")))
        )  # fmt: skip
        if not uids:
            continue
        prios = [rank.get(u, 0) for u in uids]
        key = (max(prios), sum(prios), len(uids))
        if best is None or key < best[0]:
            best = (key, node, uids)
    return None if best is None else (best[1], best[2])


#: ``(pod, nodes) -> (ExtenderPreemptionResult, {uid: PodOnNode} of the pods read on them)``:
#: ``preempt.preempt`` over those nodes
PreemptOver = Callable[
    [Mapping[str, Any], Sequence[str]], tuple[Mapping[str, Any], Mapping[str, PodOnNode]]
]


@dataclass(frozen=True)
class UnaskedEdges:
    """What ``UnaskedPreemption`` reads, acts and counts through.

    ``preempt_over(pod, nodes)``: the victims ``/preempt`` would give ``pod`` on ``nodes``, and
    the pods it read there (their keys and priorities: ``pick_node``, the evictions);
    ``read_pod(namespace, name)``: the pod read fresh (``None``: gone); ``pods_on(node)``: the
    pods bound to ``node`` as ``{uid: "namespace/name"}``; ``evict(namespace, name, uid)``: one
    Eviction (raises ``kube.KubeError``: ``KubeTooManyRequests`` when a PodDisruptionBudget
    forbids it); ``tell(namespace, name, uid, reason, message)``: a Normal Event on a pod (its
    failures are logged, never raised further); ``count(result, reason, n)``: the decision
    counts."""

    preempt_over: PreemptOver
    read_pod: Callable[[str, str], Mapping[str, Any] | None]
    pods_on: Callable[[str], Mapping[str, str]]
    evict: Callable[[str, str, str], None]
    tell: Callable[[str, str, str, str, str], None]
    count: Callable[[str, str, int], None]


class UnaskedPreemption:
    """The waiting pods and the evictions made for them (module docstring), acting through
    ``edges`` (``UnaskedEdges``); a pod is acted for once it waited ``wait_s``, an eviction
    holds for ``hold_s``, on ``clock`` (monotonic seconds). Thread-safe: the filter,
    ``/preempt`` and ``run`` run on different threads."""

    def __init__(self, edges: UnaskedEdges, *, wait_s: float = ASK_WAIT_S, hold_s: float = HOLD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._preempt_over, self._read_pod, self._pods_on = (
            edges.preempt_over, edges.read_pod, edges.pods_on)
        self._evict, self._tell, self._count = edges.evict, edges.tell, edges.count
        self.wait_s, self.hold_s, self.clock = wait_s, hold_s, clock
        self._waiting: dict[str, Waiting] = {}
        #: preemptor uid -> (node, its victims' uids, when evicted)
        self._evicted: dict[str, tuple[str, frozenset[str], float]] = {}
        self._lock = threading.Lock()

    def filtered(self, pod: Mapping[str, Any], nodes: Sequence[str], now_s: float) -> None:
        """A filter's answer for ``pod``: ``nodes``, those it failed for room alone (empty:
        it passed somewhere, or no node could be helped: forgotten). The first failure of a
        streak starts its wait; later ones keep it."""
        uid = pod_uid(pod)
        if not uid:
            return
        with self._lock:
            earlier = self._waiting.pop(uid, None)
            if not nodes:
                return
            while len(self._waiting) >= MAX_WAITING:
                del self._waiting[next(iter(self._waiting))]
            since = earlier.since_s if earlier is not None else now_s
            self._waiting[uid] = Waiting(pod, tuple(nodes), since)

    def asked(self, uid: str) -> None:
        """kube-scheduler called ``/preempt`` for pod ``uid``: its own preemption runs."""
        with self._lock:
            self._waiting.pop(uid, None)

    def waiting(self) -> list[str]:
        """The uids of the pods waiting, oldest first (for tests and logs)."""
        with self._lock:
            return list(self._waiting)

    def due(self, now_s: float) -> list[Waiting]:
        """The pods waited for ``wait_s`` or longer, taken off the list (a pod still failing
        comes back with its next filter)."""
        with self._lock:
            out = [w for w in self._waiting.values() if now_s - w.since_s >= self.wait_s]
            for w in out:
                self._waiting.pop(pod_uid(w.pod), None)
        return out

    def run_once(self) -> int:
        """Act for every pod due now; returns the pods evicted. Evictions older than
        ``hold_s`` are forgotten first (they hold nothing any more)."""
        now = self.clock()
        for uid in [u for u, (_, _, at) in self._evicted.items() if now - at >= self.hold_s]:
            del self._evicted[uid]
        return sum(self._act(w) for w in self.due(now))

    def run(self, stop: threading.Event, every_s: float = EVERY_S) -> None:
        """``run_once`` every ``every_s`` seconds until ``stop`` is set; a failure is logged
        and the loop goes on."""
        while not stop.wait(every_s):
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive one bad round
                log.warning("preempt-unasked: a round failed: {}", str(exc)[:300])

    def _skip(self, pod: Mapping[str, Any], why: str, detail: str = "") -> int:
        self._count("skipped", why, 1)
        log.info("preempt-unasked {}: not acted for ({}){}", pod_name(pod), why,
                 f": {detail}" if detail else "")  # fmt: skip
        return 0

    def _act(self, w: Waiting) -> int:
        """Preempt for one waiting pod (module docstring); returns the pods evicted."""
        uid, (ns, name) = pod_uid(w.pod), pod_name(w.pod).split("/", 1)
        try:
            fresh = self._read_pod(ns, name)
        except Exception as exc:  # noqa: BLE001 - untrusted edge: skipped and counted
            return self._skip(w.pod, "read-failed", str(exc)[:200])
        if fresh is None or pod_uid(fresh) != uid:
            return self._skip(w.pod, "gone")
        if why := not_eligible(fresh):
            return self._skip(fresh, why)
        now = self.clock()
        held = self._evicted.get(uid)
        if held is not None and now - held[2] < self.hold_s:
            try:
                still = held[1] & set(self._pods_on(held[0]))
            except Exception as exc:  # noqa: BLE001
                return self._skip(fresh, "read-failed", str(exc)[:200])
            if still:
                return self._skip(fresh, "holding", f"{len(still)} victim(s) still on {held[0]}")
        try:
            result, seen = self._preempt_over(fresh, w.nodes)
        except Exception as exc:  # noqa: BLE001
            return self._skip(fresh, "read-failed", str(exc)[:200])
        picked = pick_node(result, {uid: p.priority for uid, p in seen.items()})
        if picked is None:
            return self._skip(fresh, "no-victims")
        node, victims = picked
        on_node = {uid: p.key for uid, p in seen.items()}
        evicted = self._evict_all(fresh, node, victims, on_node)
        if evicted:
            self._evicted[uid] = (node, frozenset(evicted), now)
            keys = ", ".join(on_node[v] for v in evicted)
            self._tell(ns, name, uid, GPU_PREEMPTION,
                       f"evicted {len(evicted)} lower-priority pod(s) on node {node} so that its "
                       f"GPU memory holds this pod ({keys}); kube-scheduler's preemption does "
                       "not ask where its own GPU count fits")  # fmt: skip
            log.info("preempt-unasked {}: evicted on {}: {}", pod_name(fresh), node, keys)
        return len(evicted)

    def _evict_all(self, preemptor: Mapping[str, Any], node: str, victims: Sequence[str],
                   on_node: Mapping[str, str]) -> list[str]:  # fmt: skip
        """Evict ``victims`` in order; the first refusal stops the rest (a set that cannot be
        evicted whole frees too little)."""
        from ..kube import KubeForbidden, KubeNotFound, KubeTooManyRequests

        done: list[str] = []
        for victim in victims:
            key = on_node.get(victim)
            if key is None:
                self._count("refused", "gone", 1)
                break
            vns, vname = key.split("/", 1)
            try:
                self._evict(vns, vname, victim)
            except KubeTooManyRequests as exc:
                self._refused(preemptor, key, "pdb", exc)
                break
            except KubeNotFound as exc:
                self._refused(preemptor, key, "gone", exc)
                continue  # gone already: its room is on its way
            except KubeForbidden as exc:
                self._refused(preemptor, key, "forbidden", exc)
                break
            except Exception as exc:  # noqa: BLE001 - one failed eviction, logged and counted
                self._refused(preemptor, key, "failed", exc)
                break
            done.append(victim)
            self._count("evicted", "", 1)
            self._tell(vns, vname, victim, PREEMPTED_FOR_GPU_MEMORY,
                       f"evicted by the omaticaya scheduler extender for pod "
                       f"{pod_name(preemptor)} (priority "
                       f"{json_mapping(json_mapping(preemptor).get('spec')).get('priority', 0)}), "
                       f"which needs this pod's GPU memory on node {node}")  # fmt: skip
        return done

    def _refused(self, preemptor: Mapping[str, Any], key: str, why: str, exc: Exception) -> None:
        self._count("refused", why, 1)
        log.warning("preempt-unasked {}: eviction of {} refused ({}): {}", pod_name(preemptor),
                    key, why, str(exc)[:200])  # fmt: skip


#: seconds one round may spend reading the candidate nodes of one pod (its own budget: no
#: kube-scheduler waits on it)
READ_BUDGET_S = 10.0


def unasked_preemption(ext: Any, kubeconfig: str | None = None) -> UnaskedPreemption | None:
    """The component for the extender ``ext`` (``protocol.Extender``), over an API session of
    its own (``kube.ApiSession``: retried reads; evictions one attempt each, asked again at the
    pod's next round): ``preempt.preempt`` over a ``preempt.NodeReader``, the pod GET, the pods
    on a node LISTed, ``kube.PodClient``'s eviction and Events (reporter
    ``omaticaya-extender``). RBAC: ``get``/``list`` on pods, ``list`` on nodes, ``create`` on
    ``pods/eviction`` and ``events`` (the chart grants them with ``preemptUnasked``). ``None``
    (logged) when the session cannot be configured."""
    from ..kube import ApiSession, KubeError, KubeNotFound
    from ..kube.pod_client import PodClient
    from .deadline import Deadline
    from .preempt import NodeReader, PreemptOptions, preempt

    try:
        session = ApiSession(kubeconfig=kubeconfig)
    except KubeError as err:
        log.error("preemption kube-scheduler does not ask for: off: {}", err)
        return None
    reader = NodeReader(session, ext.settings.prefix)
    pods = PodClient(session, "omaticaya-extender", who="the extender")

    def preempt_over(pod: Mapping[str, Any], nodes: Sequence[str]
                     ) -> tuple[Mapping[str, Any], Mapping[str, PodOnNode]]:  # fmt: skip
        seen: dict[str, PodOnNode] = {}

        def read(node: str, deadline: Deadline) -> Any:
            view = reader(node, deadline)
            seen.update((p.uid, p) for p in view.pods)
            return view

        options = PreemptOptions(budget_s=READ_BUDGET_S, room_nodes=nodes,
                                 count=ext.decisions.unasked)  # fmt: skip
        result = preempt(ext, {"Pod": pod, "NodeNameToMetaVictims": {}}, read, options)
        return result, seen

    def read_pod(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            doc = pods.read_pod(namespace, name)
        except KubeNotFound:
            return None
        return doc if isinstance(doc, Mapping) else None

    def pods_on(node: str) -> Mapping[str, str]:
        view = reader(node, Deadline.start(READ_BUDGET_S))
        return {p.uid: p.key for p in view.pods}

    def tell(namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        try:
            pods.create_pod_event(namespace=namespace, name=name, uid=uid, reason=reason,
                                  message=message, warning=False)  # fmt: skip
        except KubeError as err:
            log.warning("preempt-unasked: event {} on {}/{}: {}", reason, namespace, name, err)

    edges = UnaskedEdges(preempt_over, read_pod, pods_on, pods.evict_pod, tell,
                         ext.decisions.unasked)  # fmt: skip
    return UnaskedPreemption(edges, clock=ext.monotonic)
