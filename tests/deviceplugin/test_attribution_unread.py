"""A GPU read with an error keeps its slices (issue 38, fault 6).

One tick with a shared GPU unreadable used to forget every slice on it for good: the agent's
attribution dropped the holders of a GPU read with an error (its processes are not known), so
the kubelet's list the device plugin judges by (``Agent.last_listed``, from those holders) did
not name its units, and the plugin's book released them (``slices.released``). Now the holders
of an unread GPU stay in the attribution (``read`` False, its use unknown), and the plugin keeps
the slices of a GPU whose free memory it does not know whatever the list says.
"""

from __future__ import annotations

from omaticaya_py.agent.attribution_reader import Attribution, unread_devices
from omaticaya_py.core.allocation.slice_use import SliceUse, gpu_slices
from omaticaya_py.core.model.snapshot import GpuProcess
from omaticaya_py.core.rules.attribution import (
    ContainerDevices,
    attribute,
    holder_memory_mib,
    out_of_band_mib,
)
from omaticaya_py.deviceplugin.allocation import DeviceState
from omaticaya_py.deviceplugin.slicer import KubeletView, Slicer
from tests.helpers import gpu, snapshot

MIB = 1024
READ, LOST = gpu(0), gpu(1, error="NVMLError_Unknown")
UUID0, UUID1 = READ.uuid or "", LOST.uuid or ""


def slice_on(uuid: str, n: int, pod: str = "p") -> ContainerDevices:
    return ContainerDevices("ml", pod, "app", "omaticaya.io/gpu-memory",
                            tuple(f"{uuid}::{k}" for k in range(n)))  # fmt: skip


def test_attribute_keeps_the_holders_of_a_device_not_read() -> None:
    held = [slice_on(UUID0, 4, "a"), slice_on(UUID1, 20, "b")]
    out = attribute({UUID0: (GpuProcess(7, 100),)}, {7: None}, held, unread=[UUID1])
    assert list(out) == [UUID0, UUID1]
    assert out[UUID1].holders == (held[1],) and not out[UUID1].read
    assert out[UUID0].read and out[UUID0].out_of_band_memory_mib == 100
    # what cannot be said of a device not read: its holder's use, its out-of-band memory
    assert holder_memory_mib(out[UUID1]) is None
    assert out_of_band_mib(out[UUID1]) is None
    assert gpu_slices(out[UUID1], UUID1, MIB) == (SliceUse("ml", "b", "app", 20, 20 * MIB, None),)
    # a device read with its processes is not made unread by being named twice
    assert attribute({UUID0: ()}, {}, held, unread=[UUID0])[UUID0].read


class _Client:
    def __init__(self, held: list[ContainerDevices]) -> None:
        self.held = held

    def list(self) -> list[ContainerDevices]:
        return self.held

    def close(self) -> None:
        pass


def test_the_agents_attribution_keeps_the_slices_of_a_gpu_read_with_an_error(tmp_path) -> None:
    held = [slice_on(UUID0, 4, "a"), slice_on(UUID1, 20, "b")]
    edge = Attribution(tmp_path / "kubelet.sock", None, client_factory=lambda _: _Client(held))
    snap = snapshot(READ, LOST)
    assert unread_devices(snap) == [UUID1]
    out = edge.observe(snap)
    assert out[UUID1].holders == (held[1],)
    # what the device plugin judges slices by (``Agent.last_listed``) still names its units
    listed = {d for a in out.values() for h in a.holders for d in h.device_ids}
    assert set(held[1].device_ids) <= listed


def test_the_plugins_book_keeps_the_slices_of_a_gpu_it_cannot_read() -> None:
    """The kubelet's list does not name the slice's units (it was asked for after the slice's
    Allocate), but the GPU's reading failed this tick: the slice is not taken as released."""
    listed = (frozenset[str](), 600.0)
    slicer = Slicer(MIB, settle_s=60, clock=lambda: 100.0,
                    kubelet=KubeletView(lambda: listed, lambda: 500.0))  # fmt: skip
    slicer.allocate([f"{UUID1}::{k}" for k in range(20)], [DeviceState(UUID1, 1, True, (), 80 * MIB)])
    unread = DeviceState(UUID1, 1, False, ("NVMLError_Unknown",), None)
    assert slicer.pending_mib([unread]) == {UUID1: 20 * MIB}
    assert UUID1 in slicer.slices
    # read again and still not listed: released then
    assert slicer.pending_mib([DeviceState(UUID1, 1, True, (), 80 * MIB)]) == {UUID1: 0}
    assert UUID1 not in slicer.slices
