"""The NVIDIA driver's files the DRA plugin mounts in every prepared claim's containers, found on
the node once at the plugin's start by ``omaticaya-driver-files`` (``cmd/driverfiles``: the
NVIDIA container toolkit's CDI generation, built from its Go module) and turned into read-only
mounts by ``drivermounts`` (pure).

``OMATICAYA_DRA_DRIVER_FILES`` (default on) turns it on; ``OMATICAYA_DRA_DRIVER_ROOT`` is where
the plugin looks (the host's driver root as its container sees it), ``OMATICAYA_DRA_DRIVER_HOST_ROOT``
the same folder on the host (the CDI specs' host paths). The files are those of the driver's
version: at start the agent's reading's ``nvmlSystemGetDriverVersion`` when there is one, else
what the toolkit infers from the libraries' names; a later reading of another version (a driver
upgraded under a running agent) runs the tool again once for it. Found: one info line, the gauge
``omaticaya_dra_driver_files{driver_version}`` at their number. None found (no driver there,
the tool missing or failing): one warning saying why and what containers get instead, the gauge
at 0 with ``driver_version=""``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.allocation.mps import Mount
from ..core.config.settings import Settings
from .drivermounts import DriverMounts, driver_mounts
from .metrics import DraCounts

__all__ = ["TIMEOUT_S", "TOOL", "DriverFiles"]

#: the program that lists the driver's files (in the agent's image: /usr/local/bin)
TOOL = "omaticaya-driver-files"
#: how long one run may take, seconds (a real driver root: well under one)
TIMEOUT_S = 60.0

#: runs a command: ``subprocess.run``'s signature (tests give their own)
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class DriverFiles:
    """The driver's files of ``settings`` (``dra_driver_files``, ``dra_driver_root``,
    ``dra_driver_host_root``), counted in ``counts.driver_files`` (``metrics.DraCounts``).
    ``which`` finds the tool (``shutil.which``), ``run`` runs it (``subprocess.run``).
    Thread-safe: ``mounts`` is called by concurrent prepares."""

    def __init__(self, settings: Settings, counts: DraCounts, *,
                 which: Callable[[str], str | None] = shutil.which,
                 run: Runner = subprocess.run) -> None:  # fmt: skip
        self.enabled = bool(settings.dra_driver_files)
        self.root = Path(settings.dra_driver_root)
        self.host_root = Path(settings.dra_driver_host_root)
        self.counts = counts
        self._which, self._run = which, run
        self._lock = threading.Lock()
        #: what each run found, by the version it ran for ("": inferred); ``None``: nothing
        self._results: dict[str, DriverMounts | None] = {}
        self._current = ""
        #: how many times the tool ran
        self.runs = 0

    def load(self, version: str | None = None) -> DriverMounts | None:
        """Run the tool for ``version`` (``None``: inferred by the toolkit) and keep what it
        found; log it and set the gauge. Off: say so once, no gauge. Returns what was found
        (``None``: nothing, or off). Never raises."""
        with self._lock:
            if not self.enabled:
                self.counts.driver_files = None
                logger.info("DRA: OMATICAYA_DRA_DRIVER_FILES is off: prepared claims get their "
                            "device nodes and NVIDIA_VISIBLE_DEVICES, not the driver's files "
                            "(the nvidia runtime must add them)")  # fmt: skip
                return None
            return self._load(version or "")

    def mounts(self, version: str | None) -> tuple[Mount, ...]:
        """The read-only mounts of the driver's files for a claim prepared while the reading
        says the driver is ``version`` (``None``: unknown, the last one found): what a run
        found for that version (the start's, when the toolkit inferred the same), the tool run
        first, once, for a version no run found; ``()`` when off or none found."""
        if not self.enabled:
            return ()
        with self._lock:
            key = self._key(version)
            found = self._results[key] if key is not None else self._load(version or "")
            if key is not None and key != self._current:
                self._current = key
                self._count(found)
            return found.mounts if found is not None else ()

    def _key(self, version: str | None) -> str | None:
        """The run whose result holds for ``version``, or ``None``: the tool must run."""
        if not self._results:
            return None
        if not version:
            return self._current
        for key, found in self._results.items():
            if key == version or (found is not None and found.version == version):
                return key
        return None

    def _count(self, found: DriverMounts | None) -> None:
        self.counts.driver_files = ("", 0) if found is None else (found.version, len(found.mounts))

    def _load(self, version: str) -> DriverMounts | None:
        """One run of the tool for ``version`` (``""``: inferred); the lock held."""
        self.runs += 1
        found, why = self._scan(version)
        self._results[version], self._current = found, version
        self._count(found)
        if found is None:
            logger.warning("DRA: no NVIDIA driver files found under {} (the host's {}): {}; "
                           "prepared claims get their device nodes and NVIDIA_VISIBLE_DEVICES "
                           "only, so a container finds no driver library or nvidia-smi unless "
                           "the nvidia runtime adds them (set OMATICAYA_DRA_DRIVER_ROOT, the "
                           "chart's driverRoot, to the driver's root)",
                           self.root, self.host_root, why)  # fmt: skip
            return None
        logger.info("DRA: the NVIDIA driver {}'s {} files under {} are mounted read-only in "
                    "every prepared claim's containers ({}); left out: {}", found.version or "?",
                    len(found.mounts), self.host_root, _summary(found.mounts),
                    "; ".join(found.skipped) or "nothing")  # fmt: skip
        return found

    def _scan(self, version: str) -> tuple[DriverMounts | None, str]:
        """Run the tool: what it found, or ``(None, why)``."""
        tool = self._which(TOOL)
        if tool is None:
            return None, f"{TOOL} is not on PATH (the agent's image has it in /usr/local/bin)"
        args = [tool, "--driver-root", str(self.root), "--host-driver-root", str(self.host_root)]
        if version:
            args += ["--driver-version", version]
        try:
            proc = self._run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"{TOOL} could not run: {exc}"
        if proc.returncode != 0:
            said = " ".join((proc.stderr or "").split())
            if len(said) > 400:  # the toolkit's chain of errors: its start and its cause
                said = f"{said[:150]} ... {said[-250:]}"
            return None, f"{TOOL} exited {proc.returncode}: {said or 'no message'}"
        try:
            doc: Any = json.loads(proc.stdout)
            found = driver_mounts(doc if isinstance(doc, dict) else {})
        except ValueError as exc:
            return None, f"{TOOL} printed no list of files: {exc}"
        if not found.mounts:
            return None, "the NVIDIA container toolkit found no file of the driver's to mount"
        return found, ""


def _summary(mounts: tuple[Mount, ...]) -> str:
    """How many libraries, binaries and other files, with two names of each kind."""
    kinds: dict[str, list[str]] = {"libraries": [], "binaries": [], "others": []}
    for m in mounts:
        name = m.container_path.rsplit("/", 1)[-1]
        kind = "libraries" if ".so" in name else "binaries" if "/bin/" in m.container_path else "others"
        kinds[kind].append(name)
    return ", ".join(f"{len(v)} {k} ({', '.join(v[:2])}{', ...' if len(v) > 2 else ''})"
                     for k, v in kinds.items() if v)  # fmt: skip
