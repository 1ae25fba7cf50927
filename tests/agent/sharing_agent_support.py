"""What other test files share of test_sharing_agent.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from omaticaya_py.core.model.sharing import unit_id
from omaticaya_py.core.rules.attribution import (
    ContainerDevices,
    attribute,
)
from tests.helpers import gpu

U0, U1 = gpu(0).uuid, gpu(1).uuid


UID_A, UID_B = "0b3a4f6e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "1b3a4f6e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


CID_A, CID_A2, CID_B = "a" * 64, "c" * 64, "b" * 64


RES = "omaticaya.io/gpu-memory"


def holder(ns, pod, container, uuid, units, *, first=0, resource=RES):
    ids = [unit_id(uuid, k) for k in range(first, first + units)]
    return ContainerDevices(ns, pod, container, resource, tuple(ids))


def attributed(procs, refs, assignments, pod_names=None, container_names=None, uuids=(U0, U1)):
    processes = {u: tuple(procs.get(u, ())) for u in uuids}
    return attribute(processes, refs, assignments, pod_names=pod_names,
                     container_names=container_names)  # fmt: skip


NAMES = {UID_A: ("ml", "infer-a"), UID_B: ("ml", "infer-b")}


CONTAINERS = {CID_A: "server", CID_A2: "sidecar", CID_B: "server"}
