"""What other test files share of test_device_plugin_mps.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from omaticaya_py.deviceplugin.v1beta1 import api_pb2
from tests.deviceplugin.device_plugin_sharing_support import Rig
from tests.deviceplugin.device_plugin_support import folder  # noqa: F401


def health_by_gpu(rig: Rig) -> dict[int, set[tuple[str, tuple[str, ...]]]]:
    plugin = rig.set.shared_plugin
    assert plugin is not None
    out: dict[int, set[tuple[str, tuple[str, ...]]]] = {}
    for d in plugin.devices():
        out.setdefault(d.index, set()).add(("Healthy" if d.healthy else "Unhealthy", d.reasons))
    return out


def allocate(rig: Rig, ids: list[str], shared: bool = True):
    return rig.stub(shared).Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=ids)]),
        timeout=5,
    ).container_responses[0]
