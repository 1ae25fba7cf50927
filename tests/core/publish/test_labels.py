"""Render: (snapshot, settings) -> the whole label map; key/value validation; telemetry JSON."""

from __future__ import annotations

import json
import re

import pytest

from omaticaya_py import __version__
from omaticaya_py.core.publish.render import (
    TELEMETRY,
    is_static,
    is_valid_key,
    is_valid_value,
    quantise_down,
    quantise_nearest,
    sanitise_value,
)
from omaticaya_py.core.schema import TELEMETRY_VERSION
from tests.helpers import (
    H100_LABEL,
    VERSIONS,
    evaluate,
    gpu,
    h100_static,
    lost,
    prefixed,
    rendered_labels,
    settings,
    snapshot,
    xid,
)

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")

EIGHT = [
    # index, free MiB, utilisation %, processes, temperature C
    (0, 81079, 0.0, 0, 40),
    (1, 60599, 45.0, 1, 55),
    (2, 19639, 100.0, 1, 70),
    (3, 81079, 3.0, 0, 41),
    (4, 40000, 4.9, 1, 45),
    (5, 81079, 5.0, 0, 42),
    (6, 1000, 96.0, 2, 75),
    (7, 72000, 14.9, 1, 50),
]

A100 = dict(
    product="NVIDIA A100-SXM4-40GB",
    architecture="ampere",
    compute_major=8,
    compute_minor=0,
    memory_total_mib=40960,
)

