"""Direct, in-process cases for ``core.allocation.mps``: where the MPS daemons live (``Layout``),
a slice's ID, the limits as MPS reads them, the thread share and a slice container's client
answer. Its other cases run the device plugin or the supervisor (``tests/deviceplugin``,
``tests/mps``, the latter starting processes and left out of ``scripts/mutation``); these pin
what mutation testing found open without them: every path exactly, each refusal's message,
the bounds (42 bytes, 1 MiB, 1 and 100 %).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from omaticaya_py.core.allocation.mps import (
    ClientSpec,
    Layout,
    Mount,
    client_spec,
    limit_value,
    probe_limit_mib,
    slice_id,
    thread_pct,
)

UUID = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
MIG = "MIG-00000000-7fda-b7ae-a94e-630097a14ca4"
SID = "0123456789abcdef"


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def test_the_default_layout() -> None:
    layout = Layout()
    assert (layout.root, layout.state_dir) == (Path("/run/omaticaya/mps"),
                                               Path("/run/omaticaya-mps-state"))  # fmt: skip


def test_every_path_of_a_layout() -> None:
    layout = Layout(Path("/r/mps"), Path("/s/state"))
    assert layout.gpu_dir(UUID) == Path(f"/r/mps/{UUID}")
    assert layout.gpu_dir(MIG) == Path(f"/r/mps/{MIG}")
    assert layout.pipe(UUID) == Path(f"/r/mps/{UUID}/pipe")
    assert layout.log(UUID) == Path(f"/r/mps/{UUID}/log")
    assert layout.state(UUID) == Path(f"/s/state/{UUID}.json")
    assert layout.lock == Path("/s/state/supervisor.lock")
    assert layout.slices_dir == Path("/r/mps/slices")
    assert layout.requests_dir == Path("/s/state/slices")
    assert layout.slice_dir(SID) == Path(f"/r/mps/slices/{SID}")
    assert layout.slice_pipe(SID) == Path(f"/r/mps/slices/{SID}/pipe")
    assert layout.slice_shm(SID) == Path(f"/r/mps/slices/{SID}/shm")
    assert layout.request(SID) == Path(f"/s/state/slices/{SID}.json")
    assert layout.slice_state(SID) == Path(f"/s/state/slices/{SID}.state.json")


@pytest.mark.parametrize(
    ("root", "state_dir", "message"),
    [
        ("run/mps", "/s", "OMATICAYA_MPS_ROOT: expected an absolute folder path without '..'; "
                          "got 'run/mps'"),
        ("/run/../mps", "/s", "OMATICAYA_MPS_ROOT: expected an absolute folder path without "
                              "'..'; got '/run/../mps'"),
        ("/r", "state", "OMATICAYA_MPS_STATE_DIR: expected an absolute folder path without "
                        "'..'; got 'state'"),
        ("/r", "/s/../etc", "OMATICAYA_MPS_STATE_DIR: expected an absolute folder path without "
                            "'..'; got '/s/../etc'"),
        ("/" + "r" * 42, "/s", "OMATICAYA_MPS_ROOT: at most 42 bytes (a unix socket's path is "
                               "at most 107, and the daemons' sockets are <root>/<GPU UUID>/"
                               f"pipe/...); got 43: {'/' + 'r' * 42!r}"),
        ("/" + "r" * 120, "/s", "OMATICAYA_MPS_ROOT: at most 42 bytes (a unix socket's path is "
                                "at most 107, and the daemons' sockets are <root>/<GPU UUID>/"
                                f"pipe/...); got 121: {('/' + 'r' * 120)[:96]!r}"),
        ("/" + "é" * 21, "/s", "OMATICAYA_MPS_ROOT: at most 42 bytes (a unix socket's path is "
                               "at most 107, and the daemons' sockets are <root>/<GPU UUID>/"
                               f"pipe/...); got 43: {'/' + 'é' * 21!r}"),
    ],
)  # fmt: skip
def test_a_layout_refuses(root: str, state_dir: str, message: str) -> None:
    with pytest.raises(ValueError, match=exactly(message)):
        Layout(Path(root), Path(state_dir))


def test_a_root_of_exactly_42_bytes_is_taken() -> None:
    assert Layout(Path("/" + "r" * 41)).root == Path("/" + "r" * 41)


@pytest.mark.parametrize(
    ("name", "bad"),
    [("gpu_dir", "../x"), ("pipe", "nvidia0"), ("log", "GPU-a/b"), ("state", "GPU-" + "a" * 200)],
)
def test_a_uuid_that_is_no_uuid_names_no_path(name: str, bad: str) -> None:
    with pytest.raises(ValueError, match=exactly(f"not a GPU UUID: {bad[:96]!r}")):
        getattr(Layout(), name)(bad)


@pytest.mark.parametrize("name", ["slice_dir", "slice_pipe", "slice_shm", "request", "slice_state"])
@pytest.mark.parametrize("bad", ["../../etc/passwd", "0123456789ABCDEF", SID + "0", "x" * 120])
def test_a_slice_id_that_is_no_slice_id_names_no_path(name: str, bad: str) -> None:
    with pytest.raises(ValueError, match=exactly(f"not a slice ID (16 hex digits): {bad[:96]!r}")):
        getattr(Layout(), name)(bad)


def test_slice_id_is_the_first_16_hex_digits_of_the_sha256() -> None:
    key = f"{UUID}::0,{UUID}::1"
    assert slice_id(key) == hashlib.sha256(key.encode()).hexdigest()[:16]
    assert slice_id("claim:uid:gpu-2") == "b7ee65dc098106f0"  # stable across restarts
    assert re.fullmatch(r"[0-9a-f]{16}", slice_id("é"))


@pytest.mark.parametrize(("mib", "value"), [(1, "1M"), (8192, "8192M")])
def test_limit_value(mib: int, value: str) -> None:
    assert limit_value(mib) == value


@pytest.mark.parametrize("mib", [0, -1])
def test_a_limit_under_1_mib_is_refused(mib: int) -> None:
    with pytest.raises(ValueError, match=exactly(f"a pinned-memory limit of at least 1 MiB; got {mib}")):
        limit_value(mib)


@pytest.mark.parametrize(("unit", "limit"), [(1024, 1024), (1, 1), (0, 1), (-5, 1)])
def test_probe_limit_mib(unit: int, limit: int) -> None:
    assert probe_limit_mib(unit) == limit


@pytest.mark.parametrize(
    ("units", "total", "pct"),
    [(1, 79, 2), (20, 79, 26), (79, 79, 100), (40, 80, 50), (1, 0, 100), (1, -1, 100),
     (200, 79, 100), (0, 79, 1), (0, 1, 1), (1, 1, 100), (1, 1000, 1), (1, 100, 1), (99, 100, 99),
     (101, 100, 100)],
)  # fmt: skip
def test_thread_pct(units: int, total: int, pct: int) -> None:
    assert thread_pct(units, total) == pct


def test_client_spec() -> None:
    layout = Layout(Path("/r/mps"), Path("/s"))
    pipe = f"/r/mps/slices/{SID}/pipe"
    assert client_spec(layout, SID, 8192) == ClientSpec(
        {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
         "OMATICAYA_GPU_MEMORY_LIMIT_MIB": "8192"},
        (Mount(pipe, pipe), Mount("/dev/shm", f"/r/mps/slices/{SID}/shm")),
    )  # fmt: skip
    with_threads = client_spec(layout, SID, 8192, threads_pct=26)
    assert with_threads.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "26"
    assert list(with_threads.envs)[-1] == "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
    assert not with_threads.mounts[0].read_only and not with_threads.mounts[1].read_only


def test_client_spec_refuses_a_bad_slice() -> None:
    with pytest.raises(ValueError, match="not a slice ID"):
        client_spec(Layout(), "../x", 8192)
    with pytest.raises(ValueError, match="at least 1 MiB"):
        client_spec(Layout(), SID, 0)
