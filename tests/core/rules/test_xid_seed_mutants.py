"""``core.rules.xid_seed`` cases that mutation testing (``scripts/mutation``) found no test
pinned: what each refusal says (a document refused whole says why the telemetry parser refused
it), that a refused GPU entry refuses that GPU only (the entries after it are still read), a
time exactly ``MAX_AHEAD_S`` ahead (taken as now), and exactly ``MAX_XIDS_PER_GPU`` entries."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from omaticaya_py.core.rules.xid_seed import MAX_AHEAD_S, MAX_XIDS_PER_GPU, seed_events
from tests.helpers import READ_AT, gpu, snapshot

U0, U1 = gpu(0).uuid, gpu(1).uuid
NOW = snapshot(gpu(0), gpu(1), clock_s=5.0)  # the new agent's first reading, at READ_AT
AT = "2025-03-04T05:06:00Z"  # 7 s before READ_AT


def stamp(after_s: float) -> str:
    return (READ_AT + timedelta(seconds=after_s)).isoformat().replace("+00:00", "Z")


def entry(uuid: str | None, xids: dict[int, str] | None = None, reasons: Any = None) -> dict:
    xids = {74: AT} if xids is None else xids
    out = {"index": 0, "uuid": uuid, "reasons": reasons or [f"xid-{x}" for x in xids]}
    out["xids"] = [{"xid": x, "at": at} for x, at in xids.items()]
    return out


def doc(*gpus: dict, read_at: str | None = "2025-03-04T05:06:07Z") -> str:
    out: dict[str, Any] = {"schema": 2, "gpus": list(gpus)}
    if read_at is not None:
        out["read_at"] = read_at
    return json.dumps(out)


def seeded(raw: str, snap=NOW) -> tuple[list[tuple[str | None, int, float]], tuple[str, ...]]:
    found = seed_events(raw, snap)
    return [(e.uuid, e.xid, e.at_s) for e in found.events], found.refused


def test_a_document_refused_whole_names_the_parsers_reason() -> None:
    newer = json.dumps({"schema": 99, "read_at": "2025-03-04T05:06:07Z", "gpus": []})
    found = seed_events(newer, snapshot(gpu(0)))
    assert found.events == ()
    assert len(found.refused) == 1
    assert "unknown newer schema" in found.refused[0]
    assert seed_events("{not json", snapshot(gpu(0))).refused == (
        "unreadable telemetry annotation",
    )


def test_a_gpu_listed_twice_is_refused_once_and_the_next_gpu_is_read() -> None:
    events, refused = seeded(doc(entry(U0), entry(U0), entry(U1)))
    assert events == [(U1, 74, -2.0)]
    assert refused == (f"GPU {U0}: listed 2 times",)


def test_a_refusal_names_the_gpu_by_the_first_64_characters_of_its_uuid() -> None:
    long = "GPU-" + "0123456789abcdef" * 5  # 84 characters
    snap = snapshot(gpu(0, uuid=long), clock_s=5.0)
    _, refused = seeded(doc(entry(long), entry(long)), snap)
    assert refused == (f"GPU {long[:64]}: listed 2 times",)


def test_a_time_exactly_max_ahead_is_now_and_further_is_refused_for_that_gpu_only() -> None:
    events, refused = seeded(doc(entry(U0, {74: stamp(MAX_AHEAD_S)})))
    assert (events, refused) == ([(U0, 74, 5.0)], ())
    events, refused = seeded(doc(entry(U0, {74: stamp(MAX_AHEAD_S + 1)}), entry(U1)))
    assert events == [(U1, 74, -2.0)]
    assert refused == (f"GPU {U0}: an Xid time more than {MAX_AHEAD_S:g}s in the future",)


def test_a_problem_of_one_entry_is_said_with_its_gpu() -> None:
    events, refused = seeded(doc(entry(U0, {74: AT}, reasons=["xid-79"]), entry(U1)))
    assert events == [(U1, 74, -2.0)]
    assert refused == (f"GPU {U0}: xid times [74] do not match the reasons [79]",)


def test_reasons_without_times_need_the_documents_read_at() -> None:
    old = {"index": 0, "uuid": U0, "reasons": ["xid-74"]}  # an agent before xids
    assert seeded(doc(old, read_at=None)) == (
        [],
        (f"GPU {U0}: xid reasons without a readable read_at",),
    )
    assert seeded(doc(old)) == ([(U0, 74, 5.0)], ())


def test_at_most_max_xids_per_gpu_entries() -> None:
    most = {x: AT for x in range(1, MAX_XIDS_PER_GPU + 1)}
    events, refused = seeded(doc(entry(U0, most)))
    assert (len(events), refused) == (MAX_XIDS_PER_GPU, ())
    too_many = {x: AT for x in range(1, MAX_XIDS_PER_GPU + 2)}
    events, refused = seeded(doc(entry(U0, too_many)))
    assert events == []
    assert refused == (
        f"GPU {U0}: {MAX_XIDS_PER_GPU + 1} Xid entries (at most {MAX_XIDS_PER_GPU})",
    )