RENDER_CASES = [
    # (id, snapshot, settings overrides, expected short-name labels under omaticaya.io/, or full map)
    (
        "one-healthy-h100",
        snapshot(gpu(0)),
        {"temperature_labels": True},
        {
            **h100_static(1),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "80896",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "80896",
            "gpu-0.utilization-pct": "0",
            "gpu-0.temperature-c": "40",
        },
    ),
    (
        "eight-gpus-mixed-load",
        snapshot(
            *(
                gpu(i, memory_free_mib=f, utilization_pct=u, process_count=p, temperature_c=t)
                for i, f, u, p, t in EIGHT
            )
        ),
        {"temperature_labels": True},
        {
            **h100_static(8),
            "gpu.memory.free-mib": "80896",  # max 81079, down to 1024
            "gpu.memory.free-total-mib": "436224",  # sum 436475, down to 1024
            "gpu.utilization-pct": "0",  # min 0.0
            "gpu.idle-count": "2",  # GPU 0 and 3; 4 has a process, 5 is not under 5 %
            "gpu.healthy-count": "8",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "80896",
            "gpu-0.utilization-pct": "0",
            "gpu-0.temperature-c": "40",
            "gpu-1.health": "Healthy",
            "gpu-1.memory.free-mib": "60416",
            "gpu-1.utilization-pct": "50",
            "gpu-1.temperature-c": "55",
            "gpu-2.health": "Healthy",
            "gpu-2.memory.free-mib": "19456",
            "gpu-2.utilization-pct": "100",
            "gpu-2.temperature-c": "70",
            "gpu-3.health": "Healthy",
            "gpu-3.memory.free-mib": "80896",
            "gpu-3.utilization-pct": "0",
            "gpu-3.temperature-c": "40",
            "gpu-4.health": "Healthy",
            "gpu-4.memory.free-mib": "39936",
            "gpu-4.utilization-pct": "0",
            "gpu-4.temperature-c": "45",
            "gpu-5.health": "Healthy",
            "gpu-5.memory.free-mib": "80896",
            "gpu-5.utilization-pct": "10",
            "gpu-5.temperature-c": "40",
            "gpu-6.health": "Healthy",
            "gpu-6.memory.free-mib": "0",
            "gpu-6.utilization-pct": "100",
            "gpu-6.temperature-c": "75",
            "gpu-7.health": "Healthy",
            "gpu-7.memory.free-mib": "71680",
            "gpu-7.utilization-pct": "10",
            "gpu-7.temperature-c": "50",
        },
    ),
    (
        "utilization-min-rounds-half-up",
        snapshot(gpu(0, utilization_pct=45.0, process_count=1), gpu(1, utilization_pct=80.0, process_count=1)),
        {"per_gpu_labels": False},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "161792",  # 162158 down to 1024
            "gpu.utilization-pct": "50",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "2",
            "gpu.health": "Healthy",
        },
    ),
    (
        "utilization-min-rounds-down-under-half",
        snapshot(gpu(0, utilization_pct=44.9, process_count=1), gpu(1, utilization_pct=80.0, process_count=1)),
        {"per_gpu_labels": False},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "161792",
            "gpu.utilization-pct": "40",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "2",
            "gpu.health": "Healthy",
        },
    ),
    (
        "unhealthy-gpu-excluded-from-aggregates",
        snapshot(
            gpu(0, memory_free_mib=30000, utilization_pct=50.0, process_count=1),
            gpu(1, ecc_uncorrected_volatile=1),  # idle and most free, but a DBE
        ),
        {"temperature_labels": True},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "29696",
            "gpu.memory.free-total-mib": "29696",
            "gpu.utilization-pct": "50",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "1",
            "gpu.health": "Degraded",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "29696",
            "gpu-0.utilization-pct": "50",
            "gpu-0.temperature-c": "40",
            "gpu-1.health": "Unhealthy",
            "gpu-1.memory.free-mib": "80896",
            "gpu-1.utilization-pct": "0",
            "gpu-1.temperature-c": "40",
        },
    ),
    (
        "lost-gpu-only-health",
        snapshot(gpu(0, memory_free_mib=50000, utilization_pct=20.0, process_count=1), lost(1)),
        {"temperature_labels": True},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "49152",
            "gpu.memory.free-total-mib": "49152",
            "gpu.utilization-pct": "20",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "1",
            "gpu.health": "Degraded",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "49152",
            "gpu-0.utilization-pct": "20",
            "gpu-0.temperature-c": "40",
            "gpu-1.health": "Unhealthy",
        },
    ),
    (
        "xid-79-excludes-gpu",
        snapshot(gpu(0), gpu(1, memory_free_mib=20000, utilization_pct=90.0, process_count=1), xid_events=[xid(0, 79)]),
        {"per_gpu_labels": False},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "19456",
            "gpu.memory.free-total-mib": "19456",
            "gpu.utilization-pct": "90",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "1",
            "gpu.health": "Degraded",
        },
    ),
    (
        "all-gpus-unhealthy",
        snapshot(lost(0), gpu(1, remapped_rows_pending=True, utilization_pct=30.0)),
        {"temperature_labels": True},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "0",
            "gpu.memory.free-total-mib": "0",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "0",
            "gpu.health": "Unhealthy",
            "gpu-0.health": "Unhealthy",
            "gpu-1.health": "Unhealthy",
            "gpu-1.memory.free-mib": "80896",
            "gpu-1.utilization-pct": "30",
            "gpu-1.temperature-c": "40",
        },
    ),
    (
        "nvml-library-error",
        snapshot(gpu(0), error="NVMLError_DriverNotLoaded"),
        {},
        {"gpu.health": "Unknown"},
    ),
    (
        "no-gpus",
        snapshot(),
        {},
        {
            "gpu.count": "0",
            **VERSIONS,
            "gpu.memory.free-mib": "0",
            "gpu.memory.free-total-mib": "0",
            "gpu.idle-count": "0",
            "gpu.healthy-count": "0",
            "gpu.health": "Unknown",
        },
    ),
    (
        "mixed-products",
        snapshot(gpu(0), gpu(1, memory_free_mib=40000, **A100), gpu(2)),
        {"per_gpu_labels": False},
        {
            **h100_static(3, total=40960),  # the most common product; smallest GPU's memory
            "gpu.product.mixed": "true",
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "201728",  # 202158 down to 1024
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "3",
            "gpu.healthy-count": "3",
            "gpu.health": "Healthy",
        },
    ),
    (
        "not-supported-fields-absent",
        snapshot(gpu(0, utilization_pct=None, temperature_c=None, process_count=None, power_w=None)),
        {},
        {
            **h100_static(1),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "80896",
            "gpu.idle-count": "0",  # utilisation unknown: not counted idle
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "80896",
        },
    ),
    (
        "no-cuda-version-no-static-facts",
        snapshot(
            gpu(0, product=None, architecture=None, compute_major=None, memory_total_mib=None),
            cuda=None,
            driver=None,
        ),
        {"per_gpu_labels": False},
        {
            "gpu.count": "1",
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "80896",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
        },
    ),
    (
        "per-gpu-labels-off",
        snapshot(gpu(0), gpu(1, utilization_pct=70.0, process_count=1)),
        {"per_gpu_labels": False},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "161792",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "2",
            "gpu.health": "Healthy",
        },
    ),
    (
        "custom-prefix",
        snapshot(gpu(0)),
        {"prefix": "gpu.example.com", "temperature_labels": True},
        prefixed(
            {
                **h100_static(1),
                "gpu.memory.free-mib": "80896",
                "gpu.memory.free-total-mib": "80896",
                "gpu.utilization-pct": "0",
                "gpu.idle-count": "1",
                "gpu.healthy-count": "1",
                "gpu.health": "Healthy",
                "gpu-0.health": "Healthy",
                "gpu-0.memory.free-mib": "80896",
                "gpu-0.utilization-pct": "0",
                "gpu-0.temperature-c": "40",
            },
            "gpu.example.com",
        ),
    ),
    (
        "custom-steps",
        snapshot(
            gpu(0, memory_free_mib=50000, utilization_pct=37.4, process_count=1),
            gpu(1, memory_free_mib=70000, utilization_pct=62.5, process_count=1),
        ),
        {"memory_step_mib": 4096, "utilization_step_pct": 25, "temperature_labels": True},
        {
            **h100_static(2),
            "gpu.memory.free-mib": "69632",  # 70000 down to 4096
            "gpu.memory.free-total-mib": "118784",  # 120000 down to 4096
            "gpu.utilization-pct": "25",  # 37.4 to the nearest 25
            "gpu.idle-count": "0",
            "gpu.healthy-count": "2",
            "gpu.health": "Healthy",
            "gpu-0.health": "Healthy",
            "gpu-0.memory.free-mib": "49152",
            "gpu-0.utilization-pct": "25",
            "gpu-0.temperature-c": "40",
            "gpu-1.health": "Healthy",
            "gpu-1.memory.free-mib": "69632",
            "gpu-1.utilization-pct": "75",  # 62.5 half up
            "gpu-1.temperature-c": "40",
        },
    ),
    (
        "memory-step-1-exact",
        snapshot(gpu(0, memory_free_mib=12345)),
        {"memory_step_mib": 1, "utilization_step_pct": 1, "per_gpu_labels": False},
        {
            **h100_static(1),
            "gpu.memory.free-mib": "12345",
            "gpu.memory.free-total-mib": "12345",
            "gpu.utilization-pct": "0",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "1",
            "gpu.health": "Healthy",
        },
    ),
    (
        "idle-threshold",
        snapshot(
            gpu(0, utilization_pct=8.0, process_count=0),
            gpu(1, utilization_pct=8.0, process_count=1),
            gpu(2, utilization_pct=None, process_count=0),
        ),
        {"idle_utilization_pct": 10, "per_gpu_labels": False},
        {
            **h100_static(3),
            "gpu.memory.free-mib": "80896",
            "gpu.memory.free-total-mib": "242688",  # 243237 down to 1024
            "gpu.utilization-pct": "10",
            "gpu.idle-count": "1",
            "gpu.healthy-count": "3",
            "gpu.health": "Healthy",
        },
    ),
]


