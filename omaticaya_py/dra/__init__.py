"""The kubelet DRA plugin of the driver ``gpu.omaticaya.io`` (Dynamic Resource Allocation,
``resource.k8s.io/v1``; kubelet DRA API v1, Kubernetes 1.34+): the node's half of the driver.

The other half, the ResourceSlice the agent publishes, and the device model both halves share
(``core.publish.dra.inventory``: one device per GPU, ``gpu-<index>``, and per MIG device,
``gpu-<index>-mig-<MIG index>``) are not here. kube-scheduler allocates named devices from the
slice and writes its choice into each ResourceClaim; the kubelet then asks this plugin to
prepare them (``NodePrepareResources``): the plugin reads the claim from the API server, checks
each device against the agent's latest reading (``prepare.decide``: pure), writes the claim's
CDI spec (``gpu.omaticaya.io/claim=<claim UID>-<device>``, one file per claim in
``OMATICAYA_DRA_CDI_DIR``) that containerd 2 / CRI-O inject, and records it in a checkpoint, so
that preparing again is answered the same and a restarted plugin unprepares what it prepared.
Device health streams to the kubelet (``DRAResourceHealth``, KEP-4680) at each tick.

Modules: ``prepare`` (pure: the decision and the CDI spec), ``resourceclaim`` (pure: the
claim's JSON, opaque config), ``cdi`` (pure: CDI devices and files), ``drivermounts`` (pure: the
NVIDIA driver's files as read-only mounts), ``driverfiles`` (those files found at start by
``omaticaya-driver-files``, the NVIDIA container toolkit's CDI generation), ``healthreport`` (pure: device
health), ``host`` (device nodes, minors, atomic files, the checkpoint), ``metrics`` (the
counters), ``deviceinfo`` (the node's devices now), ``sharing`` (the slices of shared GPUs and
their MPS daemons), ``claims`` (prepared claims: CDI files and checkpoint entries),
``registration`` (the registration socket), ``services`` (the DRA socket's servicers),
``plugin`` (``DraPlugin``: the parts composed on ``kubeletplugin.KubeletPluginHost``, the
sockets' lifecycle the device plugin shares); generated from the
kubelet's protos (``scripts/gen-dra-proto``): ``v1`` (DRAPlugin), ``pluginregistration``,
``health.v1`` and ``health.v1alpha1``.
"""

from .plugin import DraPlugin

__all__ = ["DraPlugin"]
