"""Direct cases for ``core.allocation.slice_use.gpu_slices`` that the agent's tests leave open
(found by ``scripts/mutation``): a holder with no unit of the GPU holds no slice of it, and
without the name lookups' set of pods (``GpuAttribution.named_pods`` ``None``) a slice's use is
known only while every process's pod is named."""

from __future__ import annotations

from omaticaya_py.core.allocation.slice_use import SliceUse, gpu_slices
from omaticaya_py.core.model.sharing import unit_id
from omaticaya_py.core.model.snapshot import GpuProcess
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution, PodMemory

RES = "omaticaya.io/gpu-memory"
U0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
U1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
UNIT = 1024


def holder(pod: str, *units: str) -> ContainerDevices:
    return ContainerDevices("ml", pod, "server", RES, units)


def test_a_holder_of_another_gpus_units_holds_no_slice_here() -> None:
    att = GpuAttribution(
        U0,
        holders=(holder("a", unit_id(U0, 0), unit_id(U0, 1)), holder("b", unit_id(U1, 0))),
        named_pods=frozenset({("ml", "a"), ("ml", "b")}),
    )
    assert gpu_slices(att, U0, UNIT) == (SliceUse("ml", "a", "server", 2, 2 * UNIT, 0),)


def _memory(pod: str | None, mib: int, pid: int) -> PodMemory:
    container = "server" if pod is not None else None
    return PodMemory(f"uid-{pod}", f"cid-{pod}", "ml" if pod else None, pod, container, mib, (pid,))


def test_without_the_set_of_named_pods_every_process_pod_must_be_named() -> None:
    held = (holder("a", unit_id(U0, 0), unit_id(U0, 1)),)
    procs = [GpuProcess(10, 1500), GpuProcess(11, 700)]
    named = GpuAttribution(U0, holders=held, pods=(_memory("a", 1500, 10),))
    (s,) = gpu_slices(named, U0, UNIT, procs)
    assert (s.used_mib, s.processes) == (1500, ((10, 1500),))
    # a process of a pod the lookups did not name: nothing can be said of any slice here
    unnamed = GpuAttribution(U0, holders=held, pods=(_memory("a", 1500, 10), _memory(None, 700, 11)))
    (s,) = gpu_slices(unnamed, U0, UNIT, procs)
    assert (s.used_mib, s.processes) == (None, ())
