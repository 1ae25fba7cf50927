"""``omaticaya record``: write a trace of this node's GPUs from real NVML.

The output is the project's trace format, version 2, or 3 with each GPU's place on the node
(``docs/trace-format.md``): the static facts of every GPU (and of every MIG device, and its
topology: ``topology``), then one sample per interval with what NVML answered,
errors recorded where they happened under the ``pynvml`` exception class name (a field that is
NotSupported, a GPU that is lost, the whole library gone). Critical Xid and double-bit ECC
events delivered in an interval go into that sample's ``xid_events``. A trace recorded here
replays with ``--trace`` and serves the NVML test library (``tests/nvml/``) unchanged, so a
user can replay their own GPUs or attach one to a bug report.

This is an NVML edge like ``sources.nvml``: the values are NVML's raw answers (bytes, mW, mJ),
not the agent's rounded readings, so that a replay sees what the agent would have seen.

- ``command``: ``record()``, the sampling loop and the atomic write;
- ``recorder``: ``Recorder``, one NVML session into the trace document;
- ``gpu``: one GPU's static facts and sample; ``values``: NVML answers as trace values;
- ``topology``: one GPU's version 3 keys (PCIe, NUMA, CPU affinity, NVLinks, P2P, fabric).
"""

from .command import RecordError, record

__all__ = ["RecordError", "record"]
