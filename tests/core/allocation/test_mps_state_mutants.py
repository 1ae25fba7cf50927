"""Direct, in-process cases for ``core.allocation.mps_state``: the files the MPS supervisor and
the plugins exchange, and the ``enforced`` rule. Its other direct cases live in
``tests/mps/test_mps_slices.py``, which starts processes (marked slow: left out of
``scripts/mutation``); these pin what mutation testing found open without them: each file's
exact JSON, every refusal's exact message (a field is named, a long value cut), the bounds
(size, 0, 1..100, the stale limit) and the defaults of the optional fields.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from omaticaya_py.core.allocation.mps_state import (
    MAX_STATE_BYTES,
    DaemonState,
    SliceRequest,
    enforced,
    parse_request,
    parse_state,
    request_json,
    state_json,
)

UUID = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
OTHER = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
SID = "0123456789abcdef"
LONG = "x" * 100  # longer than any message keeps of a value


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


# ------------------------------------------------------------------ the request ----

REQ = SliceRequest(SID, UUID, 2, 8192, "device-plugin", "h", 50, 1.5)


def test_request_json_is_one_object_with_sorted_keys() -> None:
    assert request_json(REQ) == (
        '{"at_s": 1.5, "gpu_index": 2, "gpu_uuid": "' + UUID + '", "holder": "h", "mib": 8192, '
        '"owner": "device-plugin", "sid": "' + SID + '", "threads_pct": 50}'
    )
    assert parse_request(request_json(REQ), SID) == REQ
    assert parse_request(request_json(REQ).encode(), SID) == REQ


def doc(**changes: Any) -> dict[str, Any]:
    """``REQ``'s file as a dict, with ``changes`` (``None``: the key left out)."""
    out = json.loads(request_json(REQ))
    for k, v in changes.items():
        if v is None:
            out.pop(k)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(
    ("case", "changes", "expected"),
    [
        ("no thread percentage", {"threads_pct": None}, {"threads_pct": None}),
        ("a thread percentage of 1", {"threads_pct": 1}, {"threads_pct": 1}),
        ("a thread percentage of 100", {"threads_pct": 100}, {"threads_pct": 100}),
        ("1 MiB", {"mib": 1}, {"mib": 1}),
        ("GPU index 0", {"gpu_index": 0}, {"gpu_index": 0}),
        ("no holder", {"holder": None}, {"holder": ""}),
        ("an owner cut at 32 characters", {"owner": "o" * 40}, {"owner": "o" * 32}),
        ("a holder cut at 4096 characters", {"holder": "h" * 5000}, {"holder": "h" * 4096}),
        ("whole seconds", {"at_s": 7}, {"at_s": 7.0}),
    ],
)  # fmt: skip
def test_parse_request_takes(case: str, changes: dict[str, Any], expected: dict[str, Any]) -> None:
    got = parse_request(json.dumps(doc(**changes)), SID)
    want = {**json.loads(request_json(REQ)), **expected}
    assert got == SliceRequest(**want), case
    assert type(got.at_s) is float, case


@pytest.mark.parametrize(
    ("case", "raw", "message"),
    [
        ("not JSON", "{", "not JSON (Expecting property name enclosed in double quotes: line 1 "
                         "column 2 (char 1))"),
        ("not UTF-8", b"\xff\xfe\xfa", None),
        ("not an object", "[]", "not a JSON object"),
        ("another slice's", json.dumps(doc(sid="f" * 40)),
         f"the request of {'f' * 32!r}, not of {SID}"),
        ("no slice named", json.dumps(doc(sid=None)), f"the request of 'None', not of {SID}"),
        ("a MIG UUID", json.dumps(doc(gpu_uuid="MIG-1234")),
         "gpu_uuid: expected a GPU UUID; got 'MIG-1234'"),
        ("a path", json.dumps(doc(gpu_uuid="../" + LONG)),
         f"gpu_uuid: expected a GPU UUID; got {('../' + LONG)[:64]!r}"),
        ("a UUID that is no string", json.dumps(doc(gpu_uuid=5)),
         "gpu_uuid: expected a GPU UUID; got '5'"),
        ("no UUID", json.dumps(doc(gpu_uuid=None)), "gpu_uuid: expected a GPU UUID; got 'None'"),
        ("0 MiB", json.dumps(doc(mib=0)), "mib: expected at least 1"),
        ("negative MiB", json.dumps(doc(mib=-5)),
         "mib: expected a non-negative integer; got '-5'"),
        ("no MiB", json.dumps(doc(mib=None)), "mib: expected a non-negative integer; got 'None'"),
        ("MiB true", json.dumps(doc(mib=True)), "mib: expected a non-negative integer; got 'True'"),
        ("MiB a long string", json.dumps(doc(mib=LONG)),
         f"mib: expected a non-negative integer; got {LONG[:32]!r}"),
        ("0 % of the threads", json.dumps(doc(threads_pct=0)),
         "threads_pct: expected 1 to 100; got 0"),
        ("101 % of the threads", json.dumps(doc(threads_pct=101)),
         "threads_pct: expected 1 to 100; got 101"),
        ("no owner", json.dumps(doc(owner=None)), "owner, holder: expected strings"),
        ("an owner that is no string", json.dumps(doc(owner=3)),
         "owner, holder: expected strings"),
        ("a holder that is no string", json.dumps(doc(holder=3)),
         "owner, holder: expected strings"),
        ("no GPU index", json.dumps(doc(gpu_index=None)),
         "gpu_index: expected a non-negative integer; got 'None'"),
        ("no time", json.dumps(doc(at_s=None)), "at_s: expected seconds; got 'None'"),
        ("a time that is true", json.dumps(doc(at_s=True)), "at_s: expected seconds; got 'True'"),
        ("a time that is a long string", json.dumps(doc(at_s=LONG)),
         f"at_s: expected seconds; got {LONG[:32]!r}"),
        ("an infinite time", json.dumps(doc(at_s=float("inf"))),
         "at_s: expected seconds; got 'inf'"),
        ("a time that is no number", json.dumps(doc(at_s=float("nan"))),
         "at_s: expected seconds; got 'nan'"),
    ],
)  # fmt: skip
def test_parse_request_refuses(case: str, raw: str | bytes, message: str | None) -> None:
    with pytest.raises(ValueError, match=None if message is None else exactly(message)):
        parse_request(raw, SID)


