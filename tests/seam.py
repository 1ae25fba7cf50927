"""The seam between the extender and the device plugin, in process: pods arrive on one node of
the recorded 8-GPU trace, kube-scheduler's own count and the real extender (``Extender.filter``
with its ledger) decide, and the device plugin's own rules (``allocation.preferred`` for whole
GPUs, ``Slicer.preferred`` + ``Slicer.allocate`` for slices) hand out the devices; the agent's
render publishes the kubelet's books (its PodResources attribution) for the next pod.

``Seam.arrive`` says what became of one pod: ``"pending"`` (kube-scheduler's count or the
extender refused it), ``"admitted"`` (the plugin gave it what the extender promised) or
``"refused"`` (the extender passed the node and the plugin then refused it there, or handed a
whole GPU without the pod's memory free: the pod would fail admission, or run without room).
The pods use no memory (busybox), the worst case the issue names: only the kubelet's books
show them. Used by tests/scheduler/test_fit_seam.py's property test and, for the figure before the fix,
against an older tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omaticaya_py.core.model.sharing import unit_ids
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.schema import parse_node
from omaticaya_py.deviceplugin.allocation import DeviceState, preferred
from omaticaya_py.deviceplugin.slicer import Slicer, SliceRefused
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.ledger import Ledger, placement_from_pod
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import MULTI_TRACE, READ_AT, evaluate, settings, snapshot

NOW = READ_AT.timestamp() + 5
U = 1024
GPU = "nvidia.com/gpu"
SLICES = "omaticaya.io/gpu-memory"
#: GPUs 0-3 of the trace are shared, 4-7 whole (free MiB: 81079 50359 70839 9399 | 81079 34999
#: 75959 3255)
SHARED = frozenset({0, 1, 2, 3})


def whole_pod(name: str, mib: int | None, count: int = 1) -> dict[str, Any]:
    """A pod asking for ``count`` whole GPUs with ``mib`` MiB free each (annotation and
    ``nvidia.com/gpu``, as the chart's examples); ``mib`` ``None``: ``nvidia.com/gpu`` alone,
    no annotation."""
    ann = ({} if mib is None else
           {"omaticaya.io/gpu-memory-mib": str(mib), "omaticaya.io/gpu-count": str(count)})  # fmt: skip
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": ann},
            "spec": {"schedulerName": "omaticaya-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": {GPU: str(count)}}}]}}  # fmt: skip


def slice_pod(name: str, *units: int) -> dict[str, Any]:
    """A pod with one container per slice of ``units``."""
    return {"metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": {}},
            "spec": {"schedulerName": "omaticaya-scheduler",
                     "containers": [{"name": f"c{k}", "resources": {"limits": {SLICES: str(n)}}}
                                    for k, n in enumerate(units)]}}  # fmt: skip


@dataclass
class Seam:
    """One node (``n``) of the 8-GPU trace, GPUs ``SHARED`` served in units of ``U``."""

    gpus: tuple[Any, ...] = field(default_factory=lambda: TraceReader(MULTI_TRACE, at_s=0).read().gpus)
    holders: dict[str, list[ContainerDevices]] = field(default_factory=dict)
    outcomes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = ExtenderSettings(_env_file=None)
        self.ledger = Ledger(s.settle_s, s.assume_s)
        self.ext = Extender(s, lambda name: self.state if name == "n" else None,
                            clock=lambda: NOW, monotonic=lambda: 0.0, ledger=self.ledger)  # fmt: skip
        self.slicer = Slicer(U, clock=lambda: 0.0)
        self.units = {g.uuid: unit_ids(g.uuid, g.memory_total_mib // U)
                      for g in self.gpus if g.index in SHARED}  # fmt: skip
        self.agent_settings = settings(shared_gpus=",".join(map(str, sorted(SHARED))))
        self.publish()

    # ---------------------------------------------------------------- the agent's side ----

    def publish(self) -> None:
        """The agent's render of the node with the kubelet's books, parsed as the extender's
        Node cache parses it."""
        snap = snapshot(*self.gpus, read_at=READ_AT)
        att = {g.uuid: GpuAttribution(g.uuid, holders=tuple(self.holders.get(g.uuid, ())))
               for g in self.gpus}  # fmt: skip
        health, _ = evaluate(snap, self.agent_settings)
        desired = render(snap, health, self.agent_settings, attribution=att)
        self.state = parse_node("n", desired.labels, desired.annotations)

    def held(self) -> set[str]:
        return {d for hs in self.holders.values() for h in hs for d in h.device_ids}

    # ----------------------------------------------------------------------- one pod ----

    def arrive(self, pod: dict[str, Any]) -> str:
        """What became of ``pod`` (see the module's docstring); appended to ``outcomes``."""
        outcome = self._arrive(pod)
        self.outcomes.append(outcome)
        return outcome

    def _arrive(self, pod: dict[str, Any]) -> str:
        containers = pod["spec"]["containers"]
        units = [int(c["resources"]["limits"].get(SLICES, 0)) for c in containers]
        count = sum(int(c["resources"]["limits"].get(GPU, 0)) for c in containers)
        held = self.held()
        whole_free = [g for g in self.gpus if g.index not in SHARED and g.uuid not in held]
        units_free = [u for us in self.units.values() for u in us if u not in held]
        if count > len(whole_free) or sum(units) > len(units_free):  # NodeResourcesFit
            return "pending"
        out = self.ext.filter({"Pod": pod, "NodeNames": ["n"]})
        if out.get("NodeNames") != ["n"]:
            return "pending"
        name = pod["metadata"]["name"]
        given = self._whole(name, pod, whole_free, count) if count else self._slices(name, units, units_free)
        if given is None:
            return "refused"
        for uuid, h in given:
            self.holders.setdefault(uuid, []).append(h)
        bound = {**pod, "spec": {**pod["spec"], "nodeName": "n"},
                 "status": {"phase": "Running", "startTime": "2025-03-04T05:00:00Z"}}
        new = placement_from_pod(bound, self.ledger.get(name),
                                 now=NOW)  # fmt: skip
        self.ledger.pod_changed(f"ns/{name}", None, new)
        self.publish()
        return "admitted"

    def _whole(self, name: str, pod: dict[str, Any], free: list[Any], count: int
               ) -> list[tuple[str, ContainerDevices]] | None:  # fmt: skip
        """The plugin's preferred GPUs; ``None`` when one of them lacks the pod's memory."""
        states = {g.uuid: DeviceState(g.uuid, g.index, True, (), g.memory_free_mib) for g in free}
        chosen = preferred(states, list(states), [], count)
        need = int(pod["metadata"]["annotations"].get("omaticaya.io/gpu-memory-mib", 0))
        if len(chosen) < count or any((states[u].free_mib or 0) < need for u in chosen):
            return None
        return [(u, ContainerDevices("ns", name, "c", GPU, (u,))) for u in chosen]

    def _slices(self, name: str, units: list[int], free: list[str]
                ) -> list[tuple[str, ContainerDevices]] | None:  # fmt: skip
        """Each container's slice by the plugin's own rules, in the kubelet's order."""
        states = [DeviceState(g.uuid, g.index, True, (), g.memory_free_mib)
                  for g in self.gpus if g.index in SHARED]  # fmt: skip
        for g in states:
            self.slicer.note_units(g.id, len(self.units[g.id]))
        available = list(free)
        out = []
        for k, n in enumerate(units):
            if n == 0:
                continue
            ids = self.slicer.preferred(states, available, [], n)
            if len(ids) < n:
                return None
            try:
                uuid, _ = self.slicer.allocate(ids, states)
            except SliceRefused:
                return None
            available = [u for u in available if u not in ids]
            out.append((uuid, ContainerDevices("ns", name, f"c{k}", SLICES, tuple(ids))))
        return out
