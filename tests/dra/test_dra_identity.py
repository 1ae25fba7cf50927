"""Issue 48, items 1 and 7: the DRA driver's device identity survives a reboot that loses a GPU,
and one claim's bad input fails that claim only (pure parts: omaticaya_py/core/publish/dra.py,
dra/prepare.py, core/model/sharing.py).

A "reboot" here is two readings of one node: before, GPUs A B C D at NVML indices 0-3; after,
B is gone and C and D are renumbered 1 and 2 (NVML indices are PCI order). A device name, a
checkpointed claim and a shared GPU named by UUID keep meaning the same physical GPU."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest

from omaticaya_py.core.model.sharing import IndexMoved, Sharing, moved_indices, parse_shared_gpus
from omaticaya_py.core.model.snapshot import MigReading
from omaticaya_py.core.publish.dra import (
    DRIVER,
    DraDevice,
    by_name,
    claim_holders,
    device_name,
    inventory,
    parse_device_name,
)
from omaticaya_py.core.rules.attribution import ContainerDevices
from omaticaya_py.core.rules.health import assess
from omaticaya_py.dra.host import check_checkpointed
from omaticaya_py.dra.prepare import (
    MAX_SLICE_MIB,
    ClaimRef,
    NodeFacts,
    Refused,
    capacity_mib,
    decide,
)
from tests.helpers import gpu, lost, snapshot

NODE = "gpu-node-1"
A, B, C, D = (f"GPU-{n:08x}-7fda-b7ae-a94e-630097a14ca4" for n in (0xA, 0xB, 0xC, 0xD))
#: a name as NVML gives it: GPU- and hex groups, upper-case hex allowed
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def before_reboot() -> Any:
    return snapshot(gpu(0, uuid=A), gpu(1, uuid=B), gpu(2, uuid=C), gpu(3, uuid=D))


def after_reboot() -> Any:
    """B gone at boot: C and D renumbered 1 and 2."""
    return snapshot(gpu(0, uuid=A), gpu(1, uuid=C), gpu(2, uuid=D))


def devices_of(snap: Any, sharing: Sharing | None = None) -> list[DraDevice]:
    return inventory(snap, assess(snap, (), None), sharing or Sharing(), 1024, 0.0)


# -- names ----------------------------------------------------------------------------------


# (GPU UUID, MIG index, NVML index, the name)
NAMES = [
    (A, None, 0, "gpu-0000000a-7fda-b7ae-a94e-630097a14ca4"),
    (A, 3, 5, "gpu-0000000a-7fda-b7ae-a94e-630097a14ca4-mig-3"),
    ("GPU-ABCDEF01-7FDA-B7AE-A94E-630097A14CA4", None, 0, "gpu-abcdef01-7fda-b7ae-a94e-630097a14ca4"),
    ("1234-abcd", None, 2, "gpu-1234-abcd"),  # no GPU- prefix: one is put first
    ("GPU-a/b_c d", None, 0, "gpu-a-b-c-d"),  # what a DNS label cannot hold becomes -
    ("GPU-" + "f" * 80, 7, 0, "gpu-" + "f" * 50 + "-mig-7"),  # cut: still a DNS label
    (None, None, 4, "gpu-index-4"),  # a GPU whose UUID NVML never gave
    ("", 1, 6, "gpu-index-6-mig-1"),
]


@pytest.mark.parametrize(("uuid", "mig", "index", "name"), NAMES)
def test_device_names_come_from_the_uuid(uuid: str | None, mig: int | None, index: int, name: str) -> None:
    got = device_name(uuid, mig, gpu_index=index)
    assert got == name
    assert DNS_LABEL.match(got) and len(got) <= 63
    assert parse_device_name(got) == (got.rsplit("-mig-", 1)[0] if mig is not None else got, mig)


@pytest.mark.parametrize("name", [None, 3, ["gpu-0"], "", "GPU-0000", "nvidia0", "gpu-", "gpu-a-",
                                  "gpu-0-mig-01", "gpu-0-mig-12345", "gpu-" + "a" * 60,
                                  "gpu-a.b", "gpu-0-mig-"])  # fmt: skip
def test_names_that_are_not_ours(name: object) -> None:
    assert parse_device_name(name) is None


def test_a_reboot_that_loses_a_gpu_renames_no_device() -> None:
    """Before the fix names were gpu-<index>: after the reboot gpu-1 was C, no longer B."""
    before = {d.uuid: d.name for d in devices_of(before_reboot())}
    after = {d.uuid: d.name for d in devices_of(after_reboot())}
    assert {u: before[u] for u in after} == after  # A, C, D keep their names
    assert before[B] not in after.values()  # B's name is gone with B, not taken over
    assert {d.name: d.gpu_index for d in devices_of(after_reboot())}[device_name(C)] == 1


def test_mig_devices_are_named_by_their_gpus_uuid() -> None:
    mig = MigReading(index=2, uuid="MIG-1", profile="1g.10gb", memory_total_mib=9856,
                     memory_free_mib=9728, gpu_instance_id=1, compute_instance_id=0)  # fmt: skip
    snap = snapshot(gpu(3, uuid=A, mig_enabled=True, mig_devices=(mig,)))
    (d,) = devices_of(snap)
    assert (d.name, d.uuid, d.gpu_uuid) == (device_name(A, 2), "MIG-1", A)


def test_claim_holders_read_uuid_names() -> None:
    """The kubelet's PodResources names a DRA device <pool>/<name>: after the reboot C's name
    still gives C's UUID (before the fix gpu-1 gave whatever GPU index 1 was)."""
    listed = [ContainerDevices("ns", "p", "c", DRIVER, (f"{NODE}/{device_name(C)}",
                                                        f"{NODE}/{device_name(B)}", f"{NODE}/gpu-1",
                                                        f"other/{device_name(A)}")),
              ContainerDevices("ns", "q", "c", "nvidia.com/gpu", (A,))]  # fmt: skip
    holders, skipped = claim_holders(listed, NODE, after_reboot(), Sharing())
    assert holders == [ContainerDevices("ns", "p", "c", DRIVER, (C,))]
    assert skipped == 3  # B gone, an index name, another pool


