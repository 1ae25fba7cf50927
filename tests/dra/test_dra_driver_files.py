"""Issue 52, item 9: a prepared claim's containers get the NVIDIA driver's files without any
runtime hook (omaticaya_py/dra/drivermounts.py: pure; driverfiles.py: the tool run at start;
cdi.py and prepare.py: the claim's CDI spec).

The pure part is table-driven: the tool's output (the NVIDIA container toolkit's common CDI
edits, as cmd/driverfiles prints them) -> read-only mounts, links turned into mounts of the
files they name. The tool itself runs for real, built from cmd/driverfiles
(``scripts/build-driver-files``), on a fake driver root whose libraries are ELF shared objects
with the driver's SONAMEs (tests/dra/driver_root_support.py); skipped, saying why, where Go or a
C compiler is missing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from omaticaya_py.core.allocation.mps import Mount
from omaticaya_py.core.config.settings import Settings, SettingsError, load
from omaticaya_py.core.publish.dra import DraDevice
from omaticaya_py.dra.cdi import common_edits
from omaticaya_py.dra.driverfiles import TOOL, DriverFiles
from omaticaya_py.dra.drivermounts import MAX_HOPS, driver_mounts, driver_version, links
from omaticaya_py.dra.metrics import DraCounters, DraCounts
from omaticaya_py.dra.prepare import ClaimRef, NodeFacts, cdi_spec, decide
from tests.dra.dra_prepare_support import check_cdi
from tests.dra.driver_root_support import LIBDIR, VERSION, driver_files_tool, make_driver_root

L = "/usr/lib/x86_64-linux-gnu"
V = "580.65.06"
HOST = "/run/nvidia/driver"


def mount(path: str, host: str | None = None) -> dict[str, Any]:
    """The toolkit's mount of ``path`` from ``host`` (default: under HOST)."""
    return {"hostPath": host or HOST + path, "containerPath": path,
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}  # fmt: skip


def symlinks(*pairs: str) -> dict[str, Any]:
    """The toolkit's create-symlinks hook with ``--link`` each of ``pairs``."""
    args = ["nvidia-cdi-hook", "create-symlinks"]
    for p in pairs:
        args += ["--link", p]
    return {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": args}


def doc(mounts: list[dict[str, Any]], hooks: list[dict[str, Any]] | None = None, *,
        version: str = "", root: str = HOST, **edits: Any) -> dict[str, Any]:  # fmt: skip
    return {"driverRoot": "/host/driver-root", "hostDriverRoot": root, "driverVersion": version,
            "containerEdits": {"mounts": mounts, "hooks": hooks or [], **edits}}  # fmt: skip


def ro(path: str, host: str | None = None) -> Mount:
    return Mount(path, host or HOST + path, read_only=True)


# -- the tool's output -> mounts (pure) -------------------------------------------------------

CUDA = f"{L}/libcuda.so.{V}"
NVML = f"{L}/libnvidia-ml.so.{V}"

MOUNT_CASES = [
    # (id, the tool's output, the mounts, what is said to be left out)
    ("files-as-they-are",
     doc([mount(CUDA), mount("/usr/bin/nvidia-smi"), mount("/run/nvidia-persistenced/socket")]),
     [ro("/run/nvidia-persistenced/socket"), ro("/usr/bin/nvidia-smi"), ro(CUDA)], []),
    ("soname-and-so-links-become-mounts-of-the-library",
     doc([mount(CUDA)], [symlinks(f"libcuda.so.1::{L}/libcuda.so", f"libcuda.so.{V}::{L}/libcuda.so.1")]),
     [ro(f"{L}/libcuda.so", HOST + CUDA), ro(f"{L}/libcuda.so.1", HOST + CUDA), ro(CUDA)], []),
    ("an-absolute-link-target",
     doc([mount(NVML)], [symlinks(f"{NVML}::/usr/lib64/libnvidia-ml.so.1")]),
     [ro(NVML), ro("/usr/lib64/libnvidia-ml.so.1", HOST + NVML)], []),
    ("a-relative-target-through-another-folder",
     doc([mount(NVML)], [symlinks(f"../x86_64-linux-gnu/libnvidia-ml.so.{V}::/usr/lib/other/libnvidia-ml.so.1")]),
     [ro("/usr/lib/other/libnvidia-ml.so.1", HOST + NVML), ro(NVML)], []),
    ("the-marker-mount-and-env-are-dropped",
     doc([mount(CUDA), mount("/var/run/nvidia-container-devices/void", "/dev/null")],
         env=["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={L}"],
         deviceNodes=[{"path": "/dev/nvidiactl"}]),
     [ro(CUDA)], []),
    ("the-mps-pipe-folder-is-left-out",
     doc([mount(CUDA), mount("/tmp/nvidia-mps")]), [ro(CUDA)], ["/tmp/nvidia-mps: the MPS pipe folder"]),
    ("a-host-path-outside-the-root-is-left-out",
     doc([mount(CUDA), mount("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")]),
     [ro(CUDA)], ["/usr/bin/nvidia-smi -> /usr/bin/nvidia-smi: not under the host's driver root"]),
    ("the-root-slash-holds-everything",
     doc([mount(CUDA, CUDA), mount("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")], root="/"),
     [ro("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"), ro(CUDA, CUDA)], []),
    ("a-link-to-no-file-is-left-out",
     doc([mount(CUDA)], [symlinks(f"libGLX_nvidia.so.{V}::{L}/libGLX_indirect.so.0")]),
     [ro(CUDA)], [f"link {L}/libGLX_indirect.so.0 -> libGLX_nvidia.so.{V}: names no file"]),
    ("a-loop-of-links-is-left-out",
     doc([mount(CUDA)], [symlinks(f"b::{L}/a", f"a::{L}/b")]),
     [ro(CUDA)], [f"link {L}/a -> b: names no file", f"link {L}/b -> a: names no file"]),
    ("a-link-over-a-mounted-file-keeps-the-file",
     doc([mount(CUDA), mount(f"{L}/libcuda.so.1", HOST + "/elsewhere")], [symlinks(f"libcuda.so.{V}::{L}/libcuda.so.1")]),
     [ro(f"{L}/libcuda.so.1", HOST + "/elsewhere"), ro(CUDA)], []),
    ("a-container-path-twice-is-mounted-once",
     doc([mount(CUDA), mount(CUDA, HOST + "/second")]), [ro(CUDA)], []),
    ("other-hooks-are-ignored",
     doc([mount(CUDA)], [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                          "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", L]}]),
     [ro(CUDA)], []),
    ("nothing-found", doc([]), [], []),
]  # fmt: skip


