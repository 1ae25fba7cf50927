"""What other test files share of test_device_plugin_sharing.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import grpc

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.model.sharing import unit_ids
from omaticaya_py.deviceplugin import DevicePluginSet
from omaticaya_py.deviceplugin.config import Timing, plugin_config
from omaticaya_py.deviceplugin.slices import (
    Slice,
)
from omaticaya_py.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from omaticaya_py.sources.replay import TraceReader
from tests.deviceplugin.device_plugin_support import FakeKubelet, folder  # noqa: F401
from tests.helpers import MULTI_TRACE, Clock, settings

UUID = [f"GPU-{i:08d}-7fda-b7ae-a94e-630097a14ca4" for i in range(8)]


UNITS = 79  # 81,559 MiB // 1,024


GPU_RESOURCE = "example.com/gpu"


SHARED_RESOURCE = "example.com/gpu-memory"


#: the out-of-band process of sample 3 on GPU 0 (MiB)
OUT_OF_BAND_MIB = 61440


def write_sharing_trace(path: Path) -> Path:
    """The 8-GPU trace as four samples: steady (t=0), GPU 2's remapped rows pending (t=1: GPU 2
    Unhealthy), steady again (t=2), and (t=3) a process Kubernetes does not know holding 60 GiB
    on GPU 0 (19,639 MiB free) while GPU 7 (whole, not shared) has remapped rows pending (a
    change the kubelet shows, so a test can tell the plugin read this sample)."""
    doc = json.loads(MULTI_TRACE.read_text())
    steady = doc["samples"][0]
    samples = []
    for t in (0.0, 1.0, 2.0, 3.0):
        s = copy.deepcopy(steady)
        s["t"] = t
        if t == 1.0:
            s["gpus"][2]["remapped_rows"]["pending"] = 1
        if t == 3.0:
            g = s["gpus"][0]
            for key in ("memory_bytes", "memory_v2_bytes"):
                g[key]["used"] += OUT_OF_BAND_MIB << 20
                g[key]["free"] -= OUT_OF_BAND_MIB << 20
            g["compute_processes"] = [{"pid": 49999, "usedGpuMemory": OUT_OF_BAND_MIB << 20}]
            s["gpus"][7]["remapped_rows"]["pending"] = 1
        samples.append(s)
    doc["samples"] = samples
    doc["interval_s"] = 1.0
    doc["phases"] = [
        {"t": 0, "phase": "steady"}, {"t": 1, "phase": "GPU 2 remap pending"},
        {"t": 2, "phase": "steady"}, {"t": 3, "phase": "60 GiB out of band on GPU 0; GPU 7 remap pending"},
    ]
    doc["source"] = "synthetic, for tests: multi-gpu-trace.json sample 0 with the phases above"
    path.write_text(json.dumps(doc))
    return path


def units_of(gpu: int, n: int | None = None, start: int = 0) -> list[str]:
    ids = unit_ids(UUID[gpu], UNITS)
    return ids[start:] if n is None else ids[start : start + n]


def s(mib: int, at_s: float, baseline: int | None, gpu: int = 1) -> Slice:
    return Slice(frozenset({f"{UUID[gpu]}::{at_s}"}), UUID[gpu], mib, at_s, baseline)


class Rig:
    """``DevicePluginSet.from_settings`` over a real Agent replaying the sharing trace with GPUs
    0-3 shared; trace time moves with ``at(t)``, the plugins' clock with ``clock.t``."""

    def __init__(self, folder: Path, **overrides) -> None:
        trace = write_sharing_trace(folder / "sharing-trace.json")
        self.settings = settings(
            trace=str(trace), device_plugin_resource=GPU_RESOURCE, shared_resource=SHARED_RESOURCE,
            device_plugin_dir=str(folder), shared_gpus="0-3", schedule="@every 1s",
            **{"share_enforcement": "none", **overrides},  # MPS: tests/deviceplugin/test_device_plugin_mps.py
        )
        self.reader = TraceReader(trace, at_s=0.0)
        self.agent = Agent(self.settings, self.reader, NodeApi(None, dry_run=True))
        self.clock = Clock(1000.0)
        config = plugin_config(self.settings)
        timing = Timing(resync_s=0.5, stale_after_s=10.0, clock=self.clock)
        self.set = DevicePluginSet(self.agent, replace(config, timing=timing))
        self.kubelet = FakeKubelet(folder)
        self.channels: list[grpc.Channel] = []

    def at(self, t: float) -> None:
        self.reader.at_s = t
        self.agent.tick()
        self.set.notify()

    def stub(self, shared: bool = True) -> api_pb2_grpc.DevicePluginStub:
        plugin = self.set.shared_plugin if shared else self.set.plugins[None]
        assert plugin is not None
        channel = grpc.insecure_channel(f"unix://{plugin.socket_path}")
        self.channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)

    def preferred(self, available: list[str], size: int, must: list[str] = ()) -> list[str]:
        resp = self.stub().GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=list(must),
                    allocation_size=size,
                )
            ]),
            timeout=5,
        )
        return list(resp.container_responses[0].deviceIDs)

    def allocate(self, ids: list[str], shared: bool = True) -> dict[str, str]:
        resp = self.stub(shared).Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=ids)]),
            timeout=5,
        )
        return dict(resp.container_responses[0].envs)
