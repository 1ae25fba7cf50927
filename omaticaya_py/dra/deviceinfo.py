"""The node's DRA devices as the plugin sees them now: the agent's latest reading made devices by
the publisher's rule (``core.publish.dra.inventory``), and what prepare reads from the node
besides (``prepare.NodeFacts``: device nodes, minors, the MPS daemons of shared GPUs, the
driver's files: ``driverfiles``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..core.allocation.memory_limit import driver_major
from ..core.allocation.mps import Layout
from ..core.config.settings import Settings, stuck_after_s
from ..core.model.sharing import Sharing
from ..core.publish.dra import DraDevice, inventory
from ..core.publish.readings import AgentFeed, ReadingAge
from ..sources.mps import MpsWatch
from .driverfiles import DriverFiles
from .host import device_nodes, gpu_minors
from .metrics import DraCounts
from .prepare import CONTROL_NODES, NodeFacts

__all__ = ["NodeDevices"]


class NodeDevices:
    """The devices of Node ``settings.node_name`` (the pool) in ``feed``'s latest reading.

    ``settings``: ``dra_dev_root``, ``proc_root``, ``shared_gpus``, ``share_unit_mib``,
    ``share_enforcement``, ``mps_root``, ``mps_state_dir``, ``mps_stale_s``,
    ``mps_thread_share``, ``memory_step_mib``, ``hysteresis_pct`` and the stuck-reading bound
    (``stale_after_s``: ``core.config.settings.stuck_after_s``). Shared GPUs enforced by MPS:
    ``layout`` the daemons' folders, ``mps`` their watch (``mps``: the agent's, else one of its
    own); otherwise both ``None``. ``driver_files``: the driver's files (``dra_driver_files``,
    ``dra_driver_root``, ``dra_driver_host_root``), counted in ``counts``."""

    def __init__(self, feed: AgentFeed, settings: Settings, mps: MpsWatch | None,
                 counts: DraCounts | None = None) -> None:  # fmt: skip
        self.feed = feed
        self.settings = settings
        self.pool = str(settings.node_name)
        self.dev_root = Path(settings.dra_dev_root)
        self.sharing = Sharing.of(settings)
        enforced = bool(settings.shared_gpus) and settings.share_enforcement == "mps"
        self.layout = Layout(settings.mps_root, settings.mps_state_dir) if enforced else None
        if self.layout is not None and mps is None:
            mps = MpsWatch(self.layout, settings.mps_stale_s)
        self.mps = mps if enforced else None
        self.stale_after_s = stuck_after_s(settings)
        self._age = ReadingAge()  # the reading served, on ``feed.clock``
        self.driver_files = DriverFiles(settings, counts if counts is not None else DraCounts())

    def driver_version(self) -> str | None:
        """The driver's version in the latest reading (``None``: no reading, or unknown)."""
        last = self.feed.cache.last
        return last.snapshot.driver_version if last is not None else None

    def start(self) -> None:
        """At the plugin's start: find the driver's files (``driverfiles.DriverFiles.load``),
        for the latest reading's driver version when there is one."""
        self.driver_files.load(self.driver_version())

    def devices(self) -> tuple[list[DraDevice] | None, str]:
        """The node's devices in the latest reading (``core.publish.dra.inventory``, the publisher's
        rule), or ``(None, why)``: no reading yet, NVML unreadable, or the reading older than
        the stuck bound on the plugin's clock (``stale-reading``)."""
        last = self.feed.cache.last
        if last is None:
            return None, "no reading of the GPUs yet (the agent has not finished its first tick)"
        age_s = self._age.age_s(last.snapshot, float(self.feed.clock()))
        if age_s > self.stale_after_s:
            return None, (f"stale-reading: the agent's reading is {age_s:.0f}s old (over "
                          f"{self.stale_after_s:.0f}s)")  # fmt: skip
        if last.snapshot.error is not None:
            return None, f"NVML cannot be read: {last.snapshot.error}"
        s = self.settings
        return inventory(last.snapshot, last.health, self.sharing, s.memory_step_mib,
                         s.hysteresis_pct), ""  # fmt: skip

    def facts(self, devices: Sequence[DraDevice]) -> NodeFacts:
        """What prepare reads from the node for ``devices``: their device nodes under the dev
        root (and the control nodes), minors (``host.gpu_minors``), whether each shared GPU's
        MPS daemon is up, the driver's branch and files."""
        minors = gpu_minors(self.settings.proc_root)
        names = {f"nvidia{minors.get(d.gpu_uuid or '', d.gpu_index)}" for d in devices}
        mps_up = {}
        if self.mps is not None:
            for d in devices:
                if d.shared and d.gpu_uuid:
                    e = self.mps.enforcement(d.gpu_uuid)
                    mps_up[d.gpu_uuid] = (e.up, e.reason)
        last = self.feed.cache.last
        return NodeFacts(
            pool=self.pool, dev_root=self.dev_root,
            nodes=device_nodes(self.dev_root, sorted(names) + list(CONTROL_NODES)),
            minors=minors, mps=self.layout, mps_up=mps_up,
            thread_share=self.settings.mps_thread_share,
            driver_major=driver_major(last.snapshot.driver_version) if last is not None else None,
            driver_mounts=self.driver_files.mounts(self.driver_version()),
        )  # fmt: skip
