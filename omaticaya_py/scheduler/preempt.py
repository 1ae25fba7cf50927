"""The ``preemptVerb``: ExtenderPreemptionArgs in, ExtenderPreemptionResult out.

kube-scheduler sends the preemptor ``Pod`` and its candidates: ``NodeNameToMetaVictims`` (node
-> ``{"Pods": [{"UID"}], "NumPDBViolations"}``) when the extender is ``nodeCacheCapable``, else
``NodeNameToVictims`` (the same with whole v1.Pods). The answer is always
``{"NodeNameToMetaVictims": {...}}``, each node with at least one victim to evict
(kube-scheduler looks each node up in its snapshot and each UID up among the pods on that
node; one it cannot find fails the preemption; a node without victims fails it too,
"expected at least one victim pod on node"). A node where the pod fits with nothing evicted is
left out.

The nodes: the candidates kube-scheduler offers, and those it cannot offer: where its own
count fits (``nvidia.com/gpu`` free, the GPU memory not) its dry run names no victim and drops
the node. Those are the nodes this pod's filter, in the same cycle, failed for room alone
(``victims.RoomSought``, recorded by ``protocol.Extender.filter``): they passed its in-tree
filters, so evicting GPU holders there is all the pod needs. They are added after its own,
with no victim named and ``NumPDBViolations`` 0 (PodDisruptionBudgets are not read), and
counted ``kept``/``added`` when kept. kube-scheduler calls ``preemptVerb`` only when its dry
run found at least one candidate: where every node's count fits (one node, say), it is not
called and the pod stays Pending (docs/scheduling.md, Preemption).

Which kube-scheduler asks (docs/scheduling.md, "Preemption"): 1.20.0 up to the fix of
kubernetes#102971 never calls an extender's ``preemptVerb``; from 1.22 (kubernetes#101560)
a candidate node must have victims in kube-scheduler's own dry run, so a pod that requests
nothing its in-tree filters see (memory by annotation only) gets no candidates and the
extender is not asked either.

Per candidate node: a node the filter would fail for a reason eviction cannot change
(``victims.unresolvable``) is dropped; the others are read fresh from the API server
(``NodeReader``: the Node, for its telemetry's per-GPU holders, and the pods bound to it, for
their uid and priority), at most ``MAX_NODES`` per call, and ``victims.choose_victims``
decides. The call answers within kube-scheduler's ``httpTimeout`` (``http_timeout_s``):
``victims.Deadline`` starts no node whose two reads could run past the budget and cuts
each read to the time left; the nodes not started are dropped, counted as ``deadline``. A
pod without a GPU need passes through untouched (the candidates as given). Every
node's outcome is counted in ``omaticaya_extender_decisions_total{verb="preempt"}``; bad
entries (a victim or pod that cannot be read, a Node that cannot be read) drop that node only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loguru import logger as log

from ..core.schema import json_int, json_mapping, json_str, parse_gpu_readings, parse_node
from .deadline import READ_TIMEOUT_S, Deadline, preempt_budget_s
from .fit import judge_each
from .inflight import Placement
from .need import parse_need
from .protocol import pod_name, pod_uid
from .victims import (
    GpuRoom,
    PodOnNode,
    Preemptor,
    choose_victims,
    pod_on_node,
    pod_started_s,
    unresolvable,
)

__all__ = [
    "MAX_NODES", "Candidate", "NodeReader", "PreemptOptions", "ReadNode", "gpu_rooms", "preempt",
]

#: the most candidate nodes read from the API server per call (two requests each); the rest
#: are dropped, counted as ``over-cap`` (kube-scheduler picks one node of those kept)
MAX_NODES = 32


@dataclass(frozen=True, slots=True)
class Candidate:
    """A candidate node read fresh: its whole GPUs, the pods bound to it (oldest first), and
    how many of its pod documents could not be read (skipped)."""

    gpus: tuple[GpuRoom, ...]
    pods: tuple[PodOnNode, ...]
    skipped: int = 0


def gpu_rooms(node: Any, prefix: str) -> tuple[GpuRoom, ...]:
    """The whole GPUs of a v1.Node document: free memory and health as the filter decides
    (``parse_node``; an assigned GPU's by the live reading), total memory and every holder from
    its telemetry (``parse_gpu_readings``: the same ``pods`` that make ``parse_node`` read the GPU
    as assigned; one without both names as ``""``, never evicted)."""
    meta = json_mapping(json_mapping(node).get("metadata"))
    state = parse_node(
        json_str(meta.get("name")) or "", meta.get("labels"), meta.get("annotations"), prefix
    )
    if state.problem or state.read_at is None:
        return ()
    readings = {g.index: g for g in parse_gpu_readings(meta.get("annotations"), prefix)}
    out = []
    for g in state.gpus:
        r = readings.get(g.index)
        holders = tuple(
            (f"{h.namespace}/{h.pod}" if h.namespace and h.pod else "", h.memory_used_mib)
            for h in ((r.pods if r is not None else None) or ())
        )  # fmt: skip
        total = r.memory_total_mib if r is not None else None
        # an assigned GPU by its live free memory: the victims' eviction starts from it
        free = g.assigned_free_mib if g.assigned_free_mib is not None else g.free_mib
        out.append(GpuRoom(g.index, free, g.healthy, total, holders))
    return tuple(out)


def node_view(node: Any, pod_list: Any, prefix: str) -> Candidate:
    """A ``Candidate`` from a v1.Node and a v1.PodList of the pods bound to it (untrusted: a pod
    that cannot be read is skipped and counted)."""
    items = json_mapping(pod_list).get("items")
    pods: list[tuple[float, int, PodOnNode]] = []
    skipped = 0
    for i, doc in enumerate(items if isinstance(items, list) else ()):
        try:
            pods.append((pod_started_s(doc) or float("inf"), i, pod_on_node(doc)))
        except ValueError:
            skipped += 1
    pods.sort(key=lambda t: (t[0], t[1]))
    return Candidate(gpu_rooms(node, prefix), tuple(p for _, _, p in pods), skipped)


#: reads one candidate node fresh, its requests within the call's ``Deadline``
ReadNode = Callable[[str, Deadline], Candidate]


class NodeReader:
    """Reads a candidate node for preemption through ``session`` (``kube.ApiSession``): a LIST
    of the Node by ``metadata.name`` and a LIST of the pods with ``spec.nodeName`` = it (RBAC:
    ``list`` on nodes and pods, which the extender holds for its caches), each request's
    timeout ``deadline.read_timeout_s()`` (at most ``read_s``, never past the deadline). Raises
    ``KubeError`` when the API server does not answer in time (``KubeUnavailable``, without a
    request, when the deadline has passed)."""

    def __init__(self, session: Any, prefix: str) -> None:
        self._session, self._prefix = session, prefix

    def _get(self, what: str, path: str, query: dict[str, str], deadline: Deadline) -> Any:
        from ..kube import KubeUnavailable

        def request() -> Any:  # the timeout taken when sent (a 401 sends it again, later)
            timeout = deadline.read_timeout_s()
            if timeout is None:
                raise KubeUnavailable(f"list {what}: the preempt deadline passed: not sent")
            return self._session.http("GET", path, query=query, timeout=timeout)

        return json.loads(self._session.call("list", what, request).data)

    def __call__(self, node: str, deadline: Deadline) -> Candidate:
        nodes = self._get(
            f"node {node}", "/api/v1/nodes", {"fieldSelector": f"metadata.name={node}"}, deadline
        )
        items = json_mapping(nodes).get("items")
        node_doc = items[0] if isinstance(items, list) and items else {}
        pods = self._get(
            f"pods on {node}", "/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}, deadline
        )
        return node_view(node_doc, pods, self._prefix)


def _candidates(args: Mapping[str, Any]) -> tuple[dict[str, list[str]], dict[str, int], int]:
    """({node: named victim uids}, {node: NumPDBViolations}, bad entries) from either map."""
    meta = args.get("NodeNameToMetaVictims")
    full = meta is None
    raw = json_mapping(args.get("NodeNameToVictims") if full else meta)
    out: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    bad = 0
    for node, victims in raw.items():
        victims = json_mapping(victims)
        pods = victims.get("Pods")
        uids = [
            json_str(json_mapping(json_mapping(p).get("metadata")).get("uid")) if full
            else json_str(json_mapping(p).get("UID"))
            for p in (pods if isinstance(pods, list) else ())
        ]  # fmt: skip
        if not node or not all(uids) or not isinstance(pods, list | None):
            bad += 1  # a victim that cannot be named: the node cannot be checked
            continue
        out[node] = [u for u in uids if u]
        pdb[node] = json_int(victims.get("NumPDBViolations")) or 0
    return out, pdb, bad


def _meta(uids: Sequence[str], pdb: int) -> dict[str, Any]:
    return {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}


@dataclass(frozen=True)
class PreemptOptions:
    """How one ``preempt`` call runs. ``reserved_on(node)``: the ledger's placements still
    counting on it (``None``: the extender's in-flight placements, as the filter counts them).
    At most ``max_nodes`` nodes are read, within ``budget_s`` seconds from the call (``None``:
    ``preempt_budget_s`` of the settings' ``http_timeout_s``, kube-scheduler's
    ``httpTimeout``). ``room_nodes``: the nodes to add (``None``: those of the pod's latest
    filter, ``ext.room_sought``; ``unasked`` passes the ones it recorded); ``count(result,
    reason, n=1)``: where each node's outcome is counted (``None``:
    ``ext.decisions.preempted``, the ``preempt`` verb's)."""

    reserved_on: Callable[[str], Sequence[Placement]] | None = None
    max_nodes: int = MAX_NODES
    budget_s: float | None = None
    room_nodes: Sequence[str] | None = None
    count: Callable[..., None] | None = None


def preempt(ext: Any, args: Mapping[str, Any], read: ReadNode,
            options: PreemptOptions = PreemptOptions()) -> dict[str, Any]:  # fmt: skip
    """ExtenderPreemptionArgs -> ExtenderPreemptionResult for the extender ``ext``
    (``protocol.Extender``: settings, the Node cache, clocks, in-flight placements, decision
    counts). ``read(node, deadline)``: the node read fresh (``NodeReader``), its requests
    within ``deadline``, on the extender's monotonic clock (``ext.monotonic``); a node whose
    worst case no longer fits is not started (``victims.Deadline``). ``options``: what to
    read, how long and where to count (``PreemptOptions``)."""
    budget_s = options.budget_s
    if budget_s is None:
        budget_s = preempt_budget_s(ext.settings.http_timeout_s)
    deadline = Deadline.start(budget_s, ext.monotonic)
    s, pod = ext.settings, args.get("Pod")
    need = parse_need(pod, s.prefix, s.shared_resource, s.device_plugin_resource)
    candidates, pdb, bad = _candidates(args)
    count = ext.decisions.preempted if options.count is None else options.count
    if bad:
        count("dropped", "bad-victim", bad)
    if need is None or need.slices:
        # not a GPU pod, or a pod of slices (kube-scheduler's own fit counts their units, and
        # chose victims by them): kube-scheduler's own choice stands
        return {"NodeNameToMetaVictims": {n: _meta(u, pdb[n]) for n, u in candidates.items()}}
    if need.error:
        count("dropped", "bad-pod", len(candidates))
        return {"NodeNameToMetaVictims": {}}
    # the nodes its filter failed for room alone: kube-scheduler's dry run names no victim
    # where its own count fits, so it never offers them; victims chosen here alone
    room_nodes = options.room_nodes
    if room_nodes is None:
        room_nodes = ext.room_sought.nodes(pod_uid(pod), ext.monotonic())
    added = {n: None for n in room_nodes if n not in candidates}
    for n in added:
        candidates[n], pdb[n] = [], 0
    out = _victims(ext, pod, need, candidates, _Call(read, deadline, options, count, pdb, added))
    log.info(
        "preempt {}: {} of {} candidate node(s) kept ({} added): {}", pod_name(pod), len(out),
        len(candidates), len(added), {n: len(v["Pods"]) for n, v in list(out.items())[:8]},
    )  # fmt: skip
    return {"NodeNameToMetaVictims": out}


@dataclass(frozen=True)
class _Call:
    """One call's reads: ``read`` within ``deadline``, by ``options``, counted by ``count``;
    each candidate's ``pdb`` violations as kube-scheduler gave them, and the nodes ``added``
    to kube-scheduler's."""

    read: ReadNode
    deadline: Deadline
    options: PreemptOptions
    count: Callable[..., None]
    pdb: Mapping[str, int]
    added: Mapping[str, None]


def _victims(ext: Any, pod: Any, need: Any, candidates: dict[str, list[str]],
             run: _Call) -> dict[str, Any]:  # fmt: skip
    """Node -> its victims' meta, for the ``candidates`` read fresh whose victims hold ``pod``
    (``choose_victims``); the others dropped and counted."""
    states = {n: ext.lookup(n) for n in candidates}
    inflight = ext.inflight_of(pod)
    ctx = replace(ext.context(), stale_policy="reject", unknown_policy="reject", fail_open=False)
    hopeless = unresolvable(need, judge_each(states.items(), need, ctx, inflight)[2], states.get)
    out: dict[str, Any] = {}
    reads = _read(candidates, hopeless, run.read, run.deadline, run.options.max_nodes, run.count)
    for node, view in reads:
        if run.options.reserved_on is not None:
            reserved = run.options.reserved_on(node)
        else:
            reserved = inflight(node, states[node]) if inflight is not None else ()
        choice = choose_victims(Preemptor(need, _priority(pod), pod_uid(pod)), view.gpus,
                                view.pods, reserved=reserved, named=candidates[node])  # fmt: skip
        if (why := _dropped(choice)) is not None:
            if choice.victims is None:
                log.info("preempt {}: node {} dropped: {}", pod_name(pod), node, choice.reason)
            run.count("dropped", why)
            continue
        run.count("kept", "added" if node in run.added else "")
        out[node] = _meta(choice.victims, run.pdb[node])  # type: ignore[arg-type]  # not None here
    return out


def _priority(pod: Any) -> int:
    return json_int(json_mapping(json_mapping(pod).get("spec")).get("priority")) or 0


def _dropped(choice: Any) -> str | None:
    """Why a node's choice drops it (a ``Decisions`` reason), ``None``: kept."""
    if choice.victims is None:
        return "too-little" if "too little" in choice.reason else "no-fit"
    if not choice.victims:
        # it fits with nothing evicted (room freed since the filter): the next cycle's
        # filter passes it; a node without victims is an error to kube-scheduler from
        # 1.22 (kubernetes#101560) and a crash in 1.20's selection (kubernetes#101548)
        return "fits-already"
    return None


def _read(candidates: Mapping[str, Any], hopeless: Mapping[str, str], read: ReadNode,
          deadline: Deadline, max_nodes: int, count: Callable[..., None]
          ) -> Iterator[tuple[str, Candidate]]:  # fmt: skip
    """Each candidate node read fresh, in order: those evicting cannot help, those over
    ``max_nodes``, those whose reads could outlast ``deadline`` and those that could not be
    read are dropped and counted."""
    read_n = 0
    for node in candidates:
        if node in hopeless:
            count("dropped", "unresolvable")
        elif read_n >= max_nodes:
            count("dropped", "over-cap")
        elif not deadline.node_fits():
            count("dropped", "deadline")  # its reads could outlast kube-scheduler's wait
        else:
            read_n += 1
            try:
                view = read(node, deadline)
            except Exception as exc:  # noqa: BLE001 - one node's failure must not fail the others
                log.warning("preempt: node {} could not be read: {}", node, str(exc)[:200])
                count("dropped", "read-failed")
                continue
            if view.skipped:
                count("dropped", "bad-pod-on-node", view.skipped)
            yield node, view


def preemptor(ext: Any, kubeconfig: str | None = None) -> Callable[[Any], Any] | None:
    """The ``/preempt`` handler for ``ext``: ``preempt`` over a ``NodeReader`` with its own API
    session (one attempt; each request's timeout from the call's ``Deadline``: kube-scheduler
    waits ``httpTimeout`` for the whole answer); ``None`` (no ``/preempt`` route) when the
    session cannot be configured."""
    from ..kube import ApiSession, KubeError

    try:
        session = ApiSession(kubeconfig=kubeconfig, timeout_s=READ_TIMEOUT_S, attempts=1)
    except KubeError as err:
        log.error("preemption off: {}", err)
        return None
    reader = NodeReader(session, ext.settings.prefix)

    def handle(args: Any) -> Any:
        if ext.unasked is not None:  # kube-scheduler's own preemption runs for this pod
            ext.unasked.asked(pod_uid(json_mapping(args).get("Pod")))
        return preempt(ext, args, reader)

    return handle