def test_a_slice_of_a_shared_gpu_is_left_out_of_the_holders() -> None:
    listed = [ContainerDevices("ns", "p", "c", DRIVER, (f"{NODE}/{device_name(C)}",))]
    assert claim_holders(listed, NODE, after_reboot(), Sharing(parse_shared_gpus(C))) == ([], 0)


# -- the checkpoint, checked at every prepare ------------------------------------------------


def entry(name: str, uuid: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"device_name": name, "pool_name": NODE, "request_names": ["gpu"],
                           "cdi_device_ids": [f"gpu.omaticaya.io/claim=u-{name}"]}  # fmt: skip
    if uuid is not None:
        out["uuid"] = uuid
    return out


# (case, the checkpoint's devices, the reading after the reboot, refusal or None)
CHECKPOINTED = [
    ("same GPU, renumbered", [entry(device_name(C), C)], "after", None),
    ("two devices, both still there", [entry(device_name(A), A), entry(device_name(D), D)], "after", None),
    ("its GPU gone at the reboot", [entry(device_name(B), B)], "after",
     r"GPU-0000000b-.* prepared for this claim is no longer on this node .*not prepared again on another GPU"),
    ("one of two gone", [entry(device_name(A), A), entry(device_name(B), B)], "after", r"no longer on this node"),
    ("an index name of an older version", [entry("gpu-1", B)], "after", r"'gpu-1' \(GPU GPU-0000000b.*no longer"),
    ("the name now another UUID", [entry(device_name(C), B)], "after",
     r"was GPU-0000000b-\S+ when prepared and is GPU-0000000c-\S+ now: not prepared again"),
    ("no UUID recorded", [entry(device_name(C), None)], "after", r"has no UUID in the checkpoint"),
    ("a UUID that is no string", [{**entry(device_name(C), None), "uuid": ["x"]}], "after", r"has no UUID"),
    ("a name that is no string", [{**entry("x", C), "device_name": None}], "after", r"device None .* no longer"),
    ("no reading", [entry(device_name(C), C)], None, r"cannot check .*: NVML cannot be read"),
]  # fmt: skip


@pytest.mark.parametrize(("entries", "reading", "refusal"), [c[1:] for c in CHECKPOINTED],
                         ids=[c[0] for c in CHECKPOINTED])  # fmt: skip
def test_a_checkpointed_claim_is_checked_against_the_gpus_now(entries: list[dict[str, Any]],
                                                               reading: str | None, refusal: str | None) -> None:  # fmt: skip
    devices = devices_of(after_reboot()) if reading == "after" else None
    if refusal is None:
        check_checkpointed(entries, devices, "NVML cannot be read")
    else:
        with pytest.raises(Refused, match=refusal):
            check_checkpointed(entries, devices, "NVML cannot be read")


def test_a_new_claim_on_a_renumbered_node_gets_the_device_it_names() -> None:
    """kube-scheduler allocates a device by name from the slice: after the reboot the name of
    index 1 is C's, so a new claim of it is prepared on C, never on B's old name's GPU."""
    devices = devices_of(after_reboot())
    ref = ClaimRef("ns", "new", "uid-new")
    doc = claim({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device_name(C)}, uid=ref.uid)
    (d,) = decide(doc, ref, devices, NodeFacts(pool=NODE)).devices
    assert d.uuid == C and d.edits.env == (f"NVIDIA_VISIBLE_DEVICES={C}",)
    with pytest.raises(Refused, match="not in the node's reading"):
        decide(claim({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device_name(B)},
                     uid=ref.uid), ref, devices, NodeFacts(pool=NODE))  # fmt: skip