@pytest.mark.parametrize(("name", "snap", "overrides", "expected"), RENDER_CASES, ids=[c[0] for c in RENDER_CASES])
def test_render_whole_label_map(name, snap, overrides, expected) -> None:
    s = settings(**overrides)
    _, desired = evaluate(snap, s)
    if not all(k.startswith(s.prefix + "/") for k in expected):
        expected = prefixed(expected, s.prefix)
    assert desired.labels == expected
    assert desired.dropped == ()
    assert list(desired.annotations) == [f"{s.prefix}/{TELEMETRY}"]


TEMPERATURE_CASES = [
    # (id, settings overrides, gpu-0.temperature-c expected, or None: absent)
    ("off-by-default", {}, None),
    ("on", {"temperature_labels": True}, "40"),
    ("on-with-its-step", {"temperature_labels": True, "temperature_step_c": 4}, "40"),
    ("on-but-per-gpu-labels-off", {"temperature_labels": True, "per_gpu_labels": False}, None),
    ("off-explicitly", {"temperature_labels": False}, None),
]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [c[1:] for c in TEMPERATURE_CASES],
    ids=[c[0] for c in TEMPERATURE_CASES],
)
def test_temperature_label_only_when_asked(overrides, expected) -> None:
    """gpu-N.temperature-c is opt-in; the telemetry annotation carries temperature either way."""
    s = settings(**overrides)
    _, desired = evaluate(snapshot(gpu(0, temperature_c=41)), s)
    assert desired.labels.get("omaticaya.io/gpu-0.temperature-c") == expected
    assert desired.labels["omaticaya.io/gpu.health"] == "Healthy"
    doc = json.loads(desired.annotations[f"omaticaya.io/{TELEMETRY}"])
    assert doc["gpus"][0]["temperature_c"] == 41


# --------------------------------------------------------------------------- validation