@pytest.mark.parametrize(("out", "want", "said"), [c[1:] for c in MOUNT_CASES],
                         ids=[c[0] for c in MOUNT_CASES])  # fmt: skip
def test_driver_mounts(out: dict[str, Any], want: list[Mount], said: list[str]) -> None:
    got = driver_mounts(out)
    assert list(got.mounts) == want
    assert all(m.read_only for m in got.mounts)
    assert len(got.skipped) == len(said)
    for line, part in zip(got.skipped, said, strict=True):
        assert part in line, (line, part)


def test_a_chain_longer_than_the_bound_is_left_out() -> None:
    names = [f"{L}/l{i}" for i in range(MAX_HOPS + 1)]
    pairs = [f"{names[i + 1]}::{names[i]}" for i in range(MAX_HOPS)] + [f"{CUDA}::{names[-1]}"]
    got = driver_mounts(doc([mount(CUDA)], [symlinks(*pairs)]))
    assert ro(names[-1], HOST + CUDA) in got.mounts  # one hop
    assert ro(names[0], HOST + CUDA) not in got.mounts  # MAX_HOPS + 1 hops
    assert any(names[0] in s for s in got.skipped)


VERSION_CASES = [
    ("given", "575.57.08", [ro(CUDA)], "575.57.08"),
    ("from-libcuda", "", [ro(NVML), ro(CUDA)], V),
    ("from-libnvidia-ml-without-libcuda", "", [ro(NVML)], V),
    ("not-a-version-suffix", "", [ro(f"{L}/libcuda.so.1"), ro(f"{L}/libcuda.so")], ""),
    ("none", "", [ro("/usr/bin/nvidia-smi")], ""),
]  # fmt: skip


@pytest.mark.parametrize(("given", "mounts", "want"), [c[1:] for c in VERSION_CASES],
                         ids=[c[0] for c in VERSION_CASES])  # fmt: skip
def test_driver_version(given: str, mounts: list[Mount], want: str) -> None:
    assert driver_version(given, mounts) == want


BAD_CASES = [
    ("no-root", {"containerEdits": {}}, "hostDriverRoot"),
    ("relative-root", {"hostDriverRoot": "run/nvidia", "containerEdits": {}}, "hostDriverRoot"),
    ("no-edits", {"hostDriverRoot": "/"}, "containerEdits"),
    ("mounts-not-a-list", doc({}), "mounts"),
    ("a-mount-without-paths", doc([{"hostPath": "/x"}]), "not a CDI mount"),
    ("a-relative-container-path", doc([mount("usr/bin/x", HOST + "/x")]), "not absolute"),
    ("hooks-not-a-list", {**doc([]), "containerEdits": {"mounts": [], "hooks": {}}}, "hooks"),
    ("a-hook-not-an-object", doc([], hooks=["x"]), "not a CDI hook"),
    ("a-link-without-separator", doc([], [symlinks("libcuda.so.1")]), "<target>::"),
    ("a-relative-link", doc([], [symlinks("libcuda.so.1::libcuda.so")]), "<target>::"),
    ("version-not-a-string", {**doc([]), "driverVersion": 580}, "driverVersion"),
]  # fmt: skip


