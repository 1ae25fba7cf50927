"""Who uses each GPU, published: an agent replays a trace whose GPU 0 runs two compute
processes, one in a pod and one in none (out-of-band), with the kubelet's PodResources (a local
gRPC server speaking the kubelet's v1 API; the real kubelet is in
``tests/agent/test_podresources_kubelet.py``) and a host ``/proc`` of real cgroup files.

What must come out: the telemetry names the pod holding the GPU and the out-of-band memory; the
label ``gpu-0.memory.out-of-band-mib`` appears only when non-zero; the metrics carry
dcgm-exporter's ``pod``/``namespace``/``container`` labels and the out-of-band gauge; the device
plugin does not prefer the GPU whose memory is held out-of-band; the write budget treats more
out-of-band memory as a change for the worse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.attribution_reader import Attribution
from omaticaya_py.agent.metrics import agent_registry
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.publish.budget import urgent
from omaticaya_py.deviceplugin.allocation import preferred
from omaticaya_py.deviceplugin.plugin import DevicePlugin
from omaticaya_py.kube.podresources.v1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.agent.attribution_publish_support import (  # the names moved out, for this file's tests
    CONTAINER_ID,  # noqa: F401
    GONE_PID,  # noqa: F401
    IN_POD_MIB,  # noqa: F401
    IN_POD_PID,  # noqa: F401
    MIB,  # noqa: F401
    OUT_OF_BAND_MIB,  # noqa: F401
    OUT_OF_BAND_PID,  # noqa: F401
    POD_UID,  # noqa: F401
    host_proc,  # noqa: F401
    trace_with_processes,  # noqa: F401
)

P = "omaticaya.io/"






class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, gpu: str) -> None:
        self.gpu = gpu

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        devices = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[self.gpu])
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name="train-0",
                    namespace="ml",
                    containers=[api_pb2.ContainerResources(name="trainer", devices=[devices])],
                )
            ]
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Agent, list[str]]]:
    trace, uuids = trace_with_processes(tmp_path)
    socket_path = tmp_path / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(uuids[0]), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    settings = load_settings(node_name="n", min_patch_interval_s=0, out_of_band_event_mib=4096)
    agent = Agent(
        settings, TraceReader(trace, at_s=1.0), NodeApi(None, dry_run=True),
        attribution=Attribution(socket_path, host_proc(tmp_path)),
    )  # fmt: skip
    try:
        yield agent, uuids
    finally:
        agent.attribution.close()
        server.stop(None)


def test_telemetry_labels_and_metrics_say_who_uses_the_gpu(rig):
    agent, uuids = rig
    result = agent.tick()
    att = result.attribution[uuids[0]]
    assert att.out_of_band_pids == (OUT_OF_BAND_PID,) and att.out_of_band_memory_mib == OUT_OF_BAND_MIB
    assert [(p.pod_uid, p.container_id, p.used_memory_mib) for p in att.pods] == [
        (POD_UID, CONTAINER_ID, IN_POD_MIB)
    ]

    doc = json.loads(result.desired.annotations[P + "telemetry"])
    gpu0, gpu1, gpu4 = doc["gpus"][0], doc["gpus"][1], doc["gpus"][4]
    assert gpu0["pods"] == [
        {"namespace": "ml", "pod": "train-0", "container": "trainer", "memory_used_mib": IN_POD_MIB}
    ]
    assert gpu0["memory_out_of_band_mib"] == OUT_OF_BAND_MIB
    assert gpu4["pods"] == [] and gpu4["memory_out_of_band_mib"] == 0  # idle: nothing out-of-band
    # GPU 1's process is not in this /proc: unknown, so its out-of-band memory is not said
    assert gpu1["pods"] == [] and "memory_out_of_band_mib" not in gpu1

    labels = result.desired.labels
    assert labels[P + "gpu-0.memory.out-of-band-mib"] == "6144"  # a whole number of GiB steps
    assert not any(k.endswith("out-of-band-mib") for k in labels if "gpu-0." not in k)

    registry = CollectorRegistry()
    agent_registry(agent, registry)
    on_gpu0 = {"gpu": "0", "uuid": uuids[0]}
    held = {"pod": "train-0", "namespace": "ml", "container": "trainer"}
    used = registry.get_sample_value("omaticaya_gpu_memory_used_bytes", {**on_gpu0, **held})
    assert used == result.snapshot.gpus[0].memory_used_mib * MIB
    assert registry.get_sample_value(
        "omaticaya_gpu_utilization_ratio", {**on_gpu0, **held}
    ) is not None
    unheld = {"gpu": "1", "uuid": uuids[1], "pod": "", "namespace": "", "container": ""}
    assert registry.get_sample_value("omaticaya_gpu_memory_used_bytes", unheld) is not None
    assert registry.get_sample_value(
        "omaticaya_gpu_out_of_band_memory_bytes", on_gpu0
    ) == OUT_OF_BAND_MIB * MIB


def test_without_the_host_proc_nothing_is_called_out_of_band(rig, tmp_path):
    """No host /proc (no hostPID): the processes are unknown, never out-of-band."""
    agent, uuids = rig
    agent.attribution.proc_root = None
    result = agent.tick()
    assert result.attribution[uuids[0]].unknown_pids == (IN_POD_PID, OUT_OF_BAND_PID)
    doc = json.loads(result.desired.annotations[P + "telemetry"])
    assert "memory_out_of_band_mib" not in doc["gpus"][0]
    assert doc["gpus"][0]["pods"] == [{"namespace": "ml", "pod": "train-0", "container": "trainer"}]
    assert not any(k.endswith("out-of-band-mib") for k in result.desired.labels)


def test_without_the_kubelet_socket_processes_are_still_placed(tmp_path):
    trace, uuids = trace_with_processes(tmp_path)
    edge = Attribution(tmp_path / "absent.sock", host_proc(tmp_path))
    agent = Agent(load_settings(node_name="n"), TraceReader(trace, at_s=1.0),
                  NodeApi(None, dry_run=True), attribution=edge)  # fmt: skip
    for _ in range(3):
        result = agent.tick()
    assert edge.errors == {"absent": 3}  # counted each tick (logged once)
    assert result.attribution[uuids[0]].holders == ()
    assert result.attribution[uuids[0]].out_of_band_memory_mib == OUT_OF_BAND_MIB


def test_the_device_plugin_does_not_prefer_a_gpu_held_out_of_band(rig):
    """GPU 0 and GPU 4 of the trace are both idle, with the same free memory, but GPU 0 now
    holds 16 GiB of processes (6 GiB of them in no pod): live free memory counts them, so the
    preferred allocation takes GPU 4 first."""
    agent, uuids = rig
    agent.tick()
    plugin = DevicePlugin(agent, devices=list(enumerate(uuids)))
    states = {s.id: s for s in plugin.devices()}
    assert states[uuids[0]].free_mib < states[uuids[4]].free_mib
    assert preferred(states, [uuids[0], uuids[4]], [], 1) == [uuids[4]]


@pytest.mark.parametrize(
    ("before", "after", "urgent_expected"),
    [
        (None, "6144", False),  # appears (the free memory label drops with it, at once)
        ("6144", "8192", True),  # more memory held out-of-band: worse, at once
        ("8192", "6144", False),  # less: better, may wait
    ],
    ids=["appears", "grows", "shrinks"],
)
def test_out_of_band_label_in_the_write_budget(before, after, urgent_expected):
    key = P + "gpu-0.memory.out-of-band-mib"
    prior = {P + "gpu.health": "Healthy", **({key: before} if before else {})}
    later = {P + "gpu.health": "Healthy", key: after}
    assert urgent(prior, later) is urgent_expected


@pytest.mark.cluster
def test_out_of_band_event_once_per_episode(dev_cluster, admin_api, make_node, tmp_path):
    """On the real API server: one ``GpuOutOfBandMemory`` Event while the out-of-band process
    holds its memory, none more at later ticks; once it is gone and back, a second one."""
    from omaticaya_py.kube import NodeClient

    trace, uuids = trace_with_processes(tmp_path)
    proc = host_proc(tmp_path)
    node = make_node()
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig), sleep=lambda s: None)
    settings = load_settings(node_name=node, min_patch_interval_s=0, out_of_band_event_mib=4096)
    agent = Agent(settings, TraceReader(trace, at_s=1.0), NodeApi(client, lease=None),
                  attribution=Attribution(None, proc))  # fmt: skip
    oob_cgroup = proc / str(OUT_OF_BAND_PID) / "cgroup"
    host_line = oob_cgroup.read_text()

    def events() -> list[str]:
        found = admin_api.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node},reason=GpuOutOfBandMemory"
        ).items
        return sorted(e.message for e in found)

    try:
        for _ in range(3):
            agent.tick()
        (message,) = events()
        assert message.startswith(f"GPU 0: {OUT_OF_BAND_MIB} MiB held by processes in no pod")
        assert f"PIDs {OUT_OF_BAND_PID}" in message
        # the process exits (its PID now in a pod's cgroup stands for "no more out-of-band")
        oob_cgroup.write_text((proc / str(IN_POD_PID) / "cgroup").read_text())
        agent.tick()
        assert len(events()) == 1
        oob_cgroup.write_text(host_line)  # a new episode
        agent.tick()
        agent.tick()
        assert len(events()) == 2
        assert agent.events_posted["GpuOutOfBandMemory"] == 2
    finally:
        client.close()


def test_out_of_band_through_real_pynvml_and_the_nvml_test_library(tmp_path):
    """``omaticaya show`` reading NVML (the test library serving the trace, through the real
    pynvml and NvmlReader): the process in no pod is out-of-band in the labels."""
    import subprocess
    import sys

    from tests import nvmltestlib

    reason = nvmltestlib.testlib_unavailable_reason()
    if reason:
        pytest.skip(reason)
    trace, _ = trace_with_processes(tmp_path)
    env = nvmltestlib.testlib_env(trace)
    env.update(OMATICAYA_PROC_ROOT=str(host_proc(tmp_path)), OMATICAYA_POD_RESOURCES_SOCKET="")
    proc = subprocess.run(
        [sys.executable, "-m", "omaticaya_py", "show", "--node", "n", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["labels"][P + "gpu-0.memory.out-of-band-mib"] == "6144"
    gpu0 = json.loads(out["annotations"][P + "telemetry"])["gpus"][0]
    assert gpu0["memory_out_of_band_mib"] == OUT_OF_BAND_MIB
    assert json.loads(out["annotations"][P + "telemetry"])["source"] == "nvml"
