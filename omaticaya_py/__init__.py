"""Omaticaya: live NVIDIA GPU state on Kubernetes Node labels.

A node agent (run as a DaemonSet) that reads each GPU through NVML on a cron schedule and
patches its own Node's labels and annotations with a JSON merge patch, only when a value changed.

``__version__`` is the installed package's version (``0.0.0+unknown`` from a source tree that is
not installed), read from its metadata when first asked for: ``importlib.metadata`` is not loaded
by a command that does not need it.
"""

from __future__ import annotations

from functools import cache

__all__ = ["__version__"]


@cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("omaticaya")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> str:
    """``__version__`` (PEP 562: computed on first access)."""
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
