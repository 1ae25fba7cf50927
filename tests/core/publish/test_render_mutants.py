"""``core.publish.render`` cases that mutation testing (``scripts/mutation``) found no test pinned:
hysteresis of every rounded label, at the edge of its band; the utilisation and SM activity caps
at 100; the out-of-band and temperature labels at their thresholds; the shared GPUs' room; MIG
devices without a profile; the driver version's parts; the telemetry render hands on. Tables
over the pure ``assess`` + ``render``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from omaticaya_py.core.model.sharing import unit_id
from omaticaya_py.core.model.snapshot import GpuReading, MigReading, NodeSnapshot
from omaticaya_py.core.publish.render import driver_version_parts, render
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.rules.health import assess
from tests.helpers import PREFIX, gpu, settings, snapshot

UUID0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"  # tests.helpers.gpu(0)'s
UUID1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"


def mig(index: int, free_mib: int = 9000, profile: str | None = "1g.10gb") -> MigReading:
    return MigReading(
        index=index,
        uuid=f"MIG-{index:08d}-0000-0000-0000-000000000000",
        profile=profile,
        memory_total_mib=9984,
        memory_used_mib=9984 - free_mib,
        memory_free_mib=free_mib,
        process_count=0,
    )


def mig_gpu(index: int, *migs: MigReading) -> GpuReading:
    return gpu(index, utilization_pct=None, mig_enabled=True, mig_devices=migs)


def labels(
    snap: NodeSnapshot,
    previous: dict[str, str] | None = None,
    attribution: dict[str, GpuAttribution] | None = None,
    **overrides: Any,
) -> dict[str, str]:
    """The short-named labels render gives (``previous`` in short names too)."""
    s = settings(**overrides)
    prev = {f"{PREFIX}/{k}": v for k, v in (previous or {}).items()}
    desired = render(snap, assess(snap), s, prev, with_telemetry=False, attribution=attribution)
    assert desired.dropped == ()
    return {k.removeprefix(f"{PREFIX}/"): v for k, v in desired.labels.items()}


# --- hysteresis, label by label, at the band's edge ----------------------------------------------
# Memory (step 1024 MiB, hysteresis 20 %: a margin of 204.8 MiB): the label was 4096 and the
# reading is past the next edge (5120); it rises only once 204.8 past it. Utilisation (step 10,
# margin 2) and temperature (step 5, margin 1): the label keeps its value while the reading
# stays within half a step plus the margin of it.

EDGE = 5120
HOLD, RISE = EDGE + 204, EDGE + 205  # 204 < 204.8 <= 205

MEMORY_LABELS: list[tuple[str, Callable[[int], NodeSnapshot], dict[str, Any], str]] = [
    ("node free", lambda raw: snapshot(gpu(0, raw)), {}, "gpu.memory.free-mib"),
    ("node free total", lambda raw: snapshot(gpu(0, raw)), {}, "gpu.memory.free-total-mib"),
    ("per-GPU free", lambda raw: snapshot(gpu(0, raw)), {}, "gpu-0.memory.free-mib"),
    ("shared GPU's room", lambda raw: snapshot(gpu(0, raw)), {"shared_gpus": "all"},
     "gpu.shared.memory.free-mib"),
    ("MIG GPU's free (its freest device)", lambda raw: snapshot(mig_gpu(0, mig(0, raw), mig(1, 100))),
     {}, "gpu-0.memory.free-mib"),
    ("MIG profile's free", lambda raw: snapshot(mig_gpu(0, mig(0, raw), mig(1, 100))), {},
     "mig-1g.10gb.memory.free-mib"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "overrides", "name"), [c[1:] for c in MEMORY_LABELS], ids=[c[0] for c in MEMORY_LABELS]
)
def test_a_memory_label_rises_only_past_the_band(make, overrides, name) -> None:
    assert labels(make(HOLD), **overrides)[name] == str(EDGE)  # no previous: no hysteresis
    assert labels(make(HOLD), {name: "4096"}, **overrides)[name] == "4096"
    assert labels(make(RISE), {name: "4096"}, **overrides)[name] == str(EDGE)
    # a drop is published at once, however small
    assert labels(make(4095), {name: "4096"}, **overrides)[name] == "3072"


NEAREST_LABELS: list[tuple[str, Callable[[float], NodeSnapshot], dict[str, Any], str]] = [
    ("node utilisation", lambda raw: snapshot(gpu(0, utilization_pct=raw)), {}, "gpu.utilization-pct"),
    ("per-GPU utilisation", lambda raw: snapshot(gpu(0, utilization_pct=raw)), {}, "gpu-0.utilization-pct"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "overrides", "name"), [c[1:] for c in NEAREST_LABELS], ids=[c[0] for c in NEAREST_LABELS]
)
def test_a_utilisation_label_keeps_its_value_within_the_band(make, overrides, name) -> None:
    assert labels(make(56.99))[name] == "60"  # no previous: rounded to nearest
    assert labels(make(56.99), {name: "50"})[name] == "50"  # 6.99 < 5 + 2
    assert labels(make(57.0), {name: "50"})[name] == "60"  # 7 = 5 + 2: out of the band
    assert labels(make(43.01), {name: "50"})[name] == "50"
    assert labels(make(43.0), {name: "50"})[name] == "40"


def test_the_temperature_label_keeps_its_value_within_the_band() -> None:
    def temp(c: int, previous: dict[str, str] | None = None) -> str:
        return labels(snapshot(gpu(0, temperature_c=c)), previous, temperature_labels=True)[
            "gpu-0.temperature-c"
        ]

    assert temp(43) == "45"
    assert temp(43, {"gpu-0.temperature-c": "40"}) == "40"  # 3 < 2.5 + 1
    assert temp(44, {"gpu-0.temperature-c": "40"}) == "45"


# --- thresholds ---------------------------------------------------------------------------------


def test_utilisation_above_100_is_published_as_100() -> None:
    got = labels(snapshot(gpu(0, utilization_pct=100.6)), utilization_step_pct=1)
    assert (got["gpu.utilization-pct"], got["gpu-0.utilization-pct"]) == ("100", "100")


def test_sm_activity_above_100_is_published_as_100() -> None:
    got = labels(snapshot(gpu(0, sm_active_pct=100.6)), utilization_step_pct=1)
    assert (got["gpu.sm-active-pct"], got["gpu-0.sm-active-pct"]) == ("100", "100")


@pytest.mark.parametrize(
    ("celsius", "expected"), [(0, "0"), (1, "0"), (3, "5"), (-1, None), (None, None)]
)
def test_the_temperature_label_from_zero_up(celsius, expected) -> None:
    got = labels(snapshot(gpu(0, temperature_c=celsius)), temperature_labels=True)
    assert got.get("gpu-0.temperature-c") == expected
    assert "gpu-0.temperature-c" not in labels(snapshot(gpu(0, temperature_c=celsius)))


def _oob(mib: int) -> dict[str, GpuAttribution]:
    return {UUID0: GpuAttribution(UUID0, out_of_band_memory_mib=mib, out_of_band_pids=(7,))}


@pytest.mark.parametrize(
    ("mib", "step", "expected"),
    [(500, 1024, None), (1023, 1024, None), (1024, 1024, "1024"), (2500, 1024, "2048"), (1, 1, "1"),
     (0, 1, None)],
)  # fmt: skip
def test_out_of_band_memory_is_labelled_once_it_fills_a_step(mib, step, expected) -> None:
    got = labels(snapshot(gpu(0)), attribution=_oob(mib), memory_step_mib=step)
    assert got.get("gpu-0.memory.out-of-band-mib") == expected


def test_compute_capability_needs_both_parts() -> None:
    got = labels(snapshot(gpu(0, compute_minor=None)))
    assert "gpu.compute.major" not in got and "gpu.compute.minor" not in got
    got = labels(snapshot(gpu(0, compute_major=None)))
    assert "gpu.compute.major" not in got and "gpu.compute.minor" not in got


# --- the shared GPUs' room ----------------------------------------------------------------------


def _holding(uuid: str, units: int) -> dict[str, GpuAttribution]:
    ids = tuple(unit_id(uuid, k) for k in range(units))
    holder = ContainerDevices("ml", "a", "main", "omaticaya.io/gpu-memory", ids)
    return {uuid: GpuAttribution(uuid, holders=(holder,))}


SHARED_CASES: list[tuple[str, tuple[GpuReading, ...], str, dict[str, GpuAttribution] | None, str]] = [
    ("the freest shared GPU", (gpu(0, 20_000), gpu(1, 40_000)), "all", None, "39936"),
    ("an unshared GPU's memory does not count", (gpu(0, 80_000), gpu(1, 20_000)), "1", None, "19456"),
    ("a lost shared GPU does not count",
     (gpu(0, 20_000), gpu(1, 40_000, error="NVMLError_Unknown")), "all", None, "19456"),
    ("an unhealthy shared GPU does not count",
     (gpu(0, 20_000), gpu(1, 40_000, ecc_uncorrected_volatile=1)), "all", None, "19456"),
    ("no shared GPU healthy: 0",
     (gpu(0, 20_000, ecc_uncorrected_volatile=1),), "all", None, "0"),
    ("units held by containers are no room (79 units, 70 held: 9 GiB)",
     (gpu(0, 40_000),), "all", _holding(UUID0, 70), "9216"),
    ("units held on another GPU do not count here",
     (gpu(0, 40_000),), "all", _holding(UUID1, 70), "39936"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gpus", "shared", "attribution", "expected"),
    [c[1:] for c in SHARED_CASES],
    ids=[c[0] for c in SHARED_CASES],
)
def test_the_shared_gpus_room(gpus, shared, attribution, expected) -> None:
    got = labels(snapshot(*gpus), attribution=attribution, shared_gpus=shared)
    assert got["gpu.shared.memory.free-mib"] == expected
    # and the label is the room itself, not an aggregate's: none without sharing
    assert "gpu.shared.memory.free-mib" not in labels(snapshot(*gpus), attribution=attribution)


# --- MIG labels ---------------------------------------------------------------------------------


def test_a_mig_device_without_a_profile_is_in_no_profiles_labels() -> None:
    got = labels(snapshot(mig_gpu(0, mig(0, 5000), mig(1, 9000, profile=None))))
    assert got["mig-1g.10gb.count"] == "1"
    assert got["mig-1g.10gb.memory.free-mib"] == "4096"
    assert not [k for k in got if k.startswith("mig-") and "1g.10gb" not in k and k != "mig.strategy"]


# --- versions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("580.65.06", ("580", "65", "06")),
        ("580.65", ("580", "65", "")),
        ("580", None),
        ("1.2.3.4", None),
        ("", None),
        (None, None),
    ],
)
def test_driver_version_parts(version, expected) -> None:
    assert driver_version_parts(version) == expected


def test_a_driver_version_that_is_not_x_y_z_gives_no_driver_labels() -> None:
    got = labels(snapshot(gpu(0), driver="unknown"))
    assert not [k for k in got if k.startswith("cuda.driver-version.")]
    assert got["cuda.runtime-version.full"] == "13.0"
    got = labels(snapshot(gpu(0), driver="580.65"))
    assert {k: v for k, v in got.items() if k.startswith("cuda.driver-version.")} == {
        "cuda.driver-version.major": "580",
        "cuda.driver-version.minor": "65",
        "cuda.driver-version.full": "580.65",
    }


# --- the telemetry annotation -------------------------------------------------------------------


def test_without_telemetry_no_annotation() -> None:
    snap = snapshot(gpu(0))
    desired = render(snap, assess(snap), settings(), with_telemetry=False)
    assert desired.annotations == {}


def test_render_hands_the_attribution_and_sharing_to_the_telemetry() -> None:
    snap = snapshot(gpu(0, 40_000), gpu(1))
    holders = _holding(UUID0, 3)[UUID0].holders
    attribution = {
        UUID0: GpuAttribution(UUID0, holders=holders, out_of_band_memory_mib=2048, out_of_band_pids=(7,))
    }

    def gpu0(**overrides: Any) -> dict[str, Any]:
        s = settings(**overrides)
        annotations = render(snap, assess(snap), s, attribution=attribution).annotations
        return json.loads(annotations[f"{PREFIX}/telemetry"])["gpus"][0]

    shared = gpu0(shared_gpus="0")
    assert shared["memory_out_of_band_mib"] == 2048
    assert shared["pods"] == [
        {"namespace": "ml", "pod": "a", "container": "main", "limit_mib": 3072, "memory_used_mib": 0}
    ]
    assert (shared["shared"], shared["share_units"]) == (True, 79)  # 81559 // 1024
    whole = gpu0()
    assert whole["pods"] == [{"namespace": "ml", "pod": "a", "container": "main", "memory_used_mib": 0}]
    assert "shared" not in whole and "share_units" not in whole