def test_parse_request_reads_at_most_twice_a_states_bytes() -> None:
    text = request_json(REQ)
    fits = text + " " * (2 * MAX_STATE_BYTES - len(text))
    assert parse_request(fits, SID) == REQ
    with pytest.raises(ValueError, match=exactly(f"over {2 * MAX_STATE_BYTES} bytes")):
        parse_request(fits + " ", SID)


# ------------------------------------------------------------------ the state ----

STATE = DaemonState(UUID, 2, "up", "fine", 42, 8192, 3, 1000.5, 990.25, SID)


def test_state_json_is_one_object_with_sorted_keys() -> None:
    assert state_json(STATE) == (
        '{"heartbeat_s": 1000.5, "index": 2, "limit_mib": 8192, "pid": 42, "reason": "fine", '
        '"sid": "' + SID + '", "since_s": 990.25, "starts": 3, "state": "up", "uuid": "' + UUID
        + '"}'
    )
    assert parse_state(state_json(STATE), UUID, SID) == STATE
    assert parse_state(state_json(STATE).encode(), "", SID) == STATE  # "": any GPU's


def sdoc(**changes: Any) -> dict[str, Any]:
    """``STATE``'s file as a dict, with ``changes`` (``None``: the key left out)."""
    out = json.loads(state_json(STATE))
    for k, v in changes.items():
        if v is None:
            out.pop(k)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize(
    ("case", "changes", "expected"),
    [
        ("no pid, no limit", {"pid": None, "limit_mib": None}, {"pid": None, "limit_mib": None}),
        ("pid 0, starts 0, index 0", {"pid": 0, "starts": 0, "index": 0},
         {"pid": 0, "starts": 0, "index": 0}),
        ("no reason", {"reason": None}, {"reason": ""}),
        ("a reason cut at 256 characters", {"reason": "r" * 300}, {"reason": "r" * 256}),
        ("starting", {"state": "starting"}, {"state": "starting"}),
        ("down", {"state": "down"}, {"state": "down"}),
        ("whole seconds", {"heartbeat_s": 7, "since_s": 6}, {"heartbeat_s": 7.0, "since_s": 6.0}),
    ],
)  # fmt: skip
def test_parse_state_takes(case: str, changes: dict[str, Any], expected: dict[str, Any]) -> None:
    got = parse_state(json.dumps(sdoc(**changes)), UUID, SID)
    want = {**json.loads(state_json(STATE)), **expected}
    assert got == DaemonState(**want), case
    assert type(got.heartbeat_s) is float and type(got.since_s) is float, case


def test_a_probes_state_has_no_slice() -> None:
    probe = DaemonState(UUID, 0, "up", heartbeat_s=5.0, since_s=4.0)
    raw = json.dumps({k: v for k, v in json.loads(state_json(probe)).items() if k != "sid"})
    assert parse_state(raw, UUID) == probe
    assert parse_state(state_json(probe), UUID) == probe