# -- shared GPUs named by index: reported when the index names another GPU ------------------


# (case, OMATICAYA_SHARED_GPUS, index -> UUID at the last start, now, what moved)
MOVED = [
    ("index 1 was B, is C now", "1", {0: A, 1: B, 2: C}, {0: A, 1: C, 2: D}, [IndexMoved(1, B, C)]),
    ("index 3 gone", "0,3", {0: A, 3: D}, {0: A, 1: C}, [IndexMoved(3, D, None)]),
    ("the same GPUs", "0-2", {0: A, 1: B, 2: C}, {0: A, 1: B, 2: C}, []),
    ("case of the UUID", "0", {0: A}, {0: A.upper().replace("GPU", "GPU")}, []),
    ("no last start", "1", {}, {1: C}, []),
    ("by UUID: never reported", f"{B},{C}", {1: B}, {1: C}, []),
    ("all: never reported", "all", {1: B}, {1: C}, []),
    ("an index not shared moved", "0", {0: A, 1: B}, {0: A, 1: C}, []),
]  # fmt: skip


@pytest.mark.parametrize(("value", "before", "now", "moved"), [c[1:] for c in MOVED], ids=[c[0] for c in MOVED])
def test_moved_indices(value: str, before: dict[int, str], now: dict[int, str], moved: list[IndexMoved]) -> None:
    assert moved_indices(parse_shared_gpus(value), before, now) == moved


def test_the_moved_message_names_both_gpus_and_the_safe_form() -> None:
    text = IndexMoved(1, B, C).message()
    assert B in text and C in text and "index 1" in text and "by UUID" in text
    assert "no GPU now" in IndexMoved(3, D, None).message()


def test_a_gpu_shared_by_uuid_stays_shared_after_the_reboot() -> None:
    """Shared by UUID, C is the shared device before (index 2) and after (index 1); shared by
    index 2, the sharing moves to D (reported by ``moved_indices``)."""
    by_uuid = Sharing(parse_shared_gpus(C))
    assert [d.uuid for d in devices_of(before_reboot(), by_uuid) if d.shared] == [C]
    assert [d.uuid for d in devices_of(after_reboot(), by_uuid) if d.shared] == [C]
    by_index = Sharing(parse_shared_gpus("2"))
    assert [d.uuid for d in devices_of(after_reboot(), by_index) if d.shared] == [D]


# -- item 7: one claim's bad input fails that claim only, with its reason ---------------------

SHARED = device_name(C)
WHOLE = device_name(A)


