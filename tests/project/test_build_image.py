"""scripts/build-image: the image built without a Docker daemon agrees with the Dockerfile.

What must agree: ENTRYPOINT, CMD, USER, WORKDIR, EXPOSE, the ENV and LABELs of the final stage,
the Python minor version of the base image, the system user 65532, and the files (the agent's
console script and package, the recorded traces the Dockerfile copies, byte for byte, and
omaticaya-driver-files where the Dockerfile copies it). The image is the docker-archive
scripts/build-image writes (cached under ~/.cache/omaticaya/image; a cold build is ~1.5 min,
plus the Go build of omaticaya-driver-files, and needs root), read with the standard library.
As root, in a chroot of its layer as uid 65532: the image's own Python runs the agent
(``omaticaya show`` on a trace), and the image's omaticaya-driver-files lists a fake driver's
files (tests/dra/driver_root_support.py) as the DRA plugin mounts them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-image"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def final_stage() -> list[tuple[str, str]]:
    """(KEYWORD, args) of the Dockerfile's last stage, continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not buf and not line):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        if keyword.upper() == "FROM":
            out = []
        out.append((keyword.upper(), args.strip()))
        buf = ""
    return out


def dockerfile_all() -> str:
    return (REPO / "Dockerfile").read_text()


def kv(args: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in shlex.split(args))


@pytest.fixture(scope="module")
def image_tar() -> Path:
    if shutil.which("chroot") is None or os.uname().sysname != "Linux":
        pytest.skip("scripts/build-image needs Linux")
    key = subprocess.run(
        [str(SCRIPT), "--print-key"], capture_output=True, text=True, check=True
    ).stdout.strip()
    cache = Path(os.environ.get("OMATICAYA_CACHE") or Path.home() / ".cache" / "omaticaya")
    cached = cache / "image" / f"omaticaya-{VERSION}-{key}.tar"
    if not cached.exists() and os.geteuid() != 0:
        pytest.skip("no cached image, and building one needs root (debootstrap, chroot)")
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    # the tree may change between the two calls (a shared checkout): the name, not the key
    assert path.name.startswith(f"omaticaya-{VERSION}-") and path.is_file(), path
    return path


@pytest.fixture(scope="module")
def image(image_tar: Path) -> dict[str, Any]:
    """The docker-archive's manifest, config and the one layer's members."""
    with tarfile.open(image_tar) as t:
        (manifest,) = json.load(t.extractfile("manifest.json"))
        config = json.load(t.extractfile(manifest["Config"]))
        assert len(manifest["Layers"]) == 1, manifest["Layers"]
        layer = t.extractfile(manifest["Layers"][0])
        with tarfile.open(fileobj=layer, mode="r|*") as lt:
            members: dict[str, tarfile.TarInfo] = {}
            traces: dict[str, bytes] = {}
            passwd = b""
            dpkg_status = b""
            for m in lt:
                name = m.name.removeprefix("./")
                members[name] = m
                if name.startswith("opt/omaticaya/traces/") and m.isfile():
                    traces[name.rsplit("/", 1)[1]] = lt.extractfile(m).read()
                elif name == "etc/passwd":
                    passwd = lt.extractfile(m).read()
                elif name == "var/lib/dpkg/status":
                    dpkg_status = lt.extractfile(m).read()
    return {
        "manifest": manifest,
        "config": config["config"],
        "members": members,
        "traces": traces,
        "passwd": passwd.decode(),
        "dpkg_status": dpkg_status.decode(),
    }


def test_tagged_with_the_project_version(image):
    assert image["manifest"]["RepoTags"] == [f"omaticaya.local/omaticaya:{VERSION}"]


def test_entrypoint_cmd_user_workdir_expose(image):
    stage = final_stage()
    cfg = image["config"]
    last = {k: a for k, a in stage}
    assert cfg["Entrypoint"] == json.loads(last["ENTRYPOINT"])
    assert cfg["Cmd"] == json.loads(last["CMD"])
    assert cfg["User"] == last["USER"]
    # no WORKDIR in the Dockerfile's final stage (python:3.11-slim sets none): "/" or unset
    assert cfg.get("WorkingDir", "") in (
        last.get("WORKDIR", ""),
        "/" if "WORKDIR" not in last else "",
    )
    exposed = {
        f"{p}/tcp" if "/" not in p else p for k, a in stage if k == "EXPOSE" for p in a.split()
    }
    assert set(cfg.get("ExposedPorts") or {}) == exposed


def test_env_and_labels_of_the_dockerfile(image):
    stage = final_stage()
    env = dict(e.split("=", 1) for e in image["config"]["Env"])
    for k, a in stage:
        if k == "ENV":
            for key, value in kv(a).items():
                assert env.get(key) == value, key
    labels = image["config"]["Labels"]
    for k, a in stage:
        if k == "LABEL":
            for key, value in kv(a).items():
                assert labels.get(key) == value.replace("${VERSION}", VERSION), key
    assert labels["org.opencontainers.image.version"] == VERSION
    assert "/usr/local/bin" in env["PATH"].split(":")


def test_python_minor_version_matches_the_base_image(image):
    (base,) = set(re.findall(r"^FROM\s+python:(\d+\.\d+)", dockerfile_all(), re.MULTILINE))
    members = image["members"]
    assert f"usr/bin/python{base}" in members, f"python{base} missing"
    other = {
        m
        for m in members
        if re.fullmatch(r"usr/bin/python3\.\d+", m) and m != f"usr/bin/python{base}"
    }
    assert not other, other
    site = f"usr/local/lib/python{base}/dist-packages"
    assert f"{site}/omaticaya_py/cli/__init__.py" in members
    assert f"{site}/omaticaya-{VERSION}.dist-info/METADATA" in members


#: where the Dockerfile copies omaticaya-driver-files (its driverfiles stage)
DRIVER_FILES = "/usr/local/bin/omaticaya-driver-files"


def test_driver_files_tool_where_the_dockerfile_puts_it(image):
    """omaticaya-driver-files on PATH, executable by anyone (the agent runs as 65532), at the
    path the Dockerfile's final stage copies it to."""
    copies = [a for k, a in final_stage() if k == "COPY" and "--from=driverfiles" in a]
    folder = DRIVER_FILES.rsplit("/", 1)[0]
    assert len(copies) == 1 and copies[0].split()[-1] == folder + "/", copies
    tool = image["members"][DRIVER_FILES.lstrip("/")]
    assert tool.isfile() and tool.mode & 0o755 == 0o755, oct(tool.mode)
    env = dict(e.split("=", 1) for e in image["config"]["Env"])
    assert folder in env["PATH"].split(":")


@pytest.fixture(scope="module")
def rootfs(image_tar: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's one layer, unpacked (root: its files keep their owners)."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    root = tmp_path_factory.mktemp("image") / "rootfs"
    root.mkdir()
    with tarfile.open(image_tar) as t:
        (manifest,) = json.load(t.extractfile("manifest.json"))
        with tarfile.open(fileobj=t.extractfile(manifest["Layers"][0]), mode="r|*") as lt:
            lt.extractall(root, filter="fully_trusted")
    return root


def test_the_images_driver_files_tool_lists_a_fake_driver(rootfs: Path) -> None:
    """The image's omaticaya-driver-files, run as 65532 on the image's glibc, finds a fake
    driver laid out under /drv as the DRA plugin's settings would name it (driver root /drv,
    host root /run/nvidia/driver): every file and link the plugin should mount."""
    from omaticaya_py.dra.drivermounts import driver_mounts
    from tests.dra.driver_root_support import VERSION, make_driver_root

    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    drv = rootfs / "drv"
    try:
        expected = make_driver_root(drv)
        proc = subprocess.run(
            [chroot, "--userspec=65532:65532", str(rootfs), "omaticaya-driver-files",
             "--driver-root", "/drv", "--host-driver-root", "/run/nvidia/driver",
             "--driver-version", VERSION],
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp"},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(drv, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = driver_mounts(json.loads(proc.stdout))
    assert found.version == VERSION
    want = {path: f"/run/nvidia/driver/{file.relative_to(drv)}" for path, file in expected.items()}
    assert {m.container_path: m.host_path for m in found.mounts} == want


def test_files_console_script_user_and_traces(image):
    members = image["members"]
    script = members["usr/local/bin/omaticaya"]
    assert script.isfile() and script.mode & 0o111
    # the Dockerfile's user: system uid/gid 65532, no home, no shell
    entry = [line for line in image["passwd"].splitlines() if line.startswith("omaticaya:")]
    assert entry == ["omaticaya:x:65532:65532::/nonexistent:/usr/sbin/nologin"], entry
    # the traces the Dockerfile copies, byte for byte, readable by anyone
    copied = re.findall(r"tests/data/([\w.-]+-trace\.json)", dockerfile_all())
    assert copied and "/opt/omaticaya/traces/" in dockerfile_all()
    assert sorted(image["traces"]) == sorted(copied)
    for name, data in image["traces"].items():
        assert data == (REPO / "tests" / "data" / name).read_bytes(), name
        assert members[f"opt/omaticaya/traces/{name}"].mode & 0o444 == 0o444
    # only the installed wheel: no source tree, no wheels or pip left behind
    assert not [m for m in members if m.startswith(("omaticaya_py/", "src/", "tmp/wheels"))]
    assert not [m for m in members if m.endswith(".whl")]


def test_the_agent_runs_in_the_image_as_65532(rootfs: Path) -> None:
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    root = rootfs
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "NODE_NAME": "gpu-node-1",
        "OMATICAYA_TRACE": "/opt/omaticaya/traces/h100-trace.json",
    }
    proc = subprocess.run(
        [chroot, "--userspec=65532:65532", str(root), "omaticaya", "show"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NVIDIA-H100-80GB-HBM3" in proc.stdout, proc.stdout[-3000:]
    version = subprocess.run(
        [chroot, "--userspec=65532:65532", str(root), "omaticaya", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert VERSION in version.stdout + version.stderr


def test_python_packages_are_the_lock(image):
    """What the image installed is requirements/image.lock, version for version (pip, which
    build-image runs from its wheel, left out), and the project's wheel."""
    from packaging.utils import canonicalize_name

    from tests.project.dockerfile_support import read_lock

    site = "usr/local/lib/python3.11/dist-packages/"
    installed = {}
    for m in image["members"]:
        hit = re.fullmatch(re.escape(site) + r"([^/]+)-([^/-]+)\.dist-info", m.rstrip("/"))
        if hit:
            installed[canonicalize_name(hit.group(1))] = hit.group(2)
    locked = {n: p.version for n, p in read_lock(REPO / "requirements" / "image.lock").items()}
    locked.pop("pip")
    assert installed.pop("omaticaya") == VERSION
    assert installed == locked


def test_debian_packages_are_the_base_lock(image):
    """The image's dpkg database is requirements/debian-base.lock's package list."""
    status = {}
    for stanza in image["dpkg_status"].split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.MULTILINE))
        if fields.get("Package") and "installed" in fields.get("Status", ""):
            status[fields["Package"]] = fields["Version"]
    lock = (REPO / "requirements" / "debian-base.lock").read_text().splitlines()
    locked = dict(
        line.split(" ", 1) for line in lock
        if line and not line.startswith(("#", "release ", "packages-sha256 "))
    )  # fmt: skip
    assert status == locked


def test_push_copies_the_image_to_a_reference(image_tar: Path, tmp_path: Path):
    """``--push REF``: the one command docs/install.md gives to put the image in a registry;
    here the reference is an OCI layout (skopeo's ``oci:`` transport: no registry in a test),
    whose one manifest is the image's own config."""
    ref = f"oci:{tmp_path / 'layout'}:v1"
    proc = subprocess.run([str(SCRIPT), "--push", ref], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == ref
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "v1"
    bad = subprocess.run([str(SCRIPT), "--push"], capture_output=True, text=True)
    assert bad.returncode == 1 and "usage: scripts/build-image --push REF" in bad.stderr
