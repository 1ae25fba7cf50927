"""The kubelet DRA plugin of the driver gpu.omaticaya.io (work in progress)."""
