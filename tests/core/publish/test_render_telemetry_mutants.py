"""``core.publish.render_telemetry`` cases that mutation testing (``scripts/mutation``) found no
test pinned: the whole document with every option (a lease and a refresh, the peak window, the
attribution of whole, shared and MIG GPUs, MPS, a fatal Xid), a library error's document, the
annotation at its size limit and under an invalid key, the time in UTC whatever the host's zone,
and the marks the write budget compares (``telemetry_marks``, ``published_marks``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from omaticaya_py import __version__
from omaticaya_py.core.model.labelvalues import MAX_ANNOTATIONS_BYTES
from omaticaya_py.core.model.sharing import Sharing, unit_id
from omaticaya_py.core.model.snapshot import MigReading, NodeSnapshot
from omaticaya_py.core.model.window import PeakWindow
from omaticaya_py.core.publish.budget import UnitMark
from omaticaya_py.core.publish.render_telemetry import (
    published_marks,
    telemetry,
    telemetry_annotation,
    telemetry_marks,
)
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution, PodMemory
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import TELEMETRY_VERSION, Telemetry
from tests.helpers import H100, PREFIX, gpu, lost, settings, snapshot, xid

UUID0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"  # tests.helpers.gpu(0)'s
UUID1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
UUID3 = "GPU-00000003-7fda-b7ae-a94e-630097a14ca4"
MIG0 = "MIG-00000000-0000-0000-0000-000000000000"
MIG1 = "MIG-00000001-0000-0000-0000-000000000000"
SHARED_0 = Sharing.of(settings(shared_gpus="0"))


def _doc(snap: NodeSnapshot, **options: Any) -> dict[str, Any]:
    return json.loads(telemetry(snap, assess(snap, snap.xid_events), **options))


def _units(uuid: str, n: int) -> tuple[str, ...]:
    return tuple(unit_id(uuid, k) for k in range(n))


def _pod(pod: str, container: str, mib: int, pid: int) -> PodMemory:
    return PodMemory(f"uid-{pod}", "c" * 64, "ml", pod, container, mib, (pid,))


# --- the whole document -------------------------------------------------------------------------
# GPU 0: whole, shared by units (sharing "0"), one container holding 3 units and using 4 GiB (over
# its slice), MPS up, 256 MiB out of band, GPM readings; GPU 1: MIG on, a MIG device held and one
# that cannot be read; GPU 2: no UUID (the window keys it by index), a fatal Xid 4.5 s before the
# read; GPU 3: lost. The window (60 s) holds a reading 60 s before this one.

MIGS = (
    MigReading(index=0, uuid=MIG0, profile="1g.10gb", gpu_instance_id=7, memory_total_mib=9984,
               memory_used_mib=984, memory_free_mib=9000, process_count=1),
    MigReading(index=1, uuid=MIG1, profile="2g.20gb", gpu_instance_id=9, error="NVMLError_Unknown"),
)  # fmt: skip


def _rich(clock_s: float = 100.0) -> NodeSnapshot:
    return snapshot(
        gpu(0, 40_000, utilization_pct=33.333, sm_active_pct=47.26, tensor_active_pct=12.34,
            dram_bw_pct=5.56, power_w=700.456, process_count=2, temperature_c=61,
            ecc_corrected_volatile=3),
        gpu(1, None, utilization_pct=None, mig_enabled=True, mig_devices=MIGS,
            remapped_rows_pending=None),
        gpu(2, 30_000, uuid=None, utilization_pct=80.0, remapped_rows_failure=None),
        lost(3),
        clock_s=clock_s, xid_events=(xid(2, 79, clock_s - 4.5),),
    )  # fmt: skip


def _window() -> PeakWindow:
    window = PeakWindow(60)
    window.add(snapshot(gpu(0, 35_000, utilization_pct=90.0),
                        gpu(2, 20_000, uuid=None, utilization_pct=70.0), clock_s=40.0))  # fmt: skip
    window.add(_rich())
    return window


ATTRIBUTION = {
    UUID0: GpuAttribution(UUID0, holders=(ContainerDevices("ml", "a", "main", "omaticaya.io/gpu-memory",
                                                           _units(UUID0, 3)),),
                          pods=(_pod("a", "main", 4096, 11),), out_of_band_memory_mib=256,
                          out_of_band_pids=(7,), named_pods=frozenset({("ml", "a")})),
    MIG0: GpuAttribution(MIG0, holders=(ContainerDevices("ml", "b", "side", "nvidia.com/mig-1g.10gb", (MIG0,)),),
                         pods=(_pod("b", "side", 900, 12),), out_of_band_memory_mib=84,
                         out_of_band_pids=(8,)),
}  # fmt: skip

COMMON = {"product": H100, "memory_total_mib": 81559, "ecc_uncorrected_volatile": 0,
          "ecc_corrected_volatile": 0, "remapped_rows_pending": False,
          "remapped_rows_failure": False, "temperature_c": 40, "power_w": 120.0,
          "process_count": 0, "health": "Healthy", "reasons": []}  # fmt: skip

RICH = {
    "schema": TELEMETRY_VERSION,
    "agent": __version__,
    "read_at": "2025-03-04T05:06:07Z",
    "source": "test",
    "health": "Degraded",
    "driver": "580.159.04",
    "cuda": "13.0",
    "lease": "omaticaya/node-a",
    "refresh_s": 30.0,
    "expires_at": "2025-03-04T05:06:37Z",
    "window_s": 60.0,
    "share_unit_mib": 1024,
    "gpus": [
        {**COMMON, "index": 0, "uuid": UUID0, "memory_free_mib": 40_000, "memory_used_mib": 41_559,
         "utilization_pct": 33.3, "sm_active_pct": 47.3, "tensor_active_pct": 12.3,
         "dram_bw_pct": 5.6, "temperature_c": 61, "power_w": 700.5, "ecc_corrected_volatile": 3,
         "process_count": 2, "memory_free_min_mib": 35_000, "utilization_p95_pct": 90.0,
         "pods": [{"namespace": "ml", "pod": "a", "container": "main", "limit_mib": 3072,
                   "memory_used_mib": 4096, "over_limit": True}],
         "memory_out_of_band_mib": 256, "shared": True, "share_units": 79, "mps": "up"},
        {**COMMON, "index": 1, "uuid": UUID1, "memory_free_mib": None, "memory_used_mib": None,
         "utilization_pct": None, "remapped_rows_pending": None, "mig_enabled": True,
         "memory_out_of_band_mib": 84,
         "mig_devices": [
             {"index": 0, "uuid": MIG0, "profile": "1g.10gb", "gpu_instance_id": 7,
              "memory_total_mib": 9984, "memory_free_mib": 9000, "memory_used_mib": 984,
              "process_count": 1, "health": "Healthy", "reasons": [],
              "pods": [{"namespace": "ml", "pod": "b", "container": "side", "memory_used_mib": 900}],
              "memory_out_of_band_mib": 84},
             {"index": 1, "uuid": MIG1, "profile": "2g.20gb", "gpu_instance_id": 9,
              "memory_total_mib": None, "memory_free_mib": None, "memory_used_mib": None,
              "process_count": None, "health": "Unhealthy", "reasons": ["mig-read-error"],
              "error": "NVMLError_Unknown"},
         ]},
        {**COMMON, "index": 2, "uuid": None, "memory_free_mib": 30_000, "memory_used_mib": 51_559,
         "utilization_pct": 80.0, "remapped_rows_failure": None, "health": "Unhealthy",
         "reasons": ["xid-79"], "xids": [{"xid": 79, "at": "2025-03-04T05:06:02.500Z"}],
         "memory_free_min_mib": 20_000, "utilization_p95_pct": 80.0},
        {"index": 3, "uuid": UUID3, "product": H100, "memory_total_mib": None,
         "memory_free_mib": None, "memory_used_mib": None, "utilization_pct": None,
         "temperature_c": None, "power_w": None, "ecc_uncorrected_volatile": None,
         "ecc_corrected_volatile": None, "remapped_rows_pending": None,
         "remapped_rows_failure": None, "process_count": None, "health": "Unhealthy",
         "reasons": ["lost"], "error": "NVMLError_GpuIsLost"},
    ],
}  # fmt: skip


def test_the_whole_document_with_every_option() -> None:
    got = _doc(_rich(), refresh_s=30.0, lease="omaticaya/node-a", window=_window(),
               attribution=ATTRIBUTION, sharing=SHARED_0, mps={UUID0: "up"})  # fmt: skip
    assert got == RICH


def test_without_options_the_optional_parts_are_absent() -> None:
    got = _doc(_rich())
    assert not {"lease", "refresh_s", "expires_at", "window_s", "share_unit_mib"} & got.keys()
    optional = {"memory_free_min_mib", "utilization_p95_pct", "pods", "memory_out_of_band_mib",
                "shared", "share_units", "mps"}  # fmt: skip
    assert [sorted(optional & g.keys()) for g in got["gpus"]] == [[], [], [], []]
    assert not [m for m in got["gpus"][1]["mig_devices"] if {"pods", "memory_out_of_band_mib"} & m.keys()]


def test_a_library_errors_document() -> None:
    snap = snapshot(error="NVMLError_DriverNotLoaded")
    assert _doc(snap) == {
        "schema": TELEMETRY_VERSION, "agent": __version__, "read_at": "2025-03-04T05:06:07Z",
        "source": "test", "health": "Unknown", "driver": None, "cuda": None, "gpus": [],
        "error": "NVMLError_DriverNotLoaded",
    }  # fmt: skip


@pytest.fixture
def host_zone_ahead_of_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local zone 5:30 ahead of UTC (a POSIX TZ: no zone database needed)."""
    monkeypatch.setenv("TZ", "XST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("host_zone_ahead_of_utc")
def test_times_are_utc_whatever_the_hosts_zone() -> None:
    got = _doc(_rich(), refresh_s=30.0)
    assert (got["read_at"], got["expires_at"]) == ("2025-03-04T05:06:07Z", "2025-03-04T05:06:37Z")
    assert got["gpus"][2]["xids"] == [{"xid": 79, "at": "2025-03-04T05:06:02.500Z"}]


# --- units held on a GPU that is not shared (sharing turned off since), and the reverse ---------


def test_units_held_on_a_gpu_not_shared_are_no_slice() -> None:
    """A container still holding units of GPU 0 after sharing was turned off for it (GPU 1 still
    shared): no slice, no over-use, in the document and in the marks alike."""
    snap = snapshot(gpu(0, 40_000), gpu(1))
    att = {UUID0: GpuAttribution(UUID0, holders=(ContainerDevices("ml", "a", "main", "omaticaya.io/gpu-memory",
                                                                  _units(UUID0, 3)),),
                                 pods=(_pod("a", "main", 4096, 11),), named_pods=frozenset({("ml", "a")}))}  # fmt: skip
    sharing = Sharing.of(settings(shared_gpus="1"))
    got = _doc(snap, attribution=att, sharing=sharing)["gpus"][0]
    assert got["pods"] == [{"namespace": "ml", "pod": "a", "container": "main", "memory_used_mib": 4096}]
    marks = telemetry_marks(snap, att, sharing)
    assert marks[(0, -1)] == UnitMark(40_000, frozenset({("ml", "a", "main")}))


def test_a_whole_gpu_holder_on_a_shared_gpu_has_no_use_of_its_own() -> None:
    """A container holding shared GPU 0 whole (given it before sharing was turned on): it has no
    slice, and its use is not said (the GPU's memory is not one holder's)."""
    snap = snapshot(gpu(0, 40_000))
    att = {UUID0: GpuAttribution(UUID0, holders=(ContainerDevices("ml", "a", "main", "nvidia.com/gpu", (UUID0,)),),
                                 pods=(_pod("a", "main", 4096, 11),))}  # fmt: skip
    got = _doc(snap, attribution=att, sharing=SHARED_0)["gpus"][0]
    assert got["pods"] == [{"namespace": "ml", "pod": "a", "container": "main"}]
    assert _doc(snap, attribution=att)["gpus"][0]["pods"][0]["memory_used_mib"] == 4096


# --- the annotation -----------------------------------------------------------------------------


def _annotation(product_len: int, prefix: str = PREFIX) -> tuple[dict[str, str], list[tuple[str, str]]]:
    snap = snapshot(gpu(0, product="x" * product_len))
    return telemetry_annotation(snap, assess(snap), prefix)


def test_the_annotation_under_its_size_limit() -> None:
    base = len(_annotation(1)[0][f"{PREFIX}/telemetry"])  # one character more per character of product
    at_limit = 1 + MAX_ANNOTATIONS_BYTES - base
    kept, dropped = _annotation(at_limit - 1)
    assert len(kept[f"{PREFIX}/telemetry"]) == MAX_ANNOTATIONS_BYTES - 1 and dropped == []
    kept, dropped = _annotation(at_limit)
    assert kept == {}
    [(key, start)] = dropped
    assert key == f"{PREFIX}/telemetry" and len(start) == 80 and start.startswith('{"agent":')


def test_an_invalid_key_drops_the_annotation() -> None:
    kept, dropped = _annotation(1, prefix="not a prefix")
    assert kept == {}
    assert [(k, len(v)) for k, v in dropped] == [("not a prefix/telemetry", 80)]


# --- the marks ----------------------------------------------------------------------------------


def test_the_marks_of_a_reading_are_those_of_its_document() -> None:
    snap = _rich()
    options = {"attribution": ATTRIBUTION, "sharing": SHARED_0, "mps": {UUID0: "up"}}
    doc, _ = Telemetry.parse(telemetry(snap, assess(snap, snap.xid_events), **options))
    assert doc is not None
    marks = telemetry_marks(snap, **options)
    assert published_marks(doc) == marks
    assert marks[(0, -1)] == UnitMark(40_000, frozenset({("ml", "a", "main")}),
                                      frozenset({("ml", "a", "main")}), "up")  # fmt: skip
    assert marks[(1, 0)] == UnitMark(9000, frozenset({("ml", "b", "side")}))


def test_a_published_holder_without_names_is_empty_strings() -> None:
    doc, _ = Telemetry.parse(json.dumps({"schema": TELEMETRY_VERSION, "gpus": [
        {"index": 0, "memory_free_mib": 100, "pods": [{}]},
        {"index": 1, "mig_enabled": True, "mig_devices": [{"index": 0, "pods": [{"pod": "p"}]}]},
    ]}))  # fmt: skip
    assert doc is not None
    assert published_marks(doc) == {
        (0, -1): UnitMark(100, frozenset({("", "", "")})),
        (1, -1): UnitMark(None),
        (1, 0): UnitMark(None, frozenset({("", "p", "")})),
    }
