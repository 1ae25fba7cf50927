"""The attribute table: every attribute of the DRA driver's devices, one row each.

The devices of the Node's ResourceSlice (``core.publish.slice_device.SliceDevice``) carry their
attributes under the driver's domain, so that a selector reads
``device.attributes["gpu.omaticaya.io"].freeMemoryMiB``. ``ATTRIBUTES`` says of each its name,
its ``resource.k8s.io/v1`` ``DeviceAttribute`` type (``string``, ``int``, ``bool``,
``version``), the ``SliceDevice`` field it comes from, and which devices have it. The rendered
order is the table's. The renderer (``SliceDevice.render``), the chart's DeviceClasses and
docs/dra.md agree with it; readers import the names from here (never a string literal).

Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ARCHITECTURE",
    "ATTRIBUTES",
    "COMPUTE_CAPABILITY",
    "CUDA_DRIVER_VERSION",
    "DRIVER_VERSION",
    "FREE_MEMORY",
    "INDEX",
    "MIG_INDEX",
    "NUMA_NODE",
    "NVLINK_ISLAND",
    "PARENT_UUID",
    "PCIE_ROOT",
    "PCI_BUS_ID",
    "PRODUCT_NAME",
    "PROFILE",
    "SHARED",
    "STANDARD_PREFIX",
    "TYPE",
    "UUID",
    "Attribute",
    "AttributeType",
]

#: a ``DeviceAttribute``'s one field: which kind of value it holds
AttributeType = Literal["string", "int", "bool", "version"]

#: ``gpu`` for a whole GPU, ``mig`` for a MIG device
TYPE = "type"
#: a whole GPU shared by memory (consumable capacity)
SHARED = "shared"
#: the GPU's NVML index (``nvmlDeviceGetIndex``; renumbered when a GPU is lost at boot)
INDEX = "index"
#: the device's own UUID (``GPU-...`` or ``MIG-...``)
UUID = "uuid"
#: the product name (``nvmlDeviceGetName``), at most 64 characters
PRODUCT_NAME = "productName"
#: the architecture (``nvmlDeviceGetArchitecture``), at most 64 characters
ARCHITECTURE = "architecture"
#: the CUDA compute capability (``nvmlDeviceGetCudaComputeCapability``) as a version
COMPUTE_CAPABILITY = "cudaComputeCapability"
#: the display driver's version (``nvmlSystemGetDriverVersion``) as a version
DRIVER_VERSION = "driverVersion"
#: the CUDA version the driver supports (``nvmlSystemGetCudaDriverVersion_v2``) as a version
CUDA_DRIVER_VERSION = "cudaDriverVersion"
#: the live free memory, MiB, rounded down to the memory step with the labels' hysteresis
FREE_MEMORY = "freeMemoryMiB"
#: a MIG device's index on its GPU
MIG_INDEX = "migIndex"
#: a MIG device's profile (``1g.10gb``), at most 64 characters
PROFILE = "profile"
#: a MIG device's GPU's UUID
PARENT_UUID = "parentUUID"
#: Kubernetes' standard attributes (docs: "Standard Device Attributes for Dynamic Resource
#: Allocation"; KEP-6072), fully qualified so that ``matchAttribute`` aligns devices of several
#: drivers: the GPU's PCI address in extended BDF form (``0000:3b:00.0``; whole GPUs only, a MIG
#: device is no PCI device), its PCIe root complex (``pci<domain>:<bus>``), its NUMA node
#: (left out when it has none, sysfs' -1)
STANDARD_PREFIX = "resource.kubernetes.io/"
PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"
PCIE_ROOT = STANDARD_PREFIX + "pcieRoot"
NUMA_NODE = STANDARD_PREFIX + "numaNode"
#: the GPU's NVLink island (``core.model.topology.NodeTopology.islands``): GPUs with one value
#: reach each other by NVLink, so a claim for N GPUs can ask ``matchAttribute`` on it
NVLINK_ISLAND = "nvlinkIsland"


@dataclass(frozen=True, slots=True)
class Attribute:
    """One attribute of the driver's devices: ``name`` (under the driver's domain), ``type``
    (the ``DeviceAttribute`` field its value goes in; a name with a ``/`` is fully
    qualified, the others are under the driver's domain), ``field`` (the
    ``core.publish.slice_device.SliceDevice`` field it is read from; ``None`` there: the
    attribute is left out, so a selector on it does not match), ``mig_only`` (only MIG
    devices have it), ``whole_only`` (MIG devices do not)."""

    name: str
    type: AttributeType
    field: str
    mig_only: bool = False
    #: only whole GPUs (not MIG devices) have it
    whole_only: bool = False


#: every attribute, in the order a device renders them
ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute(TYPE, "string", "device_type"),
    Attribute(SHARED, "bool", "shared"),
    Attribute(INDEX, "int", "gpu_index"),
    Attribute(UUID, "string", "uuid"),
    Attribute(PRODUCT_NAME, "string", "product"),
    Attribute(ARCHITECTURE, "string", "architecture"),
    Attribute(COMPUTE_CAPABILITY, "version", "compute_capability"),
    Attribute(DRIVER_VERSION, "version", "driver_version"),
    Attribute(CUDA_DRIVER_VERSION, "version", "cuda_driver_version"),
    Attribute(FREE_MEMORY, "int", "free_memory_mib"),
    Attribute(MIG_INDEX, "int", "mig_index", mig_only=True),
    Attribute(PROFILE, "string", "profile", mig_only=True),
    Attribute(PARENT_UUID, "string", "parent_uuid", mig_only=True),
    Attribute(PCI_BUS_ID, "string", "pci_bus_id", whole_only=True),
    Attribute(PCIE_ROOT, "string", "pcie_root"),
    Attribute(NUMA_NODE, "int", "numa_node"),
    Attribute(NVLINK_ISLAND, "string", "nvlink_island"),
)
