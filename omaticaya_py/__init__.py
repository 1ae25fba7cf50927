"""Omaticaya: live NVIDIA GPU state on Kubernetes Node labels.

A node agent (run as a DaemonSet) that reads each GPU through NVML on a cron schedule and
patches its own Node's labels and annotations with a JSON merge patch, only when a value changed.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("omaticaya")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