KEYS = [
    ("omaticaya.io/gpu.count", True),
    ("omaticaya.io/gpu-0.memory.free-mib", True),
    ("omaticaya.io/gpu_0.x", True),
    ("gpu.count", True),
    ("omaticaya.io/" + "a" * 63, True),
    ("omaticaya.io/" + "a" * 64, False),
    ("omaticaya.io/-gpu", False),
    ("omaticaya.io/gpu-", False),
    ("omaticaya.io/.gpu", False),
    ("omaticaya.io/gpu count", False),
    ("omaticaya.io/gpü", False),
    ("omaticaya.io/", False),
    ("", False),
    ("Omaticaya.io/gpu", False),
    ("omaticaya_io/gpu", False),
    ("-omaticaya.io/gpu", False),
    ("a/b/c", False),
    ("a" * 253 + "/gpu", True),
    ("a" * 254 + "/gpu", False),
    pytest.param(
        "/gpu", False,
        id="empty-prefix",
    ),
]


@pytest.mark.parametrize(("key", "valid"), KEYS, ids=[k[0][:40] if isinstance(k, tuple) else None for k in KEYS])
def test_is_valid_key(key, valid) -> None:
    assert is_valid_key(key) is valid


VALUES = [
    ("", True),
    ("a", True),
    ("8", True),
    ("NVIDIA-H100-80GB-HBM3", True),
    ("a_b.c-d", True),
    ("1.5", True),
    ("a" * 63, True),
    ("a" * 64, False),
    ("-a", False),
    ("a-", False),
    ("_a", False),
    ("a.", False),
    ("a b", False),
    ("a/b", False),
    ("é", False),
    ("-1", False),
]


@pytest.mark.parametrize(("value", "valid"), VALUES, ids=[repr(v[:20]) for v, _ in VALUES])
def test_is_valid_value(value, valid) -> None:
    assert is_valid_value(value) is valid


SANITISE = [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("Tesla V100 (PCIe)", "Tesla-V100-PCIe"),
    ("  GeForce RTX 4090  ", "GeForce-RTX-4090"),
    ("Quadro RTX™ 6000", "Quadro-RTX-6000"),
    ("--x--", "x"),
    ("x__y", "x__y"),
    ("a" * 70, "a" * 63),
    ("a" * 62 + " b", "a" * 62),
    ("日本語", ""),
    ("", ""),
]


@pytest.mark.parametrize(("text", "value"), SANITISE, ids=[repr(t[:24]) for t, _ in SANITISE])
def test_sanitise_value(text, value) -> None:
    assert sanitise_value(text) == value
    assert is_valid_value(sanitise_value(text))


QUANTISE = [
    # (function, value, step, expected)
    (quantise_down, 81079, 1024, 80896),
    (quantise_down, 1023, 1024, 0),
    (quantise_down, 1024, 1024, 1024),
    (quantise_down, 5, 1, 5),
    (quantise_nearest, 44.9, 10, 40),
    (quantise_nearest, 45.0, 10, 50),
    (quantise_nearest, 99.5, 10, 100),
    (quantise_nearest, 0.0, 10, 0),
    (quantise_nearest, 12.5, 25, 25),
    (quantise_nearest, 12.4, 25, 0),
]


@pytest.mark.parametrize(("fn", "value", "step", "expected"), QUANTISE, ids=[f"{f.__name__}({v},{s})" for f, v, s, _ in QUANTISE])
def test_quantise(fn, value, step, expected) -> None:
    assert fn(value, step) == expected


def test_invalid_family_is_dropped_not_sent() -> None:
    snap = snapshot(gpu(0, architecture="Hopper (new)"))
    _, desired = evaluate(snap, settings(per_gpu_labels=False))
    assert desired.dropped == (("omaticaya.io/gpu.family", "Hopper (new)"),)
    assert "omaticaya.io/gpu.family" not in desired.labels
    assert desired.labels["omaticaya.io/gpu.product"] == H100_LABEL


@pytest.mark.parametrize("product", ["日本語", "™™™", "   "])
def test_product_that_sanitises_to_nothing_is_dropped(product) -> None:
    _, desired = evaluate(snapshot(gpu(0, product=product)), settings(per_gpu_labels=False))
    assert "omaticaya.io/gpu.product" not in desired.labels
    assert [k for k, _ in desired.dropped] == ["omaticaya.io/gpu.product"]


