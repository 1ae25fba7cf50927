"""NVML reader: with ``sources.record``, the only package that imports ``pynvml`` (package
``nvidia-ml-py``).

- ``reader``: ``NvmlReader``, every GPU into a ``NodeSnapshot`` (init, re-init, topology);
- ``gpu``: one read of one GPU; ``mig``: the MIG devices of a GPU with MIG on;
- ``device``: a GPU's handle and static facts; ``events``: the Xid watcher thread;
- ``library``: NVML's error classes, counted calls, ``nvml_available``, ``decode``.
"""

from .library import LIBRARY_GONE, decode, handle_address, nvml_available
from .reader import NvmlReader

__all__ = ["LIBRARY_GONE", "NvmlReader", "decode", "handle_address", "nvml_available"]
