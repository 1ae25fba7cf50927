"""GPU sharing by memory on a real kubelet + containerd 2 (issue 25's tests, the node side).

``omaticaya device-plugin`` runs as on a GPU node, without ``--trace``: real ``pynvml`` reads the
NVML test library, which serves the 8-GPU sharing trace (``test_device_plugin_sharing``:
GPU 0 81,079 MiB free, GPU 1 50,359 with 30 GiB held out of band, GPU 2 70,839, GPU 3 9,399,
every GPU 79 units of 1,024 MiB) at the sample the test writes to a sample file, so each phase
lasts as long as the test needs it. GPUs 0-3 are shared (``omaticaya.io/gpu-memory``), 4-7
whole (``nvidia.com/gpu``). ``OMATICAYA_SETTLE_S`` is an hour: the test pods (busybox)
never use their slices, so only the plugin's book keeps them counted against live memory.

The tests follow one another (pods stay): A, B, C, then the out-of-band phase, F, health,
refusals, a whole-GPU pod, a kubelet restart. Needs Linux and root; skipped otherwise.
"""

from __future__ import annotations

import json

import pytest

from tests.deviceplugin.device_plugin_kubelet_support import (
    _device_ids,
    admission_error,
    container_id,
)
from tests.deviceplugin.device_plugin_sharing_kubelet_support import (  # the names moved out, for this file's tests
    ENVS,  # noqa: F401
    GPU,  # noqa: F401
    MEM,  # noqa: F401
    Plugin,  # noqa: F401
    kubelet,  # noqa: F401
    plugin,  # noqa: F401
    pods,  # noqa: F401
    resources,  # noqa: F401
    run,  # noqa: F401
    running_env,  # noqa: F401
    slice_of,  # noqa: F401
)
from tests.deviceplugin.device_plugin_sharing_support import UUID
from tests.kubelet import (
    PLUGIN_DIR,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

CHECKPOINT = PLUGIN_DIR / "kubelet_internal_checkpoint"


















def checkpoint() -> dict[str, dict[str, list[str]]]:
    """resource -> pod UID -> device IDs, from the kubelet's checkpoint."""
    out: dict[str, dict[str, list[str]]] = {}
    for e in json.loads(CHECKPOINT.read_text())["Data"]["PodDeviceEntries"]:
        out.setdefault(e["ResourceName"], {}).setdefault(e["PodUID"], []).extend(_device_ids(e["DeviceIDs"]))
    return out


def refused(admin_api, pods, name: str, resource: str, count: int) -> str:
    pods(name, resource, count)
    return wait_for(f"{name} refused", lambda: admission_error(admin_api, name), 60)


# -- the tests, in order ------------------------------------------------------------------


def test_capacity_shows_units_of_four_gpus_and_four_whole(admin_api, kubelet, plugin) -> None:
    # registered first: the Node may still show what an earlier module's plugin served
    wait_for(
        "both registered",
        lambda: all(f"device plugin registered {r}" in plugin.log() for r in (GPU, MEM)),
        60,
    )
    want = {GPU: (4, 4), MEM: (4 * 79, 4 * 79)}
    assert wait_for("both resources", lambda: resources(admin_api, kubelet) == want, 60), plugin.log()


def test_out_of_band_memory_steers_the_second_slice_away(admin_api, kubelet, plugin, pods) -> None:
    # A: GPU 1, the least live room that fits (30 GiB already held there out of band)
    assert slice_of(run(admin_api, pods, "slice-a", MEM, 30)) == (1, 30720)
    # B: not GPU 1 (49 units left by the kubelet's books, 19,639 MiB by the GPU), nor GPU 3
    # (79 units, 9,399 MiB): GPU 2
    assert slice_of(run(admin_api, pods, "slice-b", MEM, 30)) == (2, 30720)


def test_two_slices_share_a_gpu_and_the_next_goes_to_another(admin_api, kubelet, plugin, pods) -> None:
    env_c = run(admin_api, pods, "slice-c", MEM, 30)
    assert slice_of(env_c) == (2, 30720)  # binpack: beside B, same UUID
    # a process outside Kubernetes takes 60 GiB of GPU 0 (GPU 7 goes unhealthy with it, which
    # tells the test the plugin read the sample): a fourth 30 GiB slice fits nowhere now
    plugin.serve(3)
    wait_for("sample 3 read", lambda: resources(admin_api, kubelet)[GPU] == (4, 3), 30)
    assert refused(admin_api, pods, "slice-e", MEM, 30) == "UnexpectedAdmissionError"
    assert "does not fit" in plugin.log()
    plugin.serve(0)  # it is gone: the fourth goes to GPU 0
    wait_for("sample 0 read", lambda: resources(admin_api, kubelet)[GPU] == (4, 4), 30)
    assert slice_of(run(admin_api, pods, "slice-f", MEM, 30)) == (0, 30720)


def test_an_unhealthy_shared_gpu_takes_its_units_out_and_back(admin_api, kubelet, plugin) -> None:
    plugin.serve(1)  # GPU 2 remapped rows pending
    wait_for("GPU 2's units out", lambda: resources(admin_api, kubelet) == {GPU: (4, 4), MEM: (316, 237)}, 30)
    plugin.serve(2)
    wait_for("GPU 2's units back", lambda: resources(admin_api, kubelet) == {GPU: (4, 4), MEM: (316, 316)}, 30)


def test_units_across_two_gpus_are_refused(admin_api, kubelet, plugin, pods) -> None:
    # no GPU has 80 units: the plugin prefers none, the kubelet picks across GPUs, Allocate says no
    assert refused(admin_api, pods, "slice-wide", MEM, 80) == "UnexpectedAdmissionError"
    assert "span" in plugin.log() and "a slice of 1024 MiB units comes from one GPU" in plugin.log()


def test_no_gpu_is_given_whole_and_in_slices(admin_api, kubelet, plugin, pods) -> None:
    env = run(admin_api, pods, "whole-4", GPU, 4)
    assert set(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == set(UUID[4:])
    assert "OMATICAYA_GPU_MEMORY_LIMIT_MIB" not in env
    held = checkpoint()
    whole = {d for ids in held[GPU].values() for d in ids}
    sliced = {d.split("::")[0] for ids in held[MEM].values() for d in ids}
    assert whole == set(UUID[4:]) and sliced == {UUID[0], UUID[1], UUID[2]}


def test_kubelet_restart_keeps_the_slices(admin_api, kubelet, plugin, pods, dev_cluster) -> None:
    names = ("slice-a", "slice-b", "slice-c", "slice-f", "whole-4")
    held = {n: container_id(admin_api, n) for n in names}
    before = checkpoint()[MEM]
    registrations = plugin.log().count("device plugin registered omaticaya.io/gpu-memory")
    dev_cluster.restart_kubelet()
    wait_for(
        "re-registration",
        lambda: plugin.log().count("device plugin registered omaticaya.io/gpu-memory") > registrations,
        30,
    )
    wait_for("capacity after restart", lambda: resources(admin_api, kubelet)[MEM][0] == 316, 30)
    for name, container in held.items():
        assert container_id(admin_api, name) == container, name
        assert admin_api.read_namespaced_pod(name, "default").status.phase == "Running"
    assert checkpoint()[MEM] == before
    # still counted on both books: 10 GiB goes to GPU 1 (A's slice leaves it 19,639 MiB, the
    # least room that fits); GPU 0 and 1 would tie at 49 units if A's slice were forgotten
    assert slice_of(run(admin_api, pods, "slice-g", MEM, 10)) == (1, 10240)


def test_graceful_stop(plugin) -> None:
    assert plugin.stop() == 0
    assert not list(PLUGIN_DIR.glob("omaticaya-*.sock"))
