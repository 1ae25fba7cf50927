"""``core.publish.dra`` cases that mutation testing (``scripts/mutation``) found no test pinned:
the whole ResourceSlice body, what ``strip_server_fields`` keeps of what the API server holds,
and the claim holders of a node whose list or GPUs do not start with ours (a lost GPU, a GPU
without a UUID, another resource's entry first)."""

from __future__ import annotations

from typing import Any

import pytest

from omaticaya_py.core.model.sharing import Sharing
from omaticaya_py.core.publish.dra import (
    API_VERSION,
    DRIVER,
    claim_holders,
    device_name,
    slice_body,
    slice_name,
    strip_server_fields,
)
from omaticaya_py.core.rules.attribution import ContainerDevices
from tests.helpers import gpu, lost, snapshot

NODE = "node-a"
UUID0, UUID1, UUID2 = (f"GPU-0000000{i}-7fda-b7ae-a94e-630097a14ca4" for i in range(3))


def test_the_whole_slice_body() -> None:
    devices = [{"name": "gpu-a", "attributes": {}}]
    assert slice_body(NODE, "uid-1", devices, generation=3) == {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(NODE),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1",
                                 "controller": True}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 1},
            "devices": devices,
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("devices", "kept"),
    [
        ([{"name": "a"}, "b", 3, None, {"name": "c"}], [{"name": "a"}, {"name": "c"}]),
        ([], []),
        (None, []),
        ({"name": "a"}, []),
        ("devices", []),
    ],
    ids=["objects-only", "empty", "none", "an-object", "a-string"],
)
def test_strip_server_fields(devices: Any, kept: list[dict[str, Any]]) -> None:
    assert strip_server_fields(devices) == kept


def _held(*names: str) -> ContainerDevices:
    """A container holding our devices ``names`` on ``NODE``, as PodResources lists it."""
    return ContainerDevices("ns", "p", "c", DRIVER, tuple(f"{NODE}/{n}" for n in names))


def _holder(*uuids: str) -> ContainerDevices:
    """The same container as the attribution takes it: the devices' UUIDs."""
    return ContainerDevices("ns", "p", "c", DRIVER, uuids)


def test_claim_holders_go_on_past_a_lost_gpu_and_another_resource() -> None:
    snap = snapshot(lost(0), gpu(1), gpu(2))
    listed = [ContainerDevices("ns", "q", "c", "nvidia.com/gpu", (UUID1,)), _held(device_name(UUID2))]
    assert claim_holders(listed, NODE, snap, Sharing()) == ([_holder(UUID2)], 0)


@pytest.mark.parametrize(
    ("reading", "name"),
    [
        (lost(0), device_name(UUID0)),  # lost: its devices are not in the reading
        (gpu(0, uuid=None), device_name(None, gpu_index=0)),  # no UUID: no device to name
    ],
    ids=["lost", "no-uuid"],
)
def test_a_gpu_lost_or_without_a_uuid_holds_no_claim(reading, name) -> None:
    snap = snapshot(reading, gpu(1))
    listed = [_held(name, device_name(UUID1))]
    assert claim_holders(listed, NODE, snap, Sharing()) == ([_holder(UUID1)], 1)
