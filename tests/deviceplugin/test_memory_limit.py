"""The driver-enforced per-container GPU memory limit (``core.allocation.memory_limit``): the driver branch
from NVML's version, the r615 gate, the toolkit floor, the two variables the toolkit's
``apply-cuda-memory-limits`` hook reads, the hook entry a CDI spec of ours names, and the edits
for one slice. Pure, so table-driven."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from omaticaya_py.core.allocation import memory_limit as ml
from omaticaya_py.core.allocation.memory_limit import (
    LIMIT_ENV,
    MAX_MIB,
    NO_EDITS,
    REQUEST_ENV,
    CdiHook,
    ContainerEdits,
    common_limit_mib,
    driver_major,
    hook,
    limit_env,
    per_container,
    slice_edits,
    toolkit_has_hook,
    toolkit_version,
)

U0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
U1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
#: the hook's own parse of a value (Go ``strconv.ParseUint(s, 10, 64)`` within MAX_MIB)
HOOK_PARSES = re.compile(r"[0-9]+")


def test_constants_are_the_documented_facts() -> None:
    assert ml.PER_CONTAINER_MIN_DRIVER_MAJOR == 615
    assert ml.TOOLKIT_MIN_VERSION == (1, 20, 1)
    assert (REQUEST_ENV, LIMIT_ENV) == ("NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT")
    assert (ml.HOOK_NAME, ml.HOOK_LIFECYCLE) == ("apply-cuda-memory-limits", "createRuntime")
    # the toolkit's own bound: NVML_DEVICE_MEMORY_LIMIT_MAX / MiB
    assert MAX_MIB == 17592186044415 == 0xFFFFFFFFFFFFFFFF // (1024 * 1024)
    assert MAX_MIB * 2**20 <= 2**64 - 1 < (MAX_MIB + 1) * 2**20
    # the assumptions are stated, and changing one is a deliberate act
    assert ml.ASSUMED_SET_BELOW_MIN_DRIVER_FAILS_CREATION is True
    assert ml.ASSUMED_MPS_CLIENT_MEMORY_CHARGED_TO_CLIENT_CGROUP is True
    assert (ml.DEFAULT_HOOK_PATH, ml.DEFAULT_DRIVER_ROOT) == ("/usr/bin/nvidia-cdi-hook", "/")


@pytest.mark.parametrize(
    ("version", "major"),
    [
        ("580.159.04", 580),
        ("615.71.09", 615),
        ("620.10.01", 620),
        ("580.65", 580),  # two parts: GFD accepts it
        ("470.57.02", 470),
        (" 615.71.09\n", 615),  # surrounding whitespace (a label or nvidia-smi output)
        ("1000.1.1", 1000),
        (None, None),
        ("", None),
        ("615", None),  # no minor: not X.Y[.Z]
        ("615.", None),
        (".71.09", None),
        ("615.71.09.1", None),
        ("v615.71.09", None),
        ("615.71.0a", None),
        ("abc.def", None),
        ("６１５.71.09", None),  # not ASCII digits
        ("615 .71", None),
        ("N/A", None),
    ],
)
def test_driver_major(version: str | None, major: int | None) -> None:
    assert driver_major(version) == major


@pytest.mark.parametrize(
    ("major", "expected"),
    [(None, False), (0, False), (470, False), (580, False), (614, False), (615, True),
     (620, True), (1000, True)],
)  # fmt: skip
def test_per_container(major: int | None, expected: bool) -> None:
    assert per_container(major) is expected


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("580.159.04", False),
        ("614.99.99", False),
        ("615.0.0", True),
        ("615.71.09", True),
        (None, False),
        ("garbage", False),
    ],
)
def test_per_container_from_the_version(version: str | None, expected: bool) -> None:
    assert per_container(driver_major(version)) is expected


@pytest.mark.parametrize(
    ("version", "parsed", "has_hook"),
    [
        ("1.20.1", (1, 20, 1), True),
        ("v1.20.1", (1, 20, 1), True),
        ("v1.20.1-ubuntu20.04", (1, 20, 1), True),  # an image tag with its distribution
        ("v1.20.1-rc.1", (1, 20, 1), True),  # a candidate of the floor's release
        ("1.20.2", (1, 20, 2), True),
        ("1.21.0", (1, 21, 0), True),
        ("2.0.0", (2, 0, 0), True),
        ("1.20.0", (1, 20, 0), False),  # the last release without the hook
        ("v1.19.1", (1, 19, 1), False),
        ("1.18.2", (1, 18, 2), False),
        ("1.20", None, False),
        ("latest", None, False),
        ("", None, False),
        (None, None, False),
        ("1.20.1.4", None, False),
    ],
)
def test_toolkit_version(
    version: str | None, parsed: tuple[int, int, int] | None, has_hook: bool
) -> None:
    assert toolkit_version(version) == parsed
    assert toolkit_has_hook(version) is has_hook


@pytest.mark.parametrize(
    ("mib", "request_mib", "expected"),
    [
        (1, None, {REQUEST_ENV: "1", LIMIT_ENV: "1"}),
        (4096, None, {REQUEST_ENV: "4096", LIMIT_ENV: "4096"}),
        (40960, 20480, {REQUEST_ENV: "20480", LIMIT_ENV: "40960"}),
        (40960, 40960, {REQUEST_ENV: "40960", LIMIT_ENV: "40960"}),
        (MAX_MIB, None, {REQUEST_ENV: str(MAX_MIB), LIMIT_ENV: str(MAX_MIB)}),
    ],
)
def test_limit_env(mib: int, request_mib: int | None, expected: dict[str, str]) -> None:
    env = limit_env(mib, request_mib)
    assert env == expected
    assert list(env) == [REQUEST_ENV, LIMIT_ENV]
    for value in env.values():  # what the hook parses: decimal ASCII, no unit, within MAX_MIB
        assert HOOK_PARSES.fullmatch(value) and int(value) <= MAX_MIB


@pytest.mark.parametrize(
    ("mib", "request_mib", "error", "message"),
    [
        (0, None, ValueError, f"NVIDIA_GPU_MEMORY_LIMIT: 0 MiB is outside 1..{MAX_MIB}"),
        (-1, None, ValueError, f"NVIDIA_GPU_MEMORY_LIMIT: -1 MiB is outside 1..{MAX_MIB}"),
        (MAX_MIB + 1, None, ValueError,
         f"NVIDIA_GPU_MEMORY_LIMIT: {MAX_MIB + 1} MiB is outside 1..{MAX_MIB}"),
        (4096, 0, ValueError, f"NVIDIA_GPU_MEMORY_REQUEST: 0 MiB is outside 1..{MAX_MIB}"),
        # the hook fails creation on request > limit
        (4096, 4097, ValueError,
         "NVIDIA_GPU_MEMORY_REQUEST 4097 MiB is above NVIDIA_GPU_MEMORY_LIMIT 4096 MiB"),
        (4096, MAX_MIB + 1, ValueError,
         f"NVIDIA_GPU_MEMORY_REQUEST: {MAX_MIB + 1} MiB is outside 1..{MAX_MIB}"),
        (True, None, TypeError, "NVIDIA_GPU_MEMORY_LIMIT: MiB must be an int, not bool"),
        (4096.0, None, TypeError, "NVIDIA_GPU_MEMORY_LIMIT: MiB must be an int, not float"),
        ("4096", None, TypeError, "NVIDIA_GPU_MEMORY_LIMIT: MiB must be an int, not str"),
        (4096, False, TypeError, "NVIDIA_GPU_MEMORY_REQUEST: MiB must be an int, not bool"),
    ],
)  # fmt: skip
def test_limit_env_refuses(mib: Any, request_mib: Any, error: type[Exception],
                           message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        limit_env(mib, request_mib)


@pytest.mark.parametrize(
    ("uuids", "kw", "args", "env"),
    [
        (
            [U0], {},
            ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", U0],
            ["NVIDIA_CTK_DEBUG=false"],
        ),
        (
            [U0, U1, U0], {"driver_root": "/run/nvidia/driver", "debug": True},
            ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/run/nvidia/driver",
             "--gpu-id", U0, "--gpu-id", U1],
            ["NVIDIA_CTK_DEBUG=true"],
        ),
        (
            [U1], {"hook_path": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"},
            ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", U1],
            ["NVIDIA_CTK_DEBUG=false"],
        ),
        (
            [U0], {"hook_path": "/usr/bin/nvidia-ctk"},  # the older binary: `nvidia-ctk hook ...`
            ["nvidia-ctk", "hook", "apply-cuda-memory-limits", "--driver-root", "/",
             "--gpu-id", U0],
            ["NVIDIA_CTK_DEBUG=false"],
        ),
    ],
)  # fmt: skip
def test_hook(uuids: list[str], kw: dict[str, Any], args: list[str], env: list[str]) -> None:
    h = hook(uuids, **kw)
    path = kw.get("hook_path", "/usr/bin/nvidia-cdi-hook")
    assert h == CdiHook("createRuntime", path, tuple(args), tuple(env))
    assert h.as_cdi() == {"hookName": "createRuntime", "path": path, "args": args, "env": env}
    json.dumps(h.as_cdi())  # serializable as cdi_spec writes it


def test_hook_as_cdi_leaves_out_an_empty_env() -> None:
    assert CdiHook("createRuntime", "/x", ("x",)).as_cdi() == {
        "hookName": "createRuntime", "path": "/x", "args": ["x"]}  # fmt: skip


NOT_A_GPU = "not a whole-GPU UUID (GPU-...): "


@pytest.mark.parametrize(
    ("uuids", "kw", "message"),
    [
        ([], {}, "the hook needs at least one GPU"),
        ([""], {}, NOT_A_GPU + "''"),
        (["GPU-"], {}, NOT_A_GPU + "'GPU-'"),
        (["0"], {}, NOT_A_GPU + "'0'"),  # an index, not a UUID
        # NVML sets no limit on MIG
        (["MIG-00000000-7fda-b7ae-a94e-630097a14ca4"], {},
         NOT_A_GPU + "'MIG-00000000-7fda-b7ae-a94e-630097a14ca4'"),
        ([" " + U0], {}, NOT_A_GPU + repr(" " + U0)),
        ([U0 + "\n"], {}, NOT_A_GPU + repr(U0 + "\n")),
        (["GPU-0000 0000"], {}, NOT_A_GPU + "'GPU-0000 0000'"),
        ([U0], {"hook_path": "nvidia-cdi-hook"},
         "hook_path must be an absolute host path: 'nvidia-cdi-hook'"),
        ([U0], {"hook_path": "/"}, "hook_path names no binary: '/'"),
        ([U0], {"hook_path": ""}, "hook_path must be an absolute host path: ''"),
        ([U0], {"driver_root": "run/nvidia/driver"},
         "driver_root must be an absolute host path: 'run/nvidia/driver'"),
        ([U0], {"driver_root": ""}, "driver_root must be an absolute host path: ''"),
    ],
)  # fmt: skip
def test_hook_refuses(uuids: list[str], kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hook(uuids, **kw)


@pytest.mark.parametrize(
    ("hook_path", "head"),
    [
        ("/usr/bin/nvidia-ctk/", ["nvidia-ctk", "hook"]),  # a trailing slash: the same binary
        ("/opt/t/nvidia-cdi-hook//", ["nvidia-cdi-hook"]),
        ("/opt/t/hookX", ["hookX"]),  # only slashes are stripped off the end
    ],
)
def test_hook_names_the_binary_at_the_end_of_its_path(hook_path: str, head: list[str]) -> None:
    h = hook([U0], hook_path=hook_path)
    assert h.path == hook_path
    assert list(h.args) == [*head, "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", U0]


@pytest.mark.parametrize(
    ("major", "name_hook", "envs", "hooks"),
    [
        (None, True, {}, ()),  # branch unknown: nothing, the slice rests on MPS
        (580, True, {}, ()),
        (614, False, {}, ()),
        (615, False, {REQUEST_ENV: "8192", LIMIT_ENV: "8192"}, ()),  # the GPU's spec has the hook
        (615, True, {REQUEST_ENV: "8192", LIMIT_ENV: "8192"}, (hook([U0]),)),
        (620, True, {REQUEST_ENV: "8192", LIMIT_ENV: "8192"}, (hook([U0]),)),
    ],
)
def test_slice_edits(
    major: int | None, name_hook: bool, envs: dict[str, str], hooks: tuple[CdiHook, ...]
) -> None:
    edits = slice_edits(U0, 8192, major, name_hook=name_hook)
    assert edits == ContainerEdits(envs, hooks)
    assert bool(edits) is bool(envs)
    assert edits.env_list() == [f"{k}={v}" for k, v in envs.items()]
    if not envs:
        assert edits == NO_EDITS


def test_slice_edits_passes_the_node_layout_to_the_hook() -> None:
    edits = slice_edits(U1, 512, 615, name_hook=True, hook_path="/opt/t/nvidia-cdi-hook",
                        driver_root="/run/nvidia/driver")  # fmt: skip
    assert edits.hooks == (
        hook([U1], hook_path="/opt/t/nvidia-cdi-hook", driver_root="/run/nvidia/driver"),
    )
    assert edits.env_list() == ["NVIDIA_GPU_MEMORY_REQUEST=512", "NVIDIA_GPU_MEMORY_LIMIT=512"]


@pytest.mark.parametrize("major", [None, 580, 615])
@pytest.mark.parametrize(
    ("uuid", "mib", "error"),
    [
        (U0, 0, ValueError),
        (U0, MAX_MIB + 1, ValueError),
        (U0, True, TypeError),
        ("MIG-00000000-7fda-b7ae-a94e-630097a14ca4", 512, ValueError),
        ("", 512, ValueError),
    ],
)
def test_slice_edits_refuses_a_bad_slice_on_any_driver(
    uuid: str, mib: Any, error: type[Exception], major: int | None
) -> None:
    with pytest.raises(error):
        slice_edits(uuid, mib, major, name_hook=True)


@pytest.mark.parametrize(
    ("mibs", "expected"),
    [([4096], 4096), ([4096, 4096], 4096), (iter, 512)],
)
def test_common_limit_mib(mibs: Any, expected: int) -> None:
    # ``iter``: a one-shot iterator, made afresh at each run (a generator in the parameters is
    # spent by a process that runs the test twice, as mutmut's stats and clean runs do)
    if mibs is iter:
        mibs = (m for m in (512, 512, 512))
    assert common_limit_mib(mibs) == expected


@pytest.mark.parametrize(
    ("mibs", "error", "message"),
    [
        ([], ValueError, "no slice"),
        ([8192, 4096, 8192], ValueError,
         "slices of different sizes in one container ([4096, 8192] MiB): the per-container "
         "limit is one value for every GPU"),
        ([0], ValueError, f"NVIDIA_GPU_MEMORY_LIMIT: 0 MiB is outside 1..{MAX_MIB}"),
        ([4096, True], TypeError, "NVIDIA_GPU_MEMORY_LIMIT: MiB must be an int, not bool"),
    ],
)  # fmt: skip
def test_common_limit_mib_refuses(mibs: list[Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        common_limit_mib(mibs)


@pytest.mark.parametrize(
    ("major", "expected"),
    [(None, {}), (580, {}), (614, {}),
     (615, {"NVIDIA_GPU_MEMORY_REQUEST": "8192", "NVIDIA_GPU_MEMORY_LIMIT": "8192"})],
)  # fmt: skip
def test_the_device_plugins_answer_carries_the_drivers_limit_from_r615(
    major: int | None, expected: dict[str, str]
) -> None:
    """Issue 47, item 1: from r615 on, a slice's ``Allocate`` answer also asks the driver's
    per-container limit (the toolkit's hook applies it to the container's cgroup: the sum of
    its processes); below, nothing of it (the variables would mean nothing)."""
    from omaticaya_py.deviceplugin.allocation import DeviceState
    from omaticaya_py.deviceplugin.slicer import Enforcement, Slicer

    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    slicer = Slicer(1024, enforcement=Enforcement(driver_major=lambda: major))
    gpu = DeviceState(uuid, 0, True, free_mib=40960)
    _, spec = slicer.allocate([f"{uuid}::{k}" for k in range(8)], [gpu])
    got = {k: v for k, v in spec.envs.items() if k.startswith("NVIDIA_GPU_MEMORY_")}
    assert got == expected
    assert spec.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
