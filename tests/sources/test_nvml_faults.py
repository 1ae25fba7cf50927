"""``NvmlReader`` and its Xid watcher when NVML calls that no trace sample describes fail
(``NVML_TESTLIB_FAULTS``): the topology call, ``nvmlShutdown``, the event set's creation,
registration and release, and an Xid from a GPU that has just fallen off the bus. Real ``pynvml``
against the NVML test library, in a worker process; the fault switch itself is checked first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import nvmltestlib
from tests.nvmltestlib import (
    fault,
    nvml_worker_fixture,  # noqa: F401  (fixture)
    sample,
    scenario,
    testlib_fixture,  # noqa: F401  (fixture)
)
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)

UNKNOWN = "NVMLError_Unknown"


def test_a_fault_starts_after_n_calls_and_fails_every_call_from_then_on(
    nvml_worker, tmp_path: Path  # noqa: F811
) -> None:
    trace = scenario(tmp_path / "scenario.json", sample())
    w = nvml_worker(trace, tmp_path / "pos", reader=False, faults={"nvmlDeviceGetUUID": "NVMLError_GpuIsLost@2"})
    w.call("nvmlInit")
    answers = [w.pynvml("nvmlDeviceGetUUID", {"handle": i % 2}) for i in range(4)]
    assert [a.get("error") for a in answers] == [None, None, "NVMLError_GpuIsLost", "NVMLError_GpuIsLost"]
    assert w.pynvml("nvmlDeviceGetName", {"handle": 0}) == {"ok": "NVIDIA H100 80GB HBM3"}


def test_a_topology_call_that_fails_is_unknown_and_counted_once(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    trace = scenario(tmp_path / "scenario.json", sample())
    w = nvml_worker(
        trace, tmp_path / "pos", watch_xid=False, faults={"nvmlDeviceGetTopologyCommonAncestor": UNKNOWN}
    )
    a, b = (g["uuid"] for g in w.read()["gpus"])
    assert [w.request({"cmd": "topology", "a": a, "b": b})["level"] for _ in range(2)] == [None, None]
    assert w.errors()[("nvmlDeviceGetTopologyCommonAncestor", UNKNOWN)] == 1  # cached


def test_nvml_shutdown_and_event_set_free_failing_do_not_stop_reading_after_the_driver_is_back(
    nvml_worker, tmp_path: Path  # noqa: F811
) -> None:
    trace = scenario(tmp_path / "scenario.json", sample(), sample(error="NVMLError_DriverNotLoaded"), sample())
    faults = {"nvmlShutdown": UNKNOWN, "nvmlEventSetFree": UNKNOWN}
    w = nvml_worker(trace, tmp_path / "pos", faults=faults)
    assert [g["error"] for g in w.read()["gpus"]] == [None, None]
    w.advance(1)
    assert w.read()["error"] == "NVMLError_DriverNotLoaded"
    w.advance(2)
    back = w.read()
    assert back["error"] is None and [g["error"] for g in back["gpus"]] == [None, None]


@pytest.mark.parametrize(
    ("faults", "counted"),
    [
        ({"nvmlEventSetCreate": UNKNOWN}, {("nvmlEventSetCreate", UNKNOWN): 1}),
        ({"nvmlDeviceRegisterEvents": UNKNOWN}, {("nvmlDeviceRegisterEvents", UNKNOWN): 2}),
    ],
    ids=["set-create", "register"],
)
def test_an_event_set_that_cannot_be_made_is_counted_and_the_gpus_still_read(
    nvml_worker, tmp_path: Path, faults, counted  # noqa: F811
) -> None:
    trace = scenario(tmp_path / "scenario.json", sample(), sample(xids=((0, 79),)))
    w = nvml_worker(trace, tmp_path / "pos", faults=faults)
    assert [g["error"] for g in w.read()["gpus"]] == [None, None]
    wait_for(f"{counted} counted", lambda: all(w.errors().get(k) == n for k, n in counted.items()))
    w.advance(1)
    snap = w.read()
    assert [g["error"] for g in snap["gpus"]] == [None, None] and snap["xid_events"] == []


def test_an_xid_from_a_gpu_that_fell_off_the_bus_still_arrives(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    # nvmlDeviceGetUUID of the event's GPU answers GpuIsLost: the event is kept all the same
    lost = sample(gpu1=fault("NVMLError_GpuIsLost"), xids=((1, 79),))
    trace = scenario(tmp_path / "scenario.json", sample(), *[lost] * 40)
    w = nvml_worker(trace, tmp_path / "pos")
    uuid_1 = w.read()["gpus"][1]["uuid"]
    seen: list[dict] = []
    position = iter(range(1, 1000))

    def xid_79() -> bool:
        # step on (to the last sample) until the watcher's event set, made in its own thread,
        # is there to receive one
        w.advance(min(next(position), 40))
        snap = w.read()
        seen.extend(snap["xid_events"])
        assert snap["gpus"][1]["error"] == "NVMLError_GpuIsLost"
        return any(e["xid"] == 79 for e in seen)

    wait_for("Xid 79 delivered", xid_79)
    # named by its handle: GPU 1 with its UUID (was index -1, no UUID: the quiet window of an
    # Xid 79 never applied to the GPU once it came back)
    assert uuid_1.startswith("GPU-")
    assert {(e["index"], e["uuid"]) for e in seen if e["xid"] == 79} == {(1, uuid_1)}


def test_a_topology_model_that_raises_leaves_the_topology_unknown_and_the_gpus_read(
    nvml_worker, tmp_path: Path  # noqa: F811
) -> None:
    trace = scenario(tmp_path / "scenario.json", sample(), sample())
    w = nvml_worker(trace, tmp_path / "pos", watch_xid=False, topology_raises=True)
    first = w.read()
    assert first["error"] is None and first["topology"] is None
    assert [g["error"] for g in first["gpus"]] == [None, None]
    assert w.topology() is None
    assert w.errors()[("topology", "RuntimeError")] == 1
    w.advance(1)
    assert w.read()["gpus"][1]["memory_used_mib"] == first["gpus"][1]["memory_used_mib"]
    assert w.errors()[("topology", "RuntimeError")] == 1  # read once per nvmlInit


def test_an_xid_flood_between_two_reads_is_bounded_and_keeps_the_newest(
    nvml_worker, tmp_path: Path  # noqa: F811
) -> None:
    # bursts of 200 distinct (GPU, Xid) pairs, one per sample: the library's event queue holds
    # 256, so the reader's own bound (MAX_PENDING, 256) is reached across bursts, with no read
    bursts = [tuple((i % 2, 1000 * (b + 1) + i) for i in range(200)) for b in range(12)]
    trace = scenario(tmp_path / "scenario.json", sample(), *(sample(xids=x) for x in bursts))
    w = nvml_worker(trace, tmp_path / "pos", watch_xid=True)
    assert w.read()["xid_events"] == []
    assert w.request({"cmd": "xid_dropped"})["dropped"] == 0
    current = [0]

    def dropped() -> int:
        n = w.request({"cmd": "xid_dropped"})["dropped"]
        if not n and current[0] < len(bursts):
            current[0] += 1  # the next burst, while the watcher keeps what it has
            w.advance(current[0])
        return n

    wait_for("the watcher to drop Xid events beyond its bound", dropped, 30)
    newest = bursts[current[0] - 1][-1]
    seen: list[tuple[int, int]] = []

    def newest_seen() -> bool:
        events = w.read()["xid_events"]
        assert len(events) <= 256
        seen.extend((e["index"], e["xid"]) for e in events)
        return newest in seen

    wait_for("the newest Xid of the last burst", newest_seen, 30)
    assert set(seen) <= {x for burst in bursts for x in burst}
    assert len(seen) == len(set(seen))  # each delivered once
