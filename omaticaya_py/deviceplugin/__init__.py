"""The kubelet device plugin (API ``v1beta1``): the node's GPUs as extended resources.

It serves the kubelet from the agent's own reading: one reader, one health model, one cache
(``Agent.cache.last``, the latest ``TickResult``), so one DaemonSet and one NVML session label
the Node and advertise the GPUs. Devices are the GPUs by UUID (in replay mode the GPUs of the
trace); each is ``Healthy`` exactly while the health rules (``health.py``) find nothing wrong
with it, and turns ``Healthy`` again when it recovers, which NVIDIA's plugin cannot do.

MIG, as NVIDIA's plugin does under its ``mixed`` strategy: whole GPUs (MIG off) are
``nvidia.com/gpu``; the MIG devices of each profile are a resource of their own,
``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb``), each served by its own plugin on its
own socket (``DevicePluginSet``), by MIG UUID, with health (the parent GPU's faults included)
and preferred allocation by live free memory per MIG device. A profile that first appears after
start (the GPU was repartitioned) gets its plugin on the next tick; MIG devices that left the
reading (a re-created layout has new UUIDs) leave the list, and a profile plugin with none left
stops (``allocation.departed``). While the reading is older than the agent's stuck-tick bound
(``core.config.settings.stuck_after_s``), every device is Unhealthy (``stale-reading``).

Sharing by memory: GPUs listed in ``OMATICAYA_SHARED_GPUS`` (MIG-enabled ones never) are served
instead as ``omaticaya.io/gpu-memory``, one unit device per ``OMATICAYA_SHARE_UNIT_MIB`` of their
total memory (IDs ``<GPU UUID>::<k>``, ``core.model.sharing``), with their GPU's health, by one more
plugin of the set. Its preferred allocation takes every unit of a slice from one healthy GPU
that has both the units and the live free memory less the slices handed out and not yet in use
(``slices``, ``slicer``); ``Allocate`` refuses units across GPUs and a slice the GPU's live memory
cannot hold, and sets ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``OMATICAYA_GPU_MEMORY_LIMIT_MIB``.

- ``ListAndWatch`` sends the device list, then a new one whenever a device's health changes
  (the cache is polled every ``poll_s``; ``notify()`` wakes the streams at once).
- ``GetPreferredAllocation`` prefers healthy GPUs with the most free memory by the live reading
  (memory held by processes Kubernetes does not know about counts), honouring must-include.
- ``Allocate`` returns ``NVIDIA_VISIBLE_DEVICES=<uuid,...>`` for the NVIDIA container runtime
  and refuses an unknown or unhealthy GPU; ``PreStartContainer`` refuses a GPU that turned
  unhealthy since allocation.
- Registration: the plugin serves ``<dir>/<socket>`` and registers on ``<dir>/kubelet.sock``.
  A kubelet that restarts deletes every socket in the folder and creates a new
  ``kubelet.sock``; the folder is watched (``watchdog``, inotify) and the plugin re-serves and
  re-registers at once, with a periodic check as a backstop (``kubeletplugin.KubeletPluginHost``,
  the DRA plugin's host too).
- GPU indices across starts: at the first readable reading after a start each GPU's NVML index
  -> UUID is compared with the last start's (``<dir>/omaticaya-gpu-indices.json``); a shared
  index (``OMATICAYA_SHARED_GPUS`` by index) that names another GPU now is reported (log line,
  Event ``SharedGpuIndexMoved``, gauge ``omaticaya_shared_gpu_index_moved``), as the DRA
  plugin reports it; sharing follows the index (``DevicePluginSet.check_indices``).

This module imports neither ``pynvml`` nor ``kubernetes``.

Modules, each composing the ones before it: ``allocation`` (pure: device state, names, the
options served, the preferred allocation of whole devices by ``core.allocation.placement``), ``slices``
(pure: units, a slice's GPU by ``core.allocation.placement.pick_slice``, slices pending), ``strategies``
(NVIDIA's device list strategies), ``config`` (``PluginConfig``: the settings' device-plugin
section, read once by ``plugin_config``), ``slicer`` (the book of slices), ``inventory`` (one
resource's devices and health from the agent's cache), ``service`` (the gRPC servicer of one
resource), ``registration`` (registering it with the kubelet, served on ``kubeletplugin``'s host),
``plugin`` (those parts composed: one resource), ``plugin_set`` (every resource of the node),
``v1beta1`` (generated from the kubelet's ``api.proto``; ``scripts/gen-deviceplugin-proto``).
"""

from .plugin_set import DevicePluginSet

__all__ = ["DevicePluginSet"]