def claim(*results: dict[str, Any], uid: str = "uid-1", config: Any = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": list(results)}
    if config is not None:
        devices["config"] = config
    return {"metadata": {"namespace": "ns", "name": "c", "uid": uid},
            "status": {"allocation": {"devices": devices}}}  # fmt: skip


def slice_result(**kw: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": SHARED,
            "consumedCapacity": {"memory": "20Gi"}, **kw}  # fmt: skip


def set_at(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


BASE = claim(slice_result(), config=[{"source": "FromClaim", "requests": ["gpu"], "opaque": {
    "driver": DRIVER, "parameters": {"apiVersion": "gpu.omaticaya.io/v1alpha1", "kind": "GpuConfig"}}}])
RESULT = ("status", "allocation", "devices", "results", 0)
CONFIG = ("status", "allocation", "devices", "config", 0)
#: where a bad value goes: each field decide reads from the claim
FIELDS = {
    "metadata": ("metadata",),
    "uid": ("metadata", "uid"),
    "status": ("status",),
    "allocation": ("status", "allocation"),
    "devices": ("status", "allocation", "devices"),
    "results": ("status", "allocation", "devices", "results"),
    "result": RESULT,
    "driver": (*RESULT, "driver"),
    "pool": (*RESULT, "pool"),
    "device": (*RESULT, "device"),
    "request": (*RESULT, "request"),
    "shareID": (*RESULT, "shareID"),
    "consumedCapacity": (*RESULT, "consumedCapacity"),
    "memory": (*RESULT, "consumedCapacity", "memory"),
    "config": ("status", "allocation", "devices", "config"),
    "config entry": CONFIG,
    "config requests": (*CONFIG, "requests"),
    "config source": (*CONFIG, "source"),
    "opaque": (*CONFIG, "opaque"),
    "opaque driver": (*CONFIG, "opaque", "driver"),
    "parameters": (*CONFIG, "opaque", "parameters"),
    "apiVersion": (*CONFIG, "opaque", "parameters", "apiVersion"),
    "kind": (*CONFIG, "opaque", "parameters", "kind"),
    "threads": (*CONFIG, "opaque", "parameters", "mpsActiveThreadPercentage"),
}
#: numbers out of range and wrong types
BAD = ["1e400", "-1", "NaN", "Infinity", "-0", "1e-400", "9" * 400, 1e400, -1, math.nan, 2**80,
       True, [], ["20Gi"], {}, {"memory": "20Gi"}, None, "", "\x00", "é" * 100]


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("value", BAD, ids=[repr(v)[:24] for v in BAD])
def test_decide_takes_any_value_of_any_field(field: str, value: Any) -> None:
    """Each field of the claim set to each bad value: ``decide`` prepares the claim or refuses
    it with a reason (``Refused``, what the kubelet puts in the pod's events), never raises
    anything else (before the fix "1e400" raised OverflowError and "NaN" InvalidOperation,
    failing every claim of the kubelet's call)."""
    devices = devices_of(after_reboot(), Sharing(parse_shared_gpus(C)))
    doc = set_at(BASE, FIELDS[field], value)
    ref = ClaimRef("ns", "c", "uid-1")
    try:
        prepared = decide(doc, ref, devices, NodeFacts(pool=NODE, thread_share=True))
    except Refused as exc:
        assert str(exc) and len(str(exc)) < 600
    else:
        assert all(d.mib is None or 0 < d.mib <= MAX_SLICE_MIB for d in prepared.devices)


# (quantity, the refusal)
QUANTITIES = [
    ("1e400", r"more than 1073741824 MiB"),
    ("1e30", r"more than 1073741824 MiB"),
    ("9" * 400, r"more than"),
    ("-1", r"not a whole positive number of MiB"),
    ("-20Gi", r"not a whole positive number of MiB"),
    ("0", r"not a whole positive number of MiB"),
    ("NaN", r"not a quantity: 'NaN'"),
    ("Infinity", r"not a quantity"),
    ("1e-400", r"not a whole positive number of MiB"),
    ("lots", r"not a quantity"),
]


@pytest.mark.parametrize(("quantity", "refusal"), QUANTITIES)
def test_capacity_out_of_range_is_refused_naming_it(quantity: str, refusal: str) -> None:
    with pytest.raises(Refused, match=r"consumedCapacity memory.*" + refusal):
        capacity_mib(quantity)


@pytest.mark.parametrize("value", [["20Gi"], {"Gi": 20}, None, 20, 20.5, True])
def test_capacity_of_a_wrong_type_is_refused_naming_the_form(value: Any) -> None:
    with pytest.raises(Refused, match=r"consumedCapacity memory: expected a quantity like '20Gi'"):
        capacity_mib(value)


def test_a_request_that_is_no_string_is_refused_naming_it() -> None:
    doc = set_at(BASE, (*RESULT, "request"), ["gpu"])
    with pytest.raises(Refused, match=r"request: expected a string; got \['gpu'\]"):
        decide(doc, ClaimRef("ns", "c", "uid-1"), devices_of(after_reboot()), NodeFacts(pool=NODE))


def test_by_name_keys_by_uuid_names() -> None:
    assert set(by_name(devices_of(after_reboot()))) == {device_name(u) for u in (A, C, D)}


def test_a_lost_gpu_keeps_its_uuid_name() -> None:
    (d,) = devices_of(snapshot(lost(2, uuid=C)))
    assert d.name == device_name(C) and d.reasons


def test_the_lost_gpu_trace_is_current() -> None:
    """``multi-gpu-lost-trace.json`` (the cluster test's reboot, and the image's) is what
    ``tests/data/make_lost_gpu_trace.py`` derives: GPU 3 gone, the later GPUs renumbered."""
    from tests.data import make_lost_gpu_trace
    from tests.helpers import DATA

    assert (DATA / make_lost_gpu_trace.NAME).read_text() == make_lost_gpu_trace.render(), (
        "run python tests/data/make_lost_gpu_trace.py")
    doc = make_lost_gpu_trace.make(json.loads((DATA / "multi-gpu-trace.json").read_text()))
    assert [(d["index"], d["uuid"][:12]) for d in doc["devices"]] == [
        (0, "GPU-00000000"), (1, "GPU-00000001"), (2, "GPU-00000002"), (3, "GPU-00000004"),
        (4, "GPU-00000005"), (5, "GPU-00000006"), (6, "GPU-00000007")]
    assert all([g["index"] for g in s["gpus"]] == list(range(7)) for s in doc["samples"])
