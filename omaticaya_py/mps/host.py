"""The MPS supervisor's side of the host: the folders it makes (each remembered, parents such as
``/run/omaticaya`` included, to remove them at ``tear_down``), its mounts (each slice's tmpfs,
the host root's ``mount --rbind``), its lock (an exclusive ``flock`` on ``<state
dir>/supervisor.lock``), and the removal of a slice's folder.

``host_root``: where the host's root is seen in this container when not at the root's own path
(``supervisor``'s module docstring says why): the folders and the tmpfs mounts are made there,
and that folder bound at the root's path (``HostFolders.host`` maps a path under the root to
the host's side).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import IO

from loguru import logger
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_fixed

from ..core.allocation.mps import SLICE_ID_RE, Layout
from .daemon import DIR_MODE

__all__ = ["REMOVE_TRIES", "REMOVE_WAIT_S", "HostFolders", "MpsError", "remove_tree"]

#: tries and the wait between them (seconds) of ``remove_tree``
REMOVE_TRIES = 5
REMOVE_WAIT_S = 0.2


class MpsError(Exception):
    """The supervisor cannot set up (a mount refused, a folder that cannot be made, another
    supervisor holding the lock); the message says what and why, in one line."""


class HostFolders:
    """What the supervisor made on the host under ``layout`` (seen at ``host_root`` when given
    and not the root itself): folders, mounts, the lock. One thread calls it."""

    def __init__(self, layout: Layout, host_root: Path | None) -> None:
        self.layout = layout
        self.host_root = host_root if host_root is not None and host_root != layout.root else None
        self.created: list[Path] = []
        self.mounted: list[tuple[Path, bool]] = []  # (mount point, with its submounts)
        self.lock_file: IO[bytes] | None = None

    def set_up(self) -> None:
        """Make the state folder, take the lock, bind the host's root (``host_root``), make the
        slices' and the requests' folders. Raises ``MpsError`` (what was done stays done:
        ``tear_down`` undoes it)."""
        self.makedirs(self.layout.state_dir)
        self.take_lock()
        if self.host_root is not None:  # the host's folder, seen elsewhere in here
            self.makedirs(self.host_root / "slices")
            self.makedirs(self.layout.root)
            self.mount(["--rbind", str(self.host_root), str(self.layout.root)],
                       f"binding {self.host_root} at {self.layout.root}")  # fmt: skip
            self.mounted.append((self.layout.root, True))
        self.makedirs(self.layout.slices_dir)
        self.makedirs(self.layout.requests_dir)

    def tear_down(self) -> None:
        """Remove every slice folder left, unmount what ``set_up`` mounted, let go of the lock,
        remove every folder made (not the plugins' requests). Never raises: what cannot be
        undone is logged."""
        self.sweep_slices()
        for path, recursive in reversed(self.mounted):
            umount(path, recursive)
        self.mounted.clear()
        if self.lock_file is not None:
            # removed first, while held: a reader finds no lock file (a clean stop), not a
            # lock nobody holds (a supervisor that died)
            with contextlib.suppress(OSError):
                self.layout.lock.unlink()
            self.lock_file.close()  # the flock goes with it
            self.lock_file = None
        for path in reversed(self.created):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY and path in (self.layout.requests_dir,
                                                             *self.layout.requests_dir.parents):  # fmt: skip
                    continue  # the plugins' slice requests: theirs to remove
                logger.warning("MPS supervisor: cannot remove {}: {}", path, exc.strerror or exc)
        self.created.clear()

    def host(self, path: Path) -> Path:
        """``path`` under the root as made on the host's side (``host_root``), else itself."""
        if self.host_root is None:
            return path
        return self.host_root / path.relative_to(self.layout.root)

    def take_lock(self) -> None:
        """The exclusive ``flock`` on ``Layout.lock``, held until ``tear_down`` (or the process
        ends). Raises ``MpsError`` when another supervisor holds it."""
        try:
            f = open(self.layout.lock, "ab")  # noqa: SIM115 (kept open: the lock)
        except OSError as exc:
            raise MpsError(f"cannot open {self.layout.lock}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise MpsError(f"another MPS supervisor holds {self.layout.lock}: one per node") from None
        self.lock_file = f

    def makedirs(self, path: Path) -> None:
        """Make ``path`` and its missing parents (``DIR_MODE``), remembering each one made.
        Raises ``MpsError``."""
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        for p in reversed(missing):
            try:
                p.mkdir()
                os.chmod(p, DIR_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise MpsError(f"cannot make the folder {p}: {exc.strerror or exc}") from None
            self.created.append(p)

    @staticmethod
    def mount(args: list[str], what: str) -> None:
        """``mount <args>``; ``what`` says it in the error. Raises ``MpsError`` when it fails."""
        done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise MpsError(
                f"{what} failed (mount {' '.join(args)}: "
                f"{said[-1] if said else f'exit {done.returncode}'}): mounting needs "
                "CAP_SYS_ADMIN (the chart's mps container is privileged); or set "
                "OMATICAYA_MPS_SHM_MIB=0 to mount nothing (then /dev/shm is not shared with "
                "the clients)"
            )

    def remove_slice_folder(self, sid: str) -> bool:
        """Remove slice ``sid``'s folder (``<root>/slices/<sid>``, seen from the host's side):
        its tmpfs (and any mount left on its pipe folder) unmounted first, lazily when busy, the
        whole tree then removed, tried ``REMOVE_TRIES`` times ``REMOVE_WAIT_S`` apart (a dying
        MPS server can still write in it). Returns ``True`` when nothing is left; a folder that
        stays is logged with the reason (``ControlDaemon.stop`` removes it quietly, and a
        leftover seen after ``helm uninstall`` had no trace in the logs). Never raises."""
        folder = self.host(self.layout.slice_dir(sid))
        try:
            remove_tree(folder)
        except OSError as exc:
            logger.warning("MPS supervisor: cannot remove slice {}'s folder {}: {}", sid, folder,
                           exc.strerror or exc)  # fmt: skip
            return False
        return True

    def sweep_slices(self) -> None:
        """Remove every slice folder still under ``<root>/slices`` (one whose daemon's removal
        failed, or one a dead supervisor left and no request names now), so that a stop leaves
        no directory. Entries that are not slice IDs are left (not ours)."""
        where = self.host(self.layout.slices_dir)
        try:
            names = [e.name for e in os.scandir(where) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for name in names:
            if SLICE_ID_RE.match(name):
                self.remove_slice_folder(name)


def umount(path: Path, recursive: bool) -> None:
    """``umount`` ``path`` (``--recursive``: its submounts too); a failure is logged."""
    args = ["umount", "--recursive", str(path)] if recursive else ["umount", str(path)]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        logger.warning("umount {}: {}", path, done.stderr.strip() or done.returncode)


@retry(stop=stop_after_attempt(REMOVE_TRIES), wait=wait_fixed(REMOVE_WAIT_S),
       retry=retry_if_exception_type(OSError), reraise=True)  # fmt: skip
def remove_tree(folder: Path) -> None:
    """Unmount what is mounted on ``folder``'s ``shm`` and ``pipe`` (``umount``, then ``umount
    --lazy`` when busy) and remove the tree. A folder already gone is done. Raises ``OSError``
    (the first failure of ``shutil.rmtree``) when something stays."""
    if not folder.exists():
        return
    for sub in (folder / "shm", folder / "pipe"):
        if os.path.ismount(sub):
            done = subprocess.run(["umount", str(sub)], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "--lazy", str(sub)], capture_output=True, check=False)
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return
