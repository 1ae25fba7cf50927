"""NVIDIA's device list strategies (``deviceplugin/strategies.py``): the whole
``ContainerAllocateResponse`` for each strategy and combination, whole GPUs, MIG devices and a
memory slice's GPU alike; bad device IDs; the regenerated ``v1beta1`` protobuf (the bytes a 1.20
kubelet reads are unchanged, and it skips ``cdi_devices``); and ``Allocate`` over a real gRPC
channel configured by ``OMATICAYA_DEVICE_LIST_STRATEGY``. On the real kubelet:
``test_device_list_strategies_kubelet.py``."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.deviceplugin.config import plugin_config
from omaticaya_py.deviceplugin.plugin_set import DevicePluginSet
from omaticaya_py.deviceplugin.strategies import (
    DEFAULT_STRATEGIES,
    cdi_annotation_key,
    container_response,
)
from omaticaya_py.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.devcluster import REPO_ROOT
from tests.deviceplugin.device_plugin_support import FakeKubelet
from tests.helpers import MIG_MIXED_TRACE as MIG_MIXED

GPU0 = "GPU-178dd196-7fda-b7ae-a94e-630097a14ca4"  # mig-mixed-trace: GPU 0, MIG on
GPU1 = "GPU-e26e8cb2-ee20-51d1-b6bb-da4b063db955"  # mig-mixed-trace: GPU 1, whole
MIG = "MIG-d025794b-fcd4-51e5-8806-c3410fd5a3ac"  # GPU 0's first 1g.10gb device
MIG_OLD = f"MIG-{GPU0}/7/0"  # the MIG UUID form of drivers before R470
ROOT = "/var/run/nvidia-container-devices"
NVD = "NVIDIA_VISIBLE_DEVICES"
SLICE_ENVS = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M", "OMATICAYA_GPU_MEMORY_LIMIT_MIB": "20480"}
ALL = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


def key(*devices: str) -> str:
    return "cdi.k8s.io/omaticaya-device-plugin_" + hashlib.sha256(
        "\n".join(devices).encode()
    ).hexdigest()[:16]


def expect(
    envs: dict[str, str] | None = None,
    mounts: tuple[str, ...] = (),
    annotations: dict[str, str] | None = None,
    cdi: tuple[str, ...] = (),
) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=envs or {},
        mounts=[
            api_pb2.Mount(container_path=f"{ROOT}/{d}", host_path="/dev/null", read_only=True)
            for d in mounts
        ],
        annotations=annotations or {},
        cdi_devices=[api_pb2.CDIDevice(name=f"nvidia.com/gpu={d}") for d in cdi],
    )


CASES = {
    "envvar": ([GPU0, GPU1], None, ("envvar",), expect({NVD: f"{GPU0},{GPU1}"})),
    "volume-mounts": (
        [GPU0, GPU1], None, ("volume-mounts",), expect({NVD: ROOT}, mounts=(GPU0, GPU1)),
    ),
    # both on (the default): the UUIDs in the variable, and the mounts
    "default": (
        [GPU0, GPU1], None, DEFAULT_STRATEGIES,
        expect({NVD: f"{GPU0},{GPU1}"}, mounts=(GPU0, GPU1)),
    ),
    "default-any-order": (
        [GPU0], None, ("volume-mounts", "envvar"), expect({NVD: GPU0}, mounts=(GPU0,)),
    ),
    "cdi-annotations": (
        [GPU0, GPU1], None, ("cdi-annotations",),
        expect(annotations={key(GPU0, GPU1): f"nvidia.com/gpu={GPU0},nvidia.com/gpu={GPU1}"}),
    ),
    "cdi-cri": ([GPU0, GPU1], None, ("cdi-cri",), expect(cdi=(GPU0, GPU1))),
    "all-four": (
        [GPU1], None, ALL,
        expect({NVD: GPU1}, mounts=(GPU1,), annotations={key(GPU1): f"nvidia.com/gpu={GPU1}"},
               cdi=(GPU1,)),
    ),
    "cdi-and-mounts": (
        [GPU1], None, ("volume-mounts", "cdi-cri"), expect({NVD: ROOT}, mounts=(GPU1,), cdi=(GPU1,)),
    ),
    "mig-default": ([MIG], None, DEFAULT_STRATEGIES, expect({NVD: MIG}, mounts=(MIG,))),
    "mig-cdi": (
        [MIG], None, ("cdi-annotations", "cdi-cri"),
        expect(annotations={key(MIG): f"nvidia.com/gpu={MIG}"}, cdi=(MIG,)),
    ),
    # a memory slice: its one GPU's UUID, and the limits the caller computed
    "slice-default": (
        [GPU1], SLICE_ENVS, DEFAULT_STRATEGIES,
        expect({**SLICE_ENVS, NVD: GPU1}, mounts=(GPU1,)),
    ),
    "slice-mounts-cdi": (
        [GPU1], SLICE_ENVS, ("volume-mounts", "cdi-annotations"),
        expect({**SLICE_ENVS, NVD: ROOT}, mounts=(GPU1,),
               annotations={key(GPU1): f"nvidia.com/gpu={GPU1}"}),
    ),
    # the strategy's variable wins over the caller's (an image-style "all" never passes)
    "strategy-wins-over-envs": (
        [GPU1], {NVD: "all"}, ("volume-mounts",), expect({NVD: ROOT}, mounts=(GPU1,)),
    ),
    "repeats-dropped": (
        [GPU1, GPU0, GPU1], None, ALL,
        expect({NVD: f"{GPU1},{GPU0}"}, mounts=(GPU1, GPU0),
               annotations={key(GPU1, GPU0): f"nvidia.com/gpu={GPU1},nvidia.com/gpu={GPU0}"},
               cdi=(GPU1, GPU0)),
    ),
    # nothing names a GPU without a device, by any strategy
    "empty": ([], {"X": "1"}, ALL, expect({"X": "1"})),
    "empty-no-envs": ([], None, DEFAULT_STRATEGIES, expect()),
    # an old-style MIG UUID keeps its slashes below the mount root (the runtime reads it back)
    "mig-old-style-uuid": (
        [MIG_OLD], None, DEFAULT_STRATEGIES, expect({NVD: MIG_OLD}, mounts=(MIG_OLD,)),
    ),
}


@pytest.mark.parametrize(("visible", "envs", "strategies", "expected"), CASES.values(), ids=CASES)
def test_container_response(visible, envs, strategies, expected) -> None:
    assert container_response(visible, envs, strategies) == expected


def test_the_annotation_key_has_nvidias_form_and_is_unique_per_device_set() -> None:
    k = cdi_annotation_key([GPU0])
    assert k == "cdi.k8s.io/omaticaya-device-plugin_" + "eef86d32c7a8aefd"
    name = k.removeprefix("cdi.k8s.io/")
    assert len(name) <= 63  # the CDI library's AnnotationKey limit on <plugin>_<id>
    assert cdi_annotation_key([GPU0]) == k  # the same devices, the same key (a kubelet restart)
    # one container with a whole GPU and a MIG device (two of our resources): two keys
    assert len({k, cdi_annotation_key([MIG]), cdi_annotation_key([GPU0, GPU1])}) == 3


BAD = {
    "unknown-strategy": ([GPU0], ("envvar", "envar"), "unknown device list strategy envar"),
    "empty-id": ([""], ("envvar",), "an empty device ID"),
    "climbs-out-of-the-mount-root": (["../../etc/passwd"], ("volume-mounts",), "not a path below"),
    "dot-part": (["GPU-a/./b"], ("volume-mounts",), "not a path below"),
    "trailing-slash": (["GPU-a/"], ("volume-mounts",), "not a path below"),
    "old-mig-uuid-as-cdi-name": ([MIG_OLD], ("cdi-cri",), "is not a CDI device name"),
    "comma-in-cdi-name": (["GPU-a,nvidia.com/gpu=all"], ("cdi-annotations",), "not a CDI device"),
}


@pytest.mark.parametrize(("visible", "strategies", "message"), BAD.values(), ids=BAD)
def test_bad_devices_and_strategies_are_refused(visible, strategies, message) -> None:
    with pytest.raises(ValueError, match=message):
        container_response(visible, {}, strategies)


# -- the regenerated protobuf -------------------------------------------------------------

#: every field of the 1.20 kubelet's api.proto: (message, field, number, type, label)
T = descriptor_pb2.FieldDescriptorProto
FIELDS_1_20 = [
    ("DevicePluginOptions", "pre_start_required", 1, T.TYPE_BOOL, T.LABEL_OPTIONAL),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2, T.TYPE_BOOL, T.LABEL_OPTIONAL),
    ("RegisterRequest", "version", 1, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("RegisterRequest", "endpoint", 2, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("RegisterRequest", "resource_name", 3, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("RegisterRequest", "options", 4, T.TYPE_MESSAGE, T.LABEL_OPTIONAL),
    ("ListAndWatchResponse", "devices", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("TopologyInfo", "nodes", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("NUMANode", "ID", 1, T.TYPE_INT64, T.LABEL_OPTIONAL),
    ("Device", "ID", 1, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("Device", "health", 2, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("Device", "topology", 3, T.TYPE_MESSAGE, T.LABEL_OPTIONAL),
    ("PreStartContainerRequest", "devicesIDs", 1, T.TYPE_STRING, T.LABEL_REPEATED),
    ("PreferredAllocationRequest", "container_requests", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1, T.TYPE_STRING, T.LABEL_REPEATED),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2, T.TYPE_STRING, T.LABEL_REPEATED),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3, T.TYPE_INT32, T.LABEL_OPTIONAL),
    ("PreferredAllocationResponse", "container_responses", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1, T.TYPE_STRING, T.LABEL_REPEATED),
    ("AllocateRequest", "container_requests", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerAllocateRequest", "devicesIDs", 1, T.TYPE_STRING, T.LABEL_REPEATED),
    ("AllocateResponse", "container_responses", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerAllocateResponse", "envs", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerAllocateResponse", "mounts", 2, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerAllocateResponse", "devices", 3, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("ContainerAllocateResponse", "annotations", 4, T.TYPE_MESSAGE, T.LABEL_REPEATED),
    ("Mount", "container_path", 1, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("Mount", "host_path", 2, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("Mount", "read_only", 3, T.TYPE_BOOL, T.LABEL_OPTIONAL),
    ("DeviceSpec", "container_path", 1, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("DeviceSpec", "host_path", 2, T.TYPE_STRING, T.LABEL_OPTIONAL),
    ("DeviceSpec", "permissions", 3, T.TYPE_STRING, T.LABEL_OPTIONAL),
]


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def test_every_field_a_1_20_kubelet_knows_keeps_its_number_and_type() -> None:
    fdp = _file_proto()
    assert fdp.package == "v1beta1"
    have = {
        (m.name, f.name): (f.number, f.type, f.label) for m in fdp.message_type for f in m.field
    }
    for message, field, number, type_, label in FIELDS_1_20:
        assert have.get((message, field)) == (number, type_, label), (message, field)
    added = set(have) - {(m, f) for m, f, *_ in FIELDS_1_20}
    assert added == {("ContainerAllocateResponse", "cdi_devices"), ("CDIDevice", "name")}
    services = {s.name: [m.name for m in s.method] for s in fdp.service}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
            "PreStartContainer",
        ],
    }


def test_old_fields_encode_to_the_same_bytes_as_before() -> None:
    """The bytes below were written by the generated module of 268ecf7 (the 1.20 proto)."""
    resp = api_pb2.AllocateResponse(container_responses=[api_pb2.ContainerAllocateResponse(
        envs={NVD: "GPU-a,GPU-b", "X": "1"},
        mounts=[api_pb2.Mount(container_path=f"{ROOT}/GPU-a", host_path="/dev/null", read_only=True)],
        devices=[api_pb2.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")],
        annotations={"cdi.k8s.io/x_1": "nvidia.com/gpu=GPU-a"},
    )])
    assert resp.SerializeToString(deterministic=True).hex() == (
        "0ab1010a250a164e56494449415f56495349424c455f44455649434553120b4750552d612c4750552d620a06"
        "0a015812013112360a272f7661722f72756e2f6e76696469612d636f6e7461696e65722d64657669636573"
        "2f4750552d6112092f6465762f6e756c6c18011a200a0c2f6465762f6e766964696130120c2f6465762f6e"
        "7669646961301a02727722260a0e6364692e6b38732e696f2f785f3112146e76696469612e636f6d2f6770"
        "753d4750552d61"
    )
    req = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=["GPU-a", "GPU-b"])]
    )
    assert req.SerializeToString().hex() == "0a0e0a054750552d610a054750552d62"
    reg = api_pb2.RegisterRequest(
        version="v1beta1", endpoint="x.sock", resource_name="nvidia.com/gpu",
        options=api_pb2.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        ),
    )
    assert reg.SerializeToString().hex() == (
        "0a07763162657461311206782e736f636b1a0e6e76696469612e636f6d2f677075220408011001"
    )


def test_a_1_20_kubelet_reads_a_response_with_cdi_devices() -> None:
    """The 1.20 kubelet's view: ContainerAllocateResponse without field 5, in a pool of its own.
    It reads every field it knows, and skips the CDI devices (kept as an unknown field)."""
    fdp = _file_proto()
    fdp.name = "old/api.proto"
    (resp_type,) = [m for m in fdp.message_type if m.name == "ContainerAllocateResponse"]
    (cdi_field,) = [f for f in resp_type.field if f.name == "cdi_devices"]
    resp_type.field.remove(cdi_field)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    old_type = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("v1beta1.ContainerAllocateResponse")
    )
    new = container_response([GPU1], SLICE_ENVS, ALL)
    old = old_type.FromString(new.SerializeToString())
    assert dict(old.envs) == dict(new.envs)
    assert [(m.container_path, m.host_path, m.read_only) for m in old.mounts] == [
        (f"{ROOT}/{GPU1}", "/dev/null", True)
    ]
    assert dict(old.annotations) == dict(new.annotations)
    assert not hasattr(old, "cdi_devices")
    # the unknown field is kept (map entries in a fixed order: deterministic)
    assert old.SerializeToString(deterministic=True) == new.SerializeToString(deterministic=True)


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (the test extra) missing"
)
def test_generated_modules_match_the_proto() -> None:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "gen-deviceplugin-proto"), "--check"],
        capture_output=True, text=True, timeout=120, check=False,
        # this interpreter, not the checkout's .venv (a copy of the tree, as mutmut's, has none)
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr


# -- Allocate over gRPC, configured by the settings ---------------------------------------


@contextlib.contextmanager
def serving(trace: Path, strategies: str | None, monkeypatch) -> Iterator[DevicePluginSet]:
    """Every resource of ``trace`` served by ``DevicePluginSet.from_settings`` to a fake kubelet,
    with ``strategies`` as ``OMATICAYA_DEVICE_LIST_STRATEGY`` (``None``: unset)."""
    folder = Path(tempfile.mkdtemp(prefix="dls-", dir="/tmp"))  # short: unix socket paths
    monkeypatch.chdir(folder)  # no stray .env
    if strategies is None:
        monkeypatch.delenv("OMATICAYA_DEVICE_LIST_STRATEGY", raising=False)
    else:
        monkeypatch.setenv("OMATICAYA_DEVICE_LIST_STRATEGY", strategies)
    settings = load_settings(
        trace=trace, device_plugin_dir=folder, device_plugin_resource="example.com/gpu"
    )
    agent = Agent(settings, TraceReader(trace, at_s=0.0), NodeApi(None, dry_run=True))
    agent.tick()
    kubelet = FakeKubelet(folder)
    kubelet.start()
    config = plugin_config(settings)
    dps = DevicePluginSet(agent, replace(config, timing=replace(config.timing, resync_s=0.5)))
    dps.start()
    try:
        assert dps.wait_registered(10)
        yield dps
    finally:
        dps.stop(0)
        kubelet.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def plugins(request, monkeypatch: pytest.MonkeyPatch) -> Iterator[DevicePluginSet]:
    """The MIG trace's resources (GPU 1 whole, GPU 0 as seven 1g.10gb MIG devices), with
    ``request.param`` as ``OMATICAYA_DEVICE_LIST_STRATEGY``."""
    with serving(MIG_MIXED, request.param, monkeypatch) as dps:
        yield dps


def allocate(plugin, *devices: str) -> api_pb2.ContainerAllocateResponse:
    with grpc.insecure_channel(f"unix://{plugin.socket_path}") as channel:
        resp = api_pb2_grpc.DevicePluginStub(channel).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=list(devices))]
            ),
            timeout=5,
        )
    (one,) = resp.container_responses
    return one


@pytest.mark.parametrize(
    ("plugins", "whole", "mig"),
    [
        (None, expect({NVD: GPU1}, mounts=(GPU1,)), expect({NVD: MIG}, mounts=(MIG,))),
        ("envvar", expect({NVD: GPU1}), expect({NVD: MIG})),
        ("volume-mounts", expect({NVD: ROOT}, mounts=(GPU1,)), expect({NVD: ROOT}, mounts=(MIG,))),
        (
            "cdi-annotations,cdi-cri",
            expect(annotations={key(GPU1): f"nvidia.com/gpu={GPU1}"}, cdi=(GPU1,)),
            expect(annotations={key(MIG): f"nvidia.com/gpu={MIG}"}, cdi=(MIG,)),
        ),
    ],
    ids=["unset", "envvar", "volume-mounts", "cdi"],
    indirect=["plugins"],
)
def test_allocate_over_grpc_follows_the_setting(plugins, whole, mig) -> None:
    assert set(plugins.plugins) == {None, "1g.10gb"}
    assert allocate(plugins.plugins[None], GPU1) == whole
    assert allocate(plugins.plugins["1g.10gb"], MIG) == mig


def test_a_device_no_strategy_can_name_fails_allocate_and_the_plugin_keeps_serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A trace whose whole GPU's UUID would climb out of the mount root: its Allocate fails
    (the kubelet then does not admit the pod), no mount is answered, and the next call for a
    good device (a MIG device of the other GPU) is answered."""
    doc = json.loads(MIG_MIXED.read_text())
    bad = "GPU-e26e8cb2/../../etc"
    doc["devices"][1]["uuid"] = bad
    trace = tmp_path / "bad-uuid-trace.json"
    trace.write_text(json.dumps(doc))
    with serving(trace, "envvar,volume-mounts", monkeypatch) as dps:
        with pytest.raises(grpc.RpcError) as err:
            allocate(dps.plugins[None], bad)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert bad in err.value.details()
        assert allocate(dps.plugins["1g.10gb"], MIG) == expect({NVD: MIG}, mounts=(MIG,))
