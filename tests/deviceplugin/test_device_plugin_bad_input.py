# ruff: noqa: F811  (test arguments named after the imported fixtures)
"""The kubelet's calls as untrusted input (docs/bad-input.md): empty requests, unknown or
repeated device IDs, 10,000 made-up IDs, sizes larger than what is available. Each gets a clear
gRPC answer and the plugin keeps serving: the last call of every test is a good one. Over a real
gRPC channel, fed by a real Agent replaying the faults trace (see test_device_plugin.py)."""

from __future__ import annotations

import grpc
import pytest

from omaticaya_py.deviceplugin.v1beta1 import api_pb2

# the fixtures `folder` and `rig` of test_device_plugin.py, shared by import
from tests.deviceplugin.device_plugin_support import UUID, Rig, folder, rig  # noqa: F401


def allocate(rig: Rig, *requests: list[str]) -> list[dict[str, str]]:
    resp = rig.stub().Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=r) for r in requests]
        ),
        timeout=5,
    )
    return [dict(c.envs) for c in resp.container_responses]


def preferred(rig: Rig, available: list[str], size: int, must: list[str] = ()) -> list[str]:
    resp = rig.stub().GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=list(must),
                    allocation_size=size,
                )
            ]
        ),
        timeout=5,
    )
    (one,) = resp.container_responses
    return list(one.deviceIDs)


def still_serving(rig: Rig) -> None:
    assert allocate(rig, [UUID[0]]) == [{"NVIDIA_VISIBLE_DEVICES": UUID[0]}]


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ([], []),  # no container at all
        ([[]], [{}]),  # a container with no device: no variable, not an empty one
        ([[UUID[0], UUID[0], UUID[3], UUID[0]]], [{"NVIDIA_VISIBLE_DEVICES": f"{UUID[0]},{UUID[3]}"}]),
    ],
    ids=["no-containers", "no-devices", "repeated-ids"],
)
def test_odd_allocate_requests_are_answered(rig: Rig, requests, expected) -> None:
    assert allocate(rig, *requests) == expected
    still_serving(rig)


def test_ten_thousand_made_up_ids_get_a_short_refusal(rig: Rig) -> None:
    ids = [f"GPU-fake-{i}" for i in range(10_000)]
    with pytest.raises(grpc.RpcError) as err:
        allocate(rig, ids)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().endswith("and 9995 more")
    assert len(err.value.details()) < 1024
    assert rig.plugin.refusals == 1
    still_serving(rig)


def test_a_pre_start_of_unknown_devices_is_refused(rig: Rig) -> None:
    with pytest.raises(grpc.RpcError) as err:
        rig.stub().PreStartContainer(
            api_pb2.PreStartContainerRequest(devicesIDs=["GPU-nope", "x" * 10_000]), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.value.details()) < 1024
    still_serving(rig)


@pytest.mark.parametrize(
    ("available", "size", "must", "expected"),
    [
        # more than is available: every available device once, best first
        ([UUID[1], UUID[0]], 5, [], [UUID[0], UUID[1]]),
        ([UUID[0], UUID[0], UUID[0]], 2, [], [UUID[0]]),
        ([UUID[0], UUID[3]], 0, [], []),
        ([UUID[0], UUID[3]], -3, [], []),
        ([], 2, [], []),
        # devices the plugin does not know come last, after every known one
        (["GPU-nope", UUID[2], UUID[0]], 3, [], [UUID[0], UUID[2], "GPU-nope"]),
    ],
    ids=["size-over-available", "repeated", "size-0", "size-negative", "none-available", "unknown-last"],
)
def test_odd_preferred_allocation_requests(rig: Rig, available, size, must, expected) -> None:
    assert preferred(rig, available, size, must) == expected
    still_serving(rig)
