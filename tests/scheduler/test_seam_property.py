"""A property test across the seam (issue 38 item 3): random node states and random pods; for
each pod the extender passes, its prediction (the reservation in its ledger right after
``Extender.filter``) equals the devices the device plugin's own rules then hand out from the
kubelet's available list, and the plugin admits the pod.

The node: 2-5 H100s, each with a random live free memory (whole GiB: the labels' step),
shared (``omaticaya.io/gpu-memory`` units of 1 GiB) or whole (``nvidia.com/gpu``), at least one
of each, any of them possibly Unhealthy (remapped-rows failure: the agent says so, the plugin
advertises it Unhealthy, the kubelet never hands it out). The pods: whole GPUs
(``gpu-memory-mib`` + ``gpu-count`` annotations and 1-3 ``nvidia.com/gpu``), whole GPUs
without the annotation (1-3 ``nvidia.com/gpu`` alone: the device plugin hands them out as it
would any pod's, issue 48 item 2), 1-3 app containers of slices, a plain init container of a
slice before them (as large as they are together), a sidecar (``restartPolicy: Always``) of a
slice before them, and slices beside one ``nvidia.com/gpu``, with the memory annotation or
without. Once admitted, a pod's running containers (app and sidecar) use their slices' memory,
and the next reading shows it.

Readings lag: after each pod a reading follows or not (drawn), so several pods are filtered and
admitted in one window, judged on a reading that shows none of them (each pod starts after the
last reading; the next reading, after it started, shows its holders and its memory in use). In
that window only the extender's in-flight book keeps a pod off the GPUs the plugin just handed
out.

The kubelet is modelled as its device manager hands devices out (``devicemanager``'s
``devicesToAllocate``): containers one at a time, init containers first; a container takes the
units the plain init containers before it left for reuse first, then asks the plugin's
``GetPreferredAllocation`` for the rest with those units as ``must_include``; a plain init
container's units (reused ones too) go back to the pod's pool for reuse, a sidecar's and an app
container's are its own. Every allocated unit stays the pod's in the kubelet's books; the
PodResources list (what the agent publishes) names the app containers' and sidecars' devices,
not a plain init container's. The plugin's groups of slices are the containers that share a
unit (``need.held_slices``' groups).

Disagreements the property found are kept as explicit examples, each fixed: a busybox pod of
slices (its memory never used: a holder shows a slice's units, not its memory), a plain init
container smaller than its app containers (a slice is placed by its first container), and one
larger than them (the units PodResources does not list count for the pod's life).

It fails when a fix of issue 38 is reverted: with ``Need.whole_count`` returning 0 for every pod
of slices (fault 5) it finds a pod of slices and one ``nvidia.com/gpu`` whose whole GPU the
extender does not reserve while the plugin hands one out; with ``need.held_slices`` ignoring
init containers (fault 1) it finds a plain init container whose slice the app containers reuse
predicted as separate slices. With the extender reading pods by ``need.parse_need`` (the
annotation) instead of ``need.pod_need`` (issue 48 item 2), it finds an unannotated
``nvidia.com/gpu`` pod passed with no reservation, and, in one window, the annotated pod after
it refused (the GPU the extender reserved for it went to the unannotated one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hypothesis import event, given, note
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from omaticaya_py.core.model.sharing import parse_unit_id, unit_ids
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.schema import parse_node
from omaticaya_py.deviceplugin.allocation import DeviceState, preferred
from omaticaya_py.deviceplugin.slicer import Slicer, SliceRefused
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.container_asks import effective_request, held_slices
from omaticaya_py.scheduler.ledger import Ledger, placement_from_pod
from tests.helpers import READ_AT, evaluate, gpu, settings, snapshot

NOW = READ_AT.timestamp() + 5
U = 1024
TOTAL = 81559  # an H100 80GB: 79 units of 1 GiB
UNITS = TOTAL // U
GPU = "nvidia.com/gpu"
SLICES = "omaticaya.io/gpu-memory"
MEM = "omaticaya.io/gpu-memory-mib"
COUNT = "omaticaya.io/gpu-count"


# ------------------------------------------------------------------------- the pods ----


@dataclass(frozen=True)
class PodSpec:
    """A pod as the test draws it: its init containers ``(units, sidecar)``, its app
    containers' units (0: none), and whole GPUs (``gpus`` on app container ``gpu_on``, with
    ``mib`` free each by annotation; ``mib`` ``None``: no annotation, the GPUs alone)."""

    name: str
    init: tuple[tuple[int, bool], ...] = ()
    app: tuple[int, ...] = ()
    gpus: int = 0
    mib: int | None = 0
    gpu_on: int = 0

    @property
    def kind(self) -> str:
        if self.init:
            return "sidecar" if self.init[0][1] else "init"
        bare = " bare" if self.mib is None else ""
        return ("mixed" if self.app else "whole") + bare if self.gpus else "slices"

    def doc(self) -> dict[str, Any]:
        ann = {MEM: str(self.mib), COUNT: str(self.gpus)} if self.gpus and self.mib is not None else {}
        inits = [{"name": f"i{k}", "resources": {"limits": {SLICES: str(n)}},
                  **({"restartPolicy": "Always"} if sidecar else {})}
                 for k, (n, sidecar) in enumerate(self.init)]  # fmt: skip
        apps: list[dict[str, Any]] = []
        for k, n in enumerate(self.app or (0,)):
            limits = {SLICES: str(n)} if n else {}
            if self.gpus and k == self.gpu_on:
                limits[GPU] = str(self.gpus)
            apps.append({"name": f"c{k}", "resources": {"limits": limits}})
        spec: dict[str, Any] = {"schedulerName": "omaticaya-scheduler", "containers": apps}
        if inits:
            spec["initContainers"] = inits
        return {"metadata": {"name": self.name, "namespace": "ns", "uid": self.name,
                             "annotations": ann}, "spec": spec}  # fmt: skip


UNIT = st.integers(1, 45)
APPS = st.lists(UNIT, min_size=1, max_size=3).map(tuple)


@st.composite
def pods(draw: st.DrawFn, name: str) -> PodSpec:
    kind = draw(st.sampled_from(["whole", "bare", "slices", "init", "sidecar", "mixed"]))
    if kind == "whole":
        return PodSpec(name, gpus=draw(st.integers(1, 3)), mib=draw(st.integers(1, 80)) * U)
    if kind == "bare":  # nvidia.com/gpu alone, no memory annotation
        return PodSpec(name, gpus=draw(st.integers(1, 3)), mib=None)
    apps = draw(APPS)
    if kind == "slices":
        return PodSpec(name, app=apps)
    if kind == "sidecar":
        return PodSpec(name, init=((draw(UNIT), True),), app=apps)
    if kind == "init":  # smaller, as large or larger than its app containers together
        return PodSpec(name, init=((draw(st.integers(1, sum(apps) + 20)), False),), app=apps)
    mib = draw(st.one_of(st.none(), st.integers(1, 40).map(lambda k: k * U)))
    return PodSpec(name, app=apps, gpus=1, mib=mib,
                   gpu_on=draw(st.integers(0, len(apps) - 1)))  # fmt: skip


# ------------------------------------------------------------------------- the node ----


@dataclass(frozen=True)
class GpuSpec:
    free_mib: int
    shared: bool
    healthy: bool = True


@st.composite
def nodes(draw: st.DrawFn) -> tuple[GpuSpec, ...]:
    n = draw(st.integers(2, 6))
    shared = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    shared[0], shared[1] = True, False  # at least one of each (then shuffled)
    shared = draw(st.permutations(shared))
    frees = draw(st.lists(st.integers(0, UNITS).map(lambda k: UNITS - k), min_size=n, max_size=n))
    healthy = draw(st.lists(st.sampled_from([True, True, True, False]), min_size=n, max_size=n))
    return tuple(GpuSpec(f * U, s, h) for f, s, h in zip(frees, shared, healthy, strict=True))


def uuid_of(index: int) -> str:
    return f"GPU-{index:08d}-7fda-b7ae-a94e-630097a14ca4"


# ------------------------------------------------------------------------- the seam ----


class Refused(Exception):
    """The kubelet or the device plugin refuses the pod on the node the extender passed."""


@dataclass
class Admitted:
    whole: tuple[int, ...]  # GPU indices the plugin handed out whole (sorted)
    groups: list[tuple[int, int]]  # (GPU index, units) per group of slices, first handed out first


@dataclass
class Node:
    """One node of ``specs``' GPUs: the agent's render, the extender, the kubelet's books and
    the device plugin's rules (``Slicer`` for the units, ``preferred`` for whole GPUs)."""

    specs: tuple[GpuSpec, ...]
    #: every device the kubelet allocated to an active pod (its books), and the PodResources
    #: list (container -> devices) the agent publishes
    allocated: set[str] = field(default_factory=set)
    listed: list[ContainerDevices] = field(default_factory=list)
    #: the pods' slices use their memory once admitted (the next reading shows it); False:
    #: busybox, only the kubelet's books show them
    uses_memory: bool = True

    def __post_init__(self) -> None:
        s = ExtenderSettings(_env_file=None)
        self.ledger = Ledger(s.settle_s, s.assume_s)
        #: when the last reading was taken (epoch s): the first at ``READ_AT``, each next one
        #: 2 s later; a pod admitted in between starts 1 s after the last
        self.read_s = READ_AT.timestamp() - 2
        self.ext = Extender(s, lambda name: self.state if name == "n" else None,
                            clock=lambda: self.read_s + 5, monotonic=lambda: 0.0,
                            ledger=self.ledger)  # fmt: skip
        self.slicer = Slicer(U, policy=s.placement_policy, clock=lambda: 0.0)
        self.free = [g.free_mib for g in self.specs]
        shared = [i for i, g in enumerate(self.specs) if g.shared]
        self.agent_settings = settings(shared_gpus=",".join(map(str, shared)))
        for i in shared:
            self.slicer.note_units(uuid_of(i), UNITS)
        self.units = {uuid_of(i): unit_ids(uuid_of(i), UNITS) for i in shared}
        self.publish()

    def read(self) -> None:
        """The live reading: the agent's (``readings``) and the plugin's (``whole_states``,
        ``shared_states``: NVML on each device's handle)."""
        self.readings = [
            gpu(i, memory_free_mib=f, memory_total_mib=TOTAL, memory_used_mib=TOTAL - f,
                remapped_rows_failure=not g.healthy)
            for i, (g, f) in enumerate(zip(self.specs, self.free, strict=True))
        ]  # fmt: skip
        states = [DeviceState(uuid_of(i), i, g.healthy, (), f)
                  for i, (g, f) in enumerate(zip(self.specs, self.free, strict=True))]  # fmt: skip
        self.whole_states = {d.id: d for d in states if not self.specs[d.index].shared}
        self.shared_states = [d for d in states if self.specs[d.index].shared]

    def publish(self) -> None:
        """A new reading (2 s after the last): the agent's render with the kubelet's
        PodResources list, parsed as the extender's Node cache parses it."""
        self.read_s += 2
        self.read()
        snap = snapshot(*self.readings, read_at=datetime.fromtimestamp(self.read_s, timezone.utc))
        by_gpu: dict[str, list[ContainerDevices]] = {}
        for h in self.listed:
            for d in h.device_ids:
                parsed = parse_unit_id(d)
                on = parsed[0] if parsed else d
                if h not in by_gpu.setdefault(on, []):
                    by_gpu[on].append(h)
        att = {uuid_of(i): GpuAttribution(uuid_of(i), holders=tuple(by_gpu.get(uuid_of(i), ())))
               for i in range(len(self.specs))}  # fmt: skip
        health, _ = evaluate(snap, self.agent_settings)
        desired = render(snap, health, self.agent_settings, attribution=att)
        self.state = parse_node("n", desired.labels, desired.annotations)

    # -------------------------------------------------------------------- the kubelet ----

    @staticmethod
    def index_of(unit: str) -> int:
        parsed = parse_unit_id(unit)
        assert parsed is not None
        return int(parsed[0][4:12])

    def healthy_free(self, resource: str) -> list[str]:
        """The kubelet's available list of ``resource``: healthy devices not allocated."""
        if resource == GPU:
            ids = [d.id for d in self.whole_states.values() if d.healthy]
        else:
            ids = [u for d in self.shared_states if d.healthy for u in self.units[d.id]]
        return [d for d in ids if d not in self.allocated]

    def fits_node(self, pod: PodSpec) -> bool:
        """kube-scheduler's NodeResourcesFit: the pod's effective request of each resource
        against the healthy devices the kubelet does not hold."""
        units = effective_request(pod.app, pod.init)
        return pod.gpus <= len(self.healthy_free(GPU)) and units <= len(self.healthy_free(SLICES))

    def admit(self, pod: PodSpec) -> Admitted:
        """The kubelet's device manager and the plugin, container by container; raises
        ``Refused``. Books nothing until the whole pod is admitted."""
        taken: set[str] = set()  # allocated to this pod so far
        pool: list[str] = []  # units left for reuse by the plain init containers
        holders: list[ContainerDevices] = []
        owner: dict[str, int] = {}  # unit -> first container (group root) that took it
        groups: dict[int, int] = {}  # group root -> GPU index
        parent: dict[int, int] = {}
        whole: list[int] = []

        def root(k: int) -> int:
            while parent[k] != k:
                k = parent[k]
            return k

        containers = [(f"i{k}", n, not side) for k, (n, side) in enumerate(pod.init)]
        containers += [(f"c{k}", n, False) for k, n in enumerate(pod.app or (0,))]
        for k, (name, n, plain) in enumerate(containers):
            parent[k] = k
            if pod.gpus and name == f"c{pod.gpu_on}":
                whole = self._whole(pod, taken)
                holders.append(ContainerDevices("ns", pod.name, name, GPU,
                                                tuple(uuid_of(i) for i in whole)))  # fmt: skip
            if not n:
                continue
            reused = pool[:n]
            pool = pool[len(reused) :]
            ids = list(reused)
            if len(ids) < n:
                free = [u for u in self.healthy_free(SLICES) if u not in taken]
                got = self.slicer.preferred(self.shared_states, reused + free, reused, n)
                extra = [u for u in got if u in free]
                if len(reused) + len(extra) < n:
                    raise Refused(f"{name}: the plugin preferred {len(got)} of {n} units")
                ids += extra[: n - len(reused)]
            try:
                on, _ = self.slicer.allocate(ids, self.shared_states)
            except SliceRefused as e:
                raise Refused(f"{name}: {e.code} {e.message}") from None
            index = next(d.index for d in self.shared_states if d.id == on)
            assert self.shared_states[[d.id for d in self.shared_states].index(on)].healthy
            for u in ids:  # the containers sharing a unit are one group of slices
                if u in owner:
                    parent[root(k)] = root(owner[u])
                else:
                    owner[u] = k
            taken.update(ids)
            if plain:
                pool += ids
            else:
                holders.append(ContainerDevices("ns", pod.name, name, SLICES, tuple(ids)))
            groups[k] = index
        out: dict[int, list[Any]] = {}
        for k in sorted(groups):  # group by root, ordered by the group's first container
            r = root(k)
            out.setdefault(r, [groups[r] if r in groups else groups[k], set()])
            if groups[k] != out[r][0]:
                raise Refused(f"a group of slices on GPUs {out[r][0]} and {groups[k]}")
        for u, k in owner.items():
            out[root(k)][1].add(u)
        self.allocated |= taken | {uuid_of(i) for i in whole}
        self.listed += holders
        admitted = Admitted(tuple(sorted(whole)),
                            [(out[r][0], len(out[r][1])) for r in sorted(out)])  # fmt: skip
        if self.uses_memory:  # its running containers (not the plain init ones) use their slices
            for h in holders:
                if h.resource_name == SLICES:
                    self.free[self.index_of(h.device_ids[0])] -= len(h.device_ids) * U
        return admitted

    def _whole(self, pod: PodSpec, taken: set[str]) -> list[int]:
        available = self.healthy_free(GPU)
        chosen = preferred(self.whole_states, available, [], pod.gpus)
        if len(chosen) < pod.gpus:
            raise Refused(f"{len(available)} whole GPUs available for {pod.gpus}")
        for u in chosen:
            s = self.whole_states[u]
            assert s.healthy and u in available
            if (s.free_mib or 0) < (pod.mib or 0):
                raise Refused(
                    f"whole GPU {s.index} has {s.free_mib} MiB free, the pod needs {pod.mib}"
                )
        return [self.whole_states[u].index for u in chosen]

    # --------------------------------------------------------------------- one pod ----

    def arrive(self, pod: PodSpec, reading: bool = True) -> str:
        """``pending`` (NodeResourcesFit or the extender), else admitted or an AssertionError
        naming the disagreement; ``reading``: a new reading follows (else the next pod is
        judged on the same one)."""
        outcome = self._arrive(pod)
        if reading:
            self.publish()
        return outcome

    def _arrive(self, pod: PodSpec) -> str:
        if not self.fits_node(pod):
            return "pending"
        doc = pod.doc()
        out = self.ext.filter({"Pod": doc, "NodeNames": ["n"]})
        if out.get("NodeNames") != ["n"]:
            return "pending"
        predicted = self.ledger.get(pod.name)
        assert predicted is not None, f"{pod}: passed with no reservation"
        slices = held_slices(pod.app, pod.init)
        want_whole = predicted.whole_gpus if slices else predicted.gpus
        want_groups = list(zip(predicted.gpus, predicted.slices, strict=True)) if slices else []
        try:
            got = self.admit(pod)
        except Refused as e:
            raise AssertionError(
                f"{pod} passed the extender (whole GPUs {want_whole}, slices {want_groups}) "
                f"and is refused: {e}") from None  # fmt: skip
        assert (tuple(sorted(want_whole)), want_groups) == (got.whole, got.groups), (
            f"{pod}: the extender predicted whole GPUs {tuple(sorted(want_whole))}, slices "
            f"(GPU, units) {want_groups}; the plugin handed out {got.whole}, {got.groups}"
        )
        started = datetime.fromtimestamp(self.read_s + 1, timezone.utc)
        bound = {
            **doc,
            "spec": {**doc["spec"], "nodeName": "n"},
            "status": {"phase": "Running", "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }
        new = placement_from_pod(bound, predicted, now=NOW)
        self.ledger.pod_changed(f"ns/{pod.name}", None, new)
        return "admitted"


Scenario = tuple[tuple[GpuSpec, ...], list[PodSpec], list[bool]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    node = draw(nodes())
    count = draw(st.integers(1, 8))
    # a reading after a third of the pods: most windows hold several
    readings = draw(st.lists(st.sampled_from([True, False, False]), min_size=count, max_size=count))
    return node, [draw(pods(f"p{k}")) for k in range(count)], readings


def run(node: Sequence[GpuSpec], arriving: Sequence[PodSpec],
        readings: Sequence[bool] = ()) -> list[str]:  # fmt: skip
    """Each pod of ``arriving`` on a fresh node of ``node``, a reading after it where
    ``readings`` says so (all when empty), noted for hypothesis."""
    seam = Node(tuple(node))
    out = []
    for k, pod in enumerate(arriving):
        reading = readings[k] if k < len(readings) else True
        note(f"{pod.name} arrives: {pod}" + ("" if reading else " (no reading after it)"))
        out.append(seam.arrive(pod, reading))
        event(f"{pod.kind}: {out[-1]}")
    event(f"pods in one window: {max(_windows(readings or [True] * len(arriving)))}")
    return out


def _windows(readings: Sequence[bool]) -> list[int]:
    """The pods judged on each reading (the lengths of the runs between readings)."""
    sizes, n = [], 0
    for reading in readings:
        n += 1
        if reading:
            sizes.append(n)
            n = 0
    return [*sizes, n]


def run_on(seam: Node, arriving: Sequence[PodSpec], readings: Sequence[bool] = ()) -> list[str]:
    return [seam.arrive(pod, readings[k] if k < len(readings) else True)
            for k, pod in enumerate(arriving)]  # fmt: skip


@hsettings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_extender_predicts_what_the_device_plugin_hands_out(scenario: Scenario) -> None:
    """Every pod the extender passes gets from the kubelet and the device plugin exactly the
    GPUs the extender reserved for it, and is admitted there, with readings after each pod or
    several pods in one window."""
    run(*scenario)


# --------------------------------------- disagreements the property found, each fixed ----


def test_a_busybox_slice_still_counts_in_the_plugin() -> None:
    """GPU 0 shared with 1 GiB free, GPU 1 whole: two 1-unit pods that never use their memory.
    The first gets GPU 0 on both sides; its slice's memory counts on both sides until a drop
    shows it (a holder in the kubelet's books shows its units, not its memory), so the second
    is refused by the extender as the plugin would refuse it. Found by the property when the
    extender took a holder as showing its slice's memory."""
    run_on(Node((GpuSpec(1 * U, True), GpuSpec(0, False)), uses_memory=False),
           [PodSpec("p0", app=(1,)), PodSpec("p1", app=(1,))])  # fmt: skip


def test_a_plain_init_container_smaller_than_its_app() -> None:
    """Shared GPUs 0 (1 GiB free) and 2 (2 GiB free), GPU 1 whole: a pod of a 1-unit plain
    init container and a 2-unit app. The plugin gives the init container GPU 0 (the least room
    that fits 1 unit), and the app, asked to include that unit, needs 2 GiB there: refused. So
    the extender places the group by its first container too (``Need.firsts``), and fails the
    node (it once reserved one 2-unit slice on GPU 2, and the pod failed admission)."""
    run_on(Node((GpuSpec(1 * U, True), GpuSpec(0, False), GpuSpec(2 * U, True))),
           [PodSpec("p0", init=((1, False),), app=(2,))])  # fmt: skip


def test_a_plain_init_container_larger_than_its_app() -> None:
    """Shared GPUs 0 (41 GiB free) and 2 (0 free), GPU 1 whole: a pod of a 40-unit plain init
    container and a 1-unit app gets GPU 0 (40 units held by the kubelet, 1 listed by its
    PodResources, 1 GiB in use). A 40-unit pod then: the kubelet has 39 of GPU 0's units left,
    and the extender counts the 39 unlisted units of the first pod there for its life
    (``inflight._unlisted``), so it refuses the second pod as the plugin would (it once saw
    78 units and reserved it). tests/scheduler/test_placement_model.py pins the same long after
    ``settle_s``."""
    run_on(Node((GpuSpec(41 * U, True), GpuSpec(0, False), GpuSpec(0, True))),
           [PodSpec("p0", init=((40, False),), app=(1,)), PodSpec("p1", app=(40,))])  # fmt: skip


# ------------------------------------------- every GPU pod counts in flight (issue 48) ----


def test_an_unannotated_gpu_pod_keeps_the_60gib_pod_after_it_off_its_gpu() -> None:
    """Whole GPUs 0 (79 GiB free) and 1 (12 GiB), shared GPU 2: a pod asking ``nvidia.com/gpu``
    alone, then a 60 GiB pod, in one window (no reading between). The plugin hands the first
    GPU 0 (the most free); the extender predicts it, so the 60 GiB pod is judged without GPU 0
    and stays Pending (before the fix the first passed unrecorded, the second was reserved on
    GPU 0 and the plugin then gave it GPU 1, 12 GiB free). Once a reading names the first pod
    the holder of GPU 0, the second still fits nowhere."""
    node = Node((GpuSpec(79 * U, False), GpuSpec(12 * U, False), GpuSpec(0, True)))
    first = PodSpec("bare", gpus=1, mib=None)
    assert run_on(node, [first, PodSpec("p60", gpus=1, mib=60 * U)], [False, True]) == [
        "admitted", "pending"]  # fmt: skip
    assert node.ledger.get("bare") is not None and node.ledger.get("bare").gpus == (0,)  # type: ignore[union-attr]
    assert run_on(node, [PodSpec("p60b", gpus=1, mib=60 * U)]) == ["pending"]


def test_unannotated_pods_of_several_gpus_and_annotated_ones_in_one_window() -> None:
    """Whole GPUs of 79 / 70 / 60 / 30 / 10 GiB free, shared GPU 5: a pod of two
    ``nvidia.com/gpu`` alone takes GPUs 0 and 1 (the most free), a 50 GiB pod then gets GPU 2,
    a third unannotated pod GPU 3, and a 20 GiB pod fits nowhere (GPU 4 has 10 GiB): all in
    one window, each predicted as the plugin hands it out."""
    node = Node((*(GpuSpec(f * U, False) for f in (79, 70, 60, 30, 10)), GpuSpec(0, True)))
    arriving = [PodSpec("two", gpus=2, mib=None), PodSpec("p50", gpus=1, mib=50 * U),
                PodSpec("one", gpus=1, mib=None), PodSpec("p20", gpus=1, mib=20 * U)]  # fmt: skip
    assert run_on(node, arriving, [False] * 4) == ["admitted"] * 3 + ["pending"]
    assert [node.ledger.get(n).gpus for n in ("two", "p50", "one")] == [(0, 1), (2,), (3,)]  # type: ignore[union-attr]