def test_long_unicode_product_is_sanitised() -> None:
    product = "NVIDIA Ħ100 " + "x" * 200
    labels = rendered_labels(snapshot(gpu(0, product=product)), settings(per_gpu_labels=False))
    assert labels["omaticaya.io/gpu.product"] == "NVIDIA-100-" + "x" * 52
    assert len(labels["omaticaya.io/gpu.product"]) == 63


def test_huge_number_is_dropped() -> None:
    _, desired = evaluate(snapshot(gpu(0, temperature_c=10**70)), settings(temperature_labels=True))
    assert desired.dropped == (("omaticaya.io/gpu-0.temperature-c", str(10**70)),)


STATIC = [
    ("omaticaya.io/gpu.count", True),
    ("omaticaya.io/gpu.product", True),
    ("omaticaya.io/gpu.memory.total-mib", True),
    ("omaticaya.io/gpu.memory.free-mib", False),
    ("omaticaya.io/gpu.health", False),
    ("omaticaya.io/gpu-0.health", False),
    ("other.io/gpu.count", False),
]


@pytest.mark.parametrize(("key", "static"), STATIC, ids=[k for k, _ in STATIC])
def test_is_static(key, static) -> None:
    assert is_static(key, "omaticaya.io") is static


# --------------------------------------------------------------------------- telemetry


def test_telemetry_annotation_document() -> None:
    snap = snapshot(
        gpu(0, utilization_pct=33.333, power_w=700.456, process_count=1, memory_free_mib=49476),
        lost(1),
        gpu(2, ecc_uncorrected_volatile=1, remapped_rows_pending=None),
    )
    _, desired = evaluate(snap, settings())
    doc = json.loads(desired.annotations["omaticaya.io/telemetry"])
    assert RFC3339.match(doc["read_at"]) and doc["read_at"].endswith("Z")
    assert doc == {
        "schema": TELEMETRY_VERSION,
        "agent": __version__,
        "read_at": "2025-03-04T05:06:07Z",
        "source": "test",
        "health": "Degraded",
        "driver": "580.159.04",
        "cuda": "13.0",
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-00000000-7fda-b7ae-a94e-630097a14ca4",
                "product": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": 81559,
                "memory_free_mib": 49476,
                "memory_used_mib": 32083,
                "utilization_pct": 33.3,
                "temperature_c": 40,
                "power_w": 700.5,
                "ecc_uncorrected_volatile": 0,
                "ecc_corrected_volatile": 0,
                "remapped_rows_pending": False,
                "remapped_rows_failure": False,
                "process_count": 1,
                "health": "Healthy",
                "reasons": [],
            },
            {
                "index": 1,
                "uuid": "GPU-00000001-7fda-b7ae-a94e-630097a14ca4",
                "product": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": None,
                "memory_free_mib": None,
                "memory_used_mib": None,
                "utilization_pct": None,
                "temperature_c": None,
                "power_w": None,
                "ecc_uncorrected_volatile": None,
                "ecc_corrected_volatile": None,
                "remapped_rows_pending": None,
                "remapped_rows_failure": None,
                "process_count": None,
                "health": "Unhealthy",
                "reasons": ["lost"],
                "error": "NVMLError_GpuIsLost",
            },
            {
                "index": 2,
                "uuid": "GPU-00000002-7fda-b7ae-a94e-630097a14ca4",
                "product": "NVIDIA H100 80GB HBM3",
                "memory_total_mib": 81559,
                "memory_free_mib": 81079,
                "memory_used_mib": 480,
                "utilization_pct": 0.0,
                "temperature_c": 40,
                "power_w": 120.0,
                "ecc_uncorrected_volatile": 1,
                "ecc_corrected_volatile": 0,
                "remapped_rows_pending": None,
                "remapped_rows_failure": False,
                "process_count": 0,
                "health": "Unhealthy",
                "reasons": ["ecc-dbe"],
            },
        ],
    }
    # compact JSON, keys sorted
    raw = desired.annotations["omaticaya.io/telemetry"]
    assert ", " not in raw and ": " not in raw
    assert raw == json.dumps(doc, separators=(",", ":"), sort_keys=True)


def test_telemetry_on_library_error() -> None:
    _, desired = evaluate(snapshot(error="NVMLError_DriverNotLoaded"), settings(prefix="gpu.example.com"))
    doc = json.loads(desired.annotations["gpu.example.com/telemetry"])
    assert doc == {
        "schema": TELEMETRY_VERSION,
        "agent": __version__,
        "read_at": "2025-03-04T05:06:07Z",
        "source": "test",
        "health": "Unknown",
        "driver": None,
        "cuda": None,
        "gpus": [],
        "error": "NVMLError_DriverNotLoaded",
    }