@pytest.mark.parametrize(
    ("case", "raw", "uuid", "sid", "message"),
    [
        ("not JSON", "{", UUID, SID,
         "not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ("not UTF-8", b"\xff\xfe\xfa", UUID, SID, None),
        ("not an object", "[]", UUID, SID, "not a JSON object"),
        ("another GPU's", json.dumps(sdoc(uuid=OTHER)), UUID, SID,
         f"the state of {OTHER!r}, not of {UUID}"),
        ("another GPU's, a long UUID", json.dumps(sdoc(uuid="GPU-" + LONG)), UUID, SID,
         f"the state of {('GPU-' + LONG)[:64]!r}, not of {UUID}"),
        ("any GPU's, but no UUID", json.dumps(sdoc(uuid=None)), "", SID,
         "uuid: expected a GPU UUID; got 'None'"),
        ("any GPU's, but a UUID that is no string", json.dumps(sdoc(uuid=5)), "", SID,
         "uuid: expected a GPU UUID; got '5'"),
        ("any GPU's, but a path", json.dumps(sdoc(uuid="../" + LONG)), "", SID,
         f"uuid: expected a GPU UUID; got {('../' + LONG)[:64]!r}"),
        ("another slice's", json.dumps(sdoc(sid="f" * 40)), UUID, SID,
         f"the state of slice {'f' * 32!r}, not of {SID!r}"),
        ("a slice's, read as the probe's", json.dumps(sdoc()), UUID, "",
         f"the state of slice {SID!r}, not of ''"),
        ("the probe's, read as a slice's", json.dumps(sdoc(sid=None)), UUID, SID,
         f"the state of slice 'None', not of {SID!r}"),
        ("a state of its own", json.dumps(sdoc(state="fine")), UUID, SID,
         "state: expected up, starting or down; got 'fine'"),
        ("no state", json.dumps(sdoc(state=None)), UUID, SID,
         "state: expected up, starting or down; got 'None'"),
        ("a long state", json.dumps(sdoc(state=LONG)), UUID, SID,
         f"state: expected up, starting or down; got {LONG[:32]!r}"),
        ("a reason that is no string", json.dumps(sdoc(reason=3)), UUID, SID,
         "reason: expected a string"),
        ("a negative pid", json.dumps(sdoc(pid=-1)), UUID, SID,
         "pid: expected a non-negative integer; got '-1'"),
        ("a limit that is true", json.dumps(sdoc(limit_mib=True)), UUID, SID,
         "limit_mib: expected a non-negative integer; got 'True'"),
        ("no starts", json.dumps(sdoc(starts=None)), UUID, SID,
         "starts: expected a non-negative integer; got 'None'"),
        ("no index", json.dumps(sdoc(index=None)), UUID, SID,
         "index: expected a non-negative integer; got 'None'"),
        ("a heartbeat that is a string", json.dumps(sdoc(heartbeat_s="soon")), UUID, SID,
         "heartbeat_s: expected seconds; got 'soon'"),
        ("no since", json.dumps(sdoc(since_s=None)), UUID, SID,
         "since_s: expected seconds; got 'None'"),
    ],
)  # fmt: skip
def test_parse_state_refuses(case: str, raw: str | bytes, uuid: str, sid: str,
                             message: str | None) -> None:  # fmt: skip
    with pytest.raises(ValueError, match=None if message is None else exactly(message)):
        parse_state(raw, uuid, sid)


def test_parse_state_reads_at_most_max_state_bytes() -> None:
    text = state_json(STATE)
    fits = text + " " * (MAX_STATE_BYTES - len(text))
    assert parse_state(fits, UUID, SID) == STATE
    with pytest.raises(ValueError, match=exactly(f"over {MAX_STATE_BYTES} bytes")):
        parse_state(fits + " ", UUID, SID)


# ------------------------------------------------------------------ enforced ----


@pytest.mark.parametrize(
    ("case", "state", "now_s", "kw", "expected"),
    [
        ("up, the heartbeat exactly the limit old", STATE, 1015.5, {}, (True, "")),
        ("up, a heartbeat a little older", STATE, 1015.75, {}, (False, "mps-state-stale")),
        ("up, a heartbeat exactly the limit ahead", STATE, 985.5, {}, (True, "")),
        ("up, a heartbeat further ahead", STATE, 985.25, {}, (False, "mps-state-stale")),
        ("no supervisor, whatever the file says", STATE, 1001.0, {"supervisor_gone": True},
         (False, "mps-supervisor-gone")),
        ("no supervisor, no file", None, 1001.0, {"supervisor_gone": True, "problem": "x"},
         (False, "mps-supervisor-gone")),
        ("no file", None, 1001.0, {}, (False, "mps-state-missing")),
        ("a file that could not be read", None, 1001.0, {"problem": "not JSON"},
         (False, "mps-state-unreadable")),
        ("starting", DaemonState(UUID, 0, "starting", heartbeat_s=1000.0), 1001.0, {},
         (False, "mps-daemon-starting")),
        ("down", DaemonState(UUID, 0, "down", "exited", heartbeat_s=1000.0), 1001.0, {},
         (False, "mps-daemon-down")),
        ("starting, stale: stale first", DaemonState(UUID, 0, "starting", heartbeat_s=1000.0),
         1100.0, {}, (False, "mps-state-stale")),
    ],
)  # fmt: skip
def test_enforced(case: str, state: DaemonState | None, now_s: float, kw: dict[str, Any],
                  expected: tuple[bool, str]) -> None:  # fmt: skip
    assert enforced(state, now_s, 15.0, **kw) == expected, case