@pytest.mark.parametrize(("out", "where"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_not_the_tools_output(out: dict[str, Any], where: str) -> None:
    with pytest.raises(ValueError, match=where.replace("<", ".").replace(">", ".")):
        driver_mounts(out)


def test_links_reads_only_create_symlinks() -> None:
    hooks = [symlinks(f"a::{L}/b"), {"args": ["nvidia-cdi-hook", "update-ldcache", "--link", "x::/y"]}]
    assert links(hooks) == [("a", f"{L}/b")]


# -- the claim's CDI spec ------------------------------------------------------------------------

NODE = "gpu-node-1"
UID = "7d1b0c4e-1111-4d7e-9a52-2b8c1f0e7d61"
REF = ClaimRef("team-a", "files", UID)
G0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
G1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
DEVICES = (DraDevice("gpu-0", 0, None, G0, G0, None, False, 81559, 80896),
           DraDevice("gpu-1", 1, None, G1, G1, None, False, 81559, 80896))  # fmt: skip
FILES = (ro(CUDA), ro(f"{L}/libcuda.so.1", HOST + CUDA), ro("/usr/bin/nvidia-smi"))


def claim(*devices: str) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": "gpu.omaticaya.io", "pool": NODE, "device": d} for d in devices]
    return {"metadata": {"namespace": REF.namespace, "name": REF.name, "uid": UID},
            "status": {"allocation": {"devices": {"results": results}}}}  # fmt: skip


@pytest.mark.parametrize("devices", [("gpu-0",), ("gpu-0", "gpu-1")])
def test_the_claims_spec_mounts_the_files_once(devices: tuple[str, ...]) -> None:
    prepared = decide(claim(*devices), REF, DEVICES, NodeFacts(NODE, driver_mounts=FILES))
    assert prepared.driver_mounts == FILES
    spec = cdi_spec(prepared)
    check_cdi(spec)
    assert spec["containerEdits"] == {"mounts": [
        {"hostPath": HOST + CUDA, "containerPath": CUDA, "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": HOST + CUDA, "containerPath": f"{L}/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]},
        {"hostPath": f"{HOST}/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi",
         "options": ["ro", "nosuid", "nodev", "bind"]},
    ]}  # fmt: skip
    # the devices' own edits are what they were: env and device nodes, no driver file
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-{d}" for d in devices]
    assert not [d for d in spec["devices"] if "mounts" in d["containerEdits"]]


def test_no_files_no_spec_wide_edits() -> None:
    spec = cdi_spec(decide(claim("gpu-0"), REF, DEVICES, NodeFacts(NODE)))
    assert "containerEdits" not in spec
    assert common_edits(()) == {}


def test_a_claim_of_no_device_of_ours_has_no_files() -> None:
    doc_ = claim()
    prepared = decide(doc_, REF, DEVICES, NodeFacts(NODE, driver_mounts=FILES))
    assert prepared.devices == () and "containerEdits" not in cdi_spec(prepared)


# -- the settings ----------------------------------------------------------------------------


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert (s.dra_driver_files, s.dra_driver_root, s.dra_driver_host_root) == (True, Path("/"), Path("/"))
    monkeypatch.setenv("OMATICAYA_DRA_DRIVER_FILES", "false")
    monkeypatch.setenv("OMATICAYA_DRA_DRIVER_ROOT", "/host/driver-root")
    monkeypatch.setenv("OMATICAYA_DRA_DRIVER_HOST_ROOT", "/run/nvidia/driver")
    s = load(Settings)
    assert (s.dra_driver_files, s.dra_driver_root, s.dra_driver_host_root) == (
        False, Path("/host/driver-root"), Path("/run/nvidia/driver"))


@pytest.mark.parametrize("name", ["OMATICAYA_DRA_DRIVER_ROOT", "OMATICAYA_DRA_DRIVER_HOST_ROOT"])
@pytest.mark.parametrize("value", ["run/nvidia/driver", "/run/../driver"])
def test_a_driver_root_must_be_absolute(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        load(Settings)


# -- the tool, run for real on a fake driver root --------------------------------------------


@pytest.fixture(scope="module")
def tool() -> Path:
    return driver_files_tool()


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """The log lines (INFO and above) while the test runs."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    yield lines
    logger.remove(sink)


def files(tmp: Path, tool: Path, *, enabled: bool = True, host: str | None = None) -> tuple[DriverFiles, DraCounts]:
    settings = Settings(dra_driver_files=enabled, dra_driver_root=tmp, dra_driver_host_root=Path(host or tmp))
    counts = DraCounts()
    return DriverFiles(settings, counts, which=lambda name: str(tool) if name == TOOL else None), counts


def gauge(counts: DraCounts) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in DraCounters(counts).collect()
            if f.name == "omaticaya_dra_driver_files" for s in f.samples]  # fmt: skip


def test_the_tool_finds_the_fake_driver_as_the_toolkit_does(tmp_path: Path, tool: Path) -> None:
    root = tmp_path / "r"
    expected = make_driver_root(root)
    df, counts = files(root, tool, host=HOST)
    found = df.load()
    assert found is not None and found.version == VERSION
    want = {path: HOST + "/" + str(file.relative_to(root)) for path, file in expected.items()}
    assert {m.container_path: m.host_path for m in found.mounts} == want
    assert all(m.read_only for m in found.mounts)
    assert not [m for m in found.mounts if m.container_path.startswith("/tmp/nvidia-mps")]
    assert counts.driver_files == (VERSION, len(want))
    assert gauge(counts) == [({"driver_version": VERSION}, float(len(want)))]
    # what a claim gets: the same, without running the tool again
    assert df.mounts(VERSION) == found.mounts and df.mounts(None) == found.mounts


def test_the_readings_version_is_the_one_mounted(tmp_path: Path, tool: Path) -> None:
    root = tmp_path / "r"
    make_driver_root(root)
    make_driver_root(root / "old", "550.54.15")  # another version's files are not this driver's
    df, counts = files(root, tool)
    assert df.load(VERSION) is not None
    assert {m.container_path for m in df.mounts(VERSION)} >= {f"/{LIBDIR}/libcuda.so.{VERSION}"}
    # a reading of a version whose files are not there: run once for it, then nothing
    assert df.mounts("999.1.2") == () and counts.driver_files == ("", 0)
    assert df.mounts("999.1.2") == () and df.runs == 2
    # back to the version found: what was found for it, not run again
    assert df.mounts(VERSION) != () and counts.driver_files is not None and counts.driver_files[0] == VERSION
    assert df.runs == 2


def test_no_driver_is_said_and_counted(tmp_path: Path, tool: Path, log_lines: list[str]) -> None:
    (tmp_path / "empty").mkdir()
    df, counts = files(tmp_path / "empty", tool)
    assert df.load() is None and df.mounts("580.159.04") == ()
    assert counts.driver_files == ("", 0)
    assert gauge(counts) == [({"driver_version": ""}, 0.0)]
    text = "\n".join(log_lines)
    assert "no NVIDIA driver files found under" in text and "libcuda.so" in text
    assert "NVIDIA_VISIBLE_DEVICES only" in text


def test_a_missing_tool_is_said(tmp_path: Path, log_lines: list[str]) -> None:
    counts = DraCounts()
    df = DriverFiles(Settings(dra_driver_root=tmp_path), counts, which=lambda _name: None)
    assert df.load() is None and df.mounts(None) == () and counts.driver_files == ("", 0)
    assert f"{TOOL} is not on PATH" in "\n".join(log_lines)


def test_off_runs_nothing_and_has_no_gauge(tmp_path: Path, tool: Path) -> None:
    root = tmp_path / "r"
    make_driver_root(root)
    df, counts = files(root, tool, enabled=False)
    assert df.load() is None and df.mounts(VERSION) == ()
    assert counts.driver_files is None and gauge(counts) == []


def test_the_tools_output_is_json_the_pure_part_reads(tmp_path: Path, tool: Path) -> None:
    import subprocess

    root = tmp_path / "r"
    make_driver_root(root)
    proc = subprocess.run([str(tool), "--driver-root", str(root), "--host-driver-root", HOST],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    out = json.loads(proc.stdout)
    assert (out["driverRoot"], out["hostDriverRoot"], out["driverVersion"]) == (str(root), HOST, "")
    hooks = out["containerEdits"]["hooks"]
    assert [h["args"][1] for h in hooks] == ["create-symlinks"]  # every other hook is off
    assert all(m["hostPath"].startswith(HOST + "/") or m["hostPath"] == "/dev/null"
               for m in out["containerEdits"]["mounts"])  # fmt: skip
    bad = subprocess.run([str(tool), "--driver-root", "relative"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr
