"""A fake NVIDIA driver root, laid out as a driver installed on a Debian or Ubuntu host (or in
the GPU Operator's driver container) lays out its files, and the driver-files tool built from
cmd/driverfiles (``scripts/build-driver-files``, cached): shared by
tests/dra/test_dra_driver_files.py and tests/dra/test_dra_driver_files_kubelet.py.

The libraries are real ELF shared objects (``cc -shared``) with the SONAMEs the driver's have
(the toolkit reads a library's SONAME to name its links), each with its symbolic links as the
driver's installer makes them; the binaries are shell scripts; the GSP firmware and the
persistenced socket are where the driver puts them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: tests/data/h100-trace.json's driver (nvmlSystemGetDriverVersion)
VERSION = "580.159.04"
LIBDIR = "usr/lib/x86_64-linux-gnu"
#: the fake driver's libraries: name -> SONAME major
LIBRARIES = {"libcuda": "1", "libnvidia-ml": "1", "libnvidia-ptxjitcompiler": "1",
             "libcudadebugger": "1", "libnvidia-nvvm": "4"}  # fmt: skip
BINARIES = ("nvidia-smi", "nvidia-debugdump")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")


def make_driver_root(root: Path, version: str = VERSION) -> dict[str, Path]:
    """Lay out a fake driver of ``version`` under ``root``; returns what the DRA plugin should
    mount: container path -> the file under ``root`` it is (a link's path -> the library it
    names). Also makes the MPS pipe folder ``tmp/nvidia-mps``, which must not be mounted.
    Skips the test without a C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler: the fake driver's libraries are ELF shared objects")
    lib = root / LIBDIR
    lib.mkdir(parents=True)
    expected: dict[str, Path] = {}
    for name, major in LIBRARIES.items():
        real = lib / f"{name}.so.{version}"
        src = root / f"{name}.c"
        src.write_text(f'const char *omaticaya_fake = "{name} {version}";\n')
        subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{name}.so.{major}", "-o", str(real),
                        str(src)], check=True, capture_output=True)  # fmt: skip
        src.unlink()
        (lib / f"{name}.so.{major}").symlink_to(real.name)
        expected[f"/{LIBDIR}/{real.name}"] = real
        expected[f"/{LIBDIR}/{name}.so.{major}"] = real
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    expected[f"/{LIBDIR}/libcuda.so"] = lib / f"libcuda.so.{version}"
    (root / "usr" / "bin").mkdir(parents=True)
    for name in BINARIES:
        path = root / "usr" / "bin" / name
        path.write_text(f"#!/bin/sh\necho '{name} of the fake driver {version}'\n")
        path.chmod(0o755)
        expected[f"/usr/bin/{name}"] = path
    firmware = root / "lib" / "firmware" / "nvidia" / version
    firmware.mkdir(parents=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(f"firmware {name} {version}".encode())
        expected[f"/lib/firmware/nvidia/{version}/{name}"] = firmware / name
    sock = root / "run" / "nvidia-persistenced" / "socket"
    sock.parent.mkdir(parents=True)
    # bound in a short folder, then moved: a unix socket's path is at most 107 bytes, and a
    # test's tmp path under pytest-xdist (popen-gwN/...) can be longer
    with tempfile.TemporaryDirectory(prefix="omd-", dir="/tmp") as short:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(f"{short}/s")
        os.rename(f"{short}/s", sock)
    expected["/run/nvidia-persistenced/socket"] = sock
    (root / "tmp" / "nvidia-mps").mkdir(parents=True)
    return expected


def driver_files_tool() -> Path:
    """``omaticaya-driver-files``, built by ``scripts/build-driver-files`` (cached: a second
    build only checks). Skips the test, saying why, where it cannot be built (no Go, no C
    compiler, no module proxy)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-driver-files")], capture_output=True,
                          text=True, timeout=900, check=False)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"omaticaya-driver-files cannot be built here: {proc.stderr.strip()[-300:]}")
    return Path(proc.stdout.strip().splitlines()[-1])
