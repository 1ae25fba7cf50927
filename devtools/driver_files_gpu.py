"""A CUDA program and nvidia-smi run in a root that has the NVIDIA driver's files only as the DRA
plugin's CDI spec mounts them (issue 52, item 9): devtools/gpu-check.sh's ``driver files`` step,
on a machine with a GPU, as root.

1. ``omaticaya-driver-files --driver-root / --driver-version <nvidia-smi's>`` (the binary
   ``devtools/gpu-check.sh --wheels`` carries in ``.whl/``, or ``$OMATICAYA_DRIVER_FILES_TOOL``)
   lists the driver's files, ``omaticaya_py.dra.drivermounts`` makes them the claim's mounts.
2. In a mount namespace of its own, a new root: the host's ``/usr``, ``/lib*``, ``/bin``,
   ``/sbin``, ``/etc``, ``/opt``, ``/tmp`` (the venv) and the repository bound read-only, a
   ``/dev`` with ``null``, ``zero``, ``urandom`` and the ``nvidia*`` nodes, ``/proc``; every file
   of the driver's there is masked (an empty file bound over each: those ``ldconfig -p`` lists
   as NVIDIA's or CUDA's, ``nvidia-*`` binaries, the mount list's paths), and so is
   ``/etc/ld.so.cache`` (an image's cache knows no driver library: the loader must find them in
   its default folders, as in a container with no ``update-ldcache`` hook).
3. The claim's mounts, read-only, over that; then, chrooted there, ``nvidia-smi -L`` and
   ``tests/gpu_kernels.Cuda`` (cuInit, a PTX module JIT-compiled by the driver, a kernel on
   every SM for 1 s).

Prints what it did; exits 0 when both ran, 1 otherwise (each failure said), 2 when it cannot
try (not root, no tool, no GPU).

    devtools/driver_files_gpu.py [--python VENV_PYTHON] [--driver-root DIR --driver-version V]

(``--driver-root`` and ``--driver-version``: another root than ``/`` and a version not asked of
``nvidia-smi``, to try the steps out on a fake driver without a GPU.)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omaticaya_py.dra.drivermounts import driver_mounts  # noqa: E402

_LIBC = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000
KERNEL = ("import sys; from tests.gpu_kernels import Cuda; c = Cuda.open(0); "
          "print('cuda:', 'FAILED ' + Cuda.why if c is None else f'{c.sm_count} SMs, spin ran "
          "{c.spin(1.0, blocks=c.sm_count * 8, threads=256):.2f} s'); sys.exit(c is None)")  # fmt: skip


def mount(src: str, dst: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    """mount(2). Raises ``OSError``."""
    if _LIBC.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:  # fmt: skip
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


def bind(src: str, dst: str, *, read_only: bool = True, recursive: bool = False) -> None:
    """Bind ``src`` on ``dst`` (a file or folder made to match), read-only by a remount."""
    target = Path(dst)
    if Path(src).is_dir() and not Path(src).is_socket():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch()
    mount(src, dst, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount("none", dst, MS_BIND | MS_REMOUNT | MS_RDONLY)


def driver_library_paths() -> set[str]:
    """The NVIDIA and CUDA driver libraries ``ldconfig -p`` knows, and the NVIDIA binaries on
    PATH folders."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    found = {line.rsplit("=> ", 1)[1].strip() for line in out.splitlines()
             if "=> " in line and re.search(r"lib(cuda|nvidia|nvcuvid|nvoptix)", line)}  # fmt: skip
    for d in ("/usr/bin", "/usr/sbin", "/bin", "/usr/local/bin"):
        found |= {str(p) for p in Path(d).glob("nvidia-*")}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the venv's python (tests.gpu_kernels)")
    parser.add_argument("--driver-root", default="/", help="the driver's root (default /)")
    parser.add_argument("--driver-version", default="", help="default: nvidia-smi's")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("driver files: needs root (a mount namespace, chroot)")
        return 2
    tool = os.environ.get("OMATICAYA_DRIVER_FILES_TOOL") or shutil.which("omaticaya-driver-files") \
        or str(ROOT / ".whl" / "omaticaya-driver-files")  # fmt: skip
    smi = shutil.which("nvidia-smi")
    if not Path(tool).is_file() or (smi is None and not args.driver_version):
        print(f"driver files: cannot try: tool {tool} {'found' if Path(tool).is_file() else 'missing'}, nvidia-smi {smi}")
        return 2
    version = args.driver_version or subprocess.run(
        [str(smi), "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=True).stdout.split()[0]  # fmt: skip
    proc = subprocess.run([tool, "--driver-root", args.driver_root, "--driver-version", version],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        print(f"driver files: FAILED: the tool found nothing: {proc.stderr.strip()}")
        return 1
    found = driver_mounts(json.loads(proc.stdout))
    print(f"driver files: driver {found.version}, {len(found.mounts)} mounts; left out: {list(found.skipped)}")
    for m in found.mounts:
        print(f"  {m.container_path} <- {m.host_path}")
    return run_in_new_root(found.mounts, os.path.abspath(args.python))


def run_in_new_root(mounts: tuple, python: str) -> int:
    """Steps 2 and 3 in a child (its own mount namespace); its exit status."""
    work = tempfile.mkdtemp(prefix="omaticaya-claim-")
    pid = os.fork()
    if pid:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        shutil.rmtree(work, ignore_errors=True)  # its mounts went with the child's namespace
        return status
    try:
        if _LIBC.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        mount("none", "/", MS_REC | MS_PRIVATE)
        new, upper = f"{work}/root", f"{work}/upper"
        os.mkdir(new)
        os.mkdir(upper)
        mount("tmpfs", new, 0, "tmpfs")
        # the system, the repository, the venv and PYTHONPATH's folders (not all of /tmp: the
        # new root is there)
        extra = [str(Path(python).parent.parent), str(Path(os.path.realpath(python)).parent.parent),
                 *os.environ.get("PYTHONPATH", "").split(":")]  # fmt: skip
        system = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt"]
        mount("tmpfs", upper, 0, "tmpfs")
        for d in dict.fromkeys([*system, str(ROOT), *[e for e in extra if e]]):
            if any(d != s and d.startswith(s + "/") for s in system):
                continue
            if Path(d).is_symlink():
                Path(new + d).parent.mkdir(parents=True, exist_ok=True)
                Path(new + d).symlink_to(os.readlink(d))
            elif Path(d).is_dir() and d in system:
                # the image's folders: the host's below, writes (mount points) in a tmpfs above,
                # as a container's root filesystem is
                name = d.strip("/").replace("/", "_")
                for sub in ("u", "w"):
                    Path(upper, name, sub).mkdir(parents=True)
                Path(new + d).mkdir(parents=True)
                mount("overlay", new + d, 0, "overlay",
                      f"lowerdir={d},upperdir={upper}/{name}/u,workdir={upper}/{name}/w")
            elif Path(d).is_dir():
                bind(d, new + d, recursive=True)
        dev = Path(new, "dev")
        dev.mkdir()
        mount("tmpfs", str(dev), 0, "tmpfs")
        for node in ["null", "zero", "urandom", *[p.name for p in Path("/dev").glob("nvidia*") if p.is_char_device()]]:
            bind(f"/dev/{node}", f"{dev}/{node}", read_only=False)
        Path(new, "tmp").mkdir(exist_ok=True)  # a container's writable /tmp
        mount("tmpfs", new + "/tmp", 0, "tmpfs")
        Path(new, "proc").mkdir()
        mount("proc", new + "/proc", 0, "proc")
        empty = Path(new, ".empty")
        empty.touch()
        masked = driver_library_paths() | {m.container_path for m in mounts} | {"/etc/ld.so.cache"}
        for path in sorted(masked):
            if Path(new + path).exists():
                bind(str(empty), new + path)
        print(f"driver files: masked {len(masked)} driver paths and /etc/ld.so.cache in the new root")
        for m in mounts:
            bind(m.host_path, new + m.container_path)
        os.chroot(new)
        os.chdir(str(ROOT))
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/tmp", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, env=env, check=False)
        print(f"nvidia-smi -L: rc={smi.returncode}: {(smi.stdout + smi.stderr).strip()}")
        kernel = subprocess.run([python, "-c", KERNEL], capture_output=True, text=True, env=env, check=False)
        print(f"{(kernel.stdout + kernel.stderr).strip()} (rc={kernel.returncode})")
        os._exit(0 if smi.returncode == 0 and kernel.returncode == 0 else 1)
    except BaseException as exc:  # noqa: BLE001 - the child says why and exits
        print(f"driver files: FAILED preparing the root: {exc!r}")
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
