"""``core.publish.slice_device`` cases that mutation testing (``scripts/mutation``) found no test
pinned: a whole GPU's device as a whole (its architecture, driver and CUDA versions, no MIG
parent), facts NVML did not give or gave too long, the versions' forms, a taint whose reason
sanitises to nothing, ``render_devices``' default effect and a sharing unit of 1 MiB."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.model.sharing import Sharing
from omaticaya_py.core.model.snapshot import NodeSnapshot
from omaticaya_py.core.publish.dra import TAINT_UNHEALTHY, DraDevice, device_name, inventory
from omaticaya_py.core.publish.slice_device import (
    DeviceTaint,
    SliceDevice,
    TaintRule,
    render_devices,
    slice_devices,
)
from omaticaya_py.core.rules.health import assess
from tests.helpers import H100, H100_TOTAL_MIB, gpu, settings, snapshot

UUID0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"  # tests.helpers.gpu(0)'s


def _devices(snap: NodeSnapshot) -> list[SliceDevice]:
    sharing = Sharing.of(settings())
    return slice_devices(inventory(snap, assess(snap), sharing, 1024, 10), snap)


def test_a_whole_gpus_device() -> None:
    assert _devices(snapshot(gpu(0))) == [
        SliceDevice(
            name=device_name(UUID0), device_type="gpu", shared=False, gpu_index=0, uuid=UUID0,
            product=H100, architecture="hopper", compute_capability="9.0.0",
            driver_version="580.159.4", cuda_driver_version="13.0.0", free_memory_mib=80_896,
            memory_mib=H100_TOTAL_MIB,
        )
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("reading", "expected"),
    [
        ({"product": None, "architecture": None}, {"product": None, "architecture": None}),
        ({"product": "", "architecture": ""}, {"product": None, "architecture": None}),
        ({"product": "P" * 70, "architecture": "a" * 65}, {"product": "P" * 64, "architecture": "a" * 64}),
        ({"compute_major": None}, {"compute_capability": None}),
        ({"compute_minor": None}, {"compute_capability": None}),
    ],
    ids=["not-given", "empty", "cut-at-64", "no-major", "no-minor"],
)  # fmt: skip
def test_facts_not_given_or_too_long(reading: dict[str, Any], expected: dict[str, Any]) -> None:
    [d] = _devices(snapshot(gpu(0, **reading)))
    assert {k: getattr(d, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("driver", "version"),
    [("580", "580.0.0"), ("580.65", "580.65.0"), ("580.65.06", "580.65.6"), ("1.2.3.4", None),
     ("580.65.beta", None), ("beta", None), ("", None)],
)  # fmt: skip
def test_the_driver_version_as_a_semantic_version(driver: str, version: str | None) -> None:
    [d] = _devices(snapshot(gpu(0), driver=driver))
    assert d.driver_version == version


def test_a_reason_that_sanitises_to_nothing_taints_as_unknown() -> None:
    d = DraDevice(name="gpu-x", gpu_index=0, mig_index=None, uuid="GPU-x", gpu_uuid="GPU-x",
                  profile=None, shared=True, memory_total_mib=1024, free_memory_mib=0)  # fmt: skip
    assert TaintRule().taints(replace(d, reasons=("!!!",))) == (
        DeviceTaint(TAINT_UNHEALTHY, "unknown", "NoSchedule"),
    )
    assert TaintRule(mps_down={"GPU-x": "***"}).taints(d)[0].value == "unknown"


def test_render_devices_taints_no_schedule_by_default() -> None:
    snap = snapshot(gpu(0, ecc_uncorrected_volatile=1))
    devices = inventory(snap, assess(snap), Sharing.of(settings()), 1024, 10)
    assert render_devices(devices, snap)[0]["taints"] == [
        {"key": TAINT_UNHEALTHY, "value": "ecc-dbe", "effect": "NoSchedule"}
    ]


def test_a_sharing_unit_of_one_mib_has_its_request_policy() -> None:
    memory = SliceDevice("gpu-a", "gpu", True, 0, memory_mib=100, unit_mib=1).render()["capacity"]
    assert memory == {"memory": {"value": "100Mi", "requestPolicy": {
        "default": "1Mi", "validRange": {"min": "1Mi", "step": "1Mi"}}}}  # fmt: skip
