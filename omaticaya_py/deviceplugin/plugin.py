"""One kubelet device plugin (API ``v1beta1``): a resource's devices, served and registered over gRPC."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..core.allocation.memory_limit import driver_major
from ..core.publish.readings import AgentFeed, TickResult
from ..sources.mps import MpsWatch
from .allocation import DeviceState, mig_resource_name
from .config import DEFAULT_CONFIG, MpsConfig, PluginConfig, Scope
from .inventory import Inventory
from .registration import Endpoint, KubeletRegistration
from .service import DeviceService
from .slicer import Enforcement, KubeletView, Slicer

__all__ = ["DevicePlugin"]


class DevicePlugin:
    """One resource's device plugin, composed of its ``inventory`` (``inventory.Inventory``: the
    devices and their health from the agent's cache), its ``service`` (``service.DeviceService``:
    the kubelet's calls), its ``registration`` (``registration.KubeletRegistration``: serving the
    service on its socket and registering it) and, for the shared resource, its ``slicer``
    (``slicer.Slicer``: the book of slices).

    - ``source``: what it reads from the agent (``core.publish.readings.AgentFeed``: an ``Agent``), or
      ``service.CacheFeed`` over a bare cache (``.last`` the latest ``TickResult``) ticked by
      someone else.
    - ``config``: the node's plugins' configuration (``config.PluginConfig``: resource names,
      folder, strategies, sharing, timing, devices known in advance).
    - ``profile``: ``None`` serves whole GPUs (MIG off), as ``config.resource_name``; a MIG
      profile (``1g.10gb``) its MIG devices, as ``nvidia.com/mig-1g.10gb``.
    - ``units``: serve the shared GPUs' memory units instead (``config.sharing``), as its
      ``resource_name``; the whole-GPU resource leaves those GPUs out. Under MPS
      (``config.sharing.mps``), ``mps`` watches each shared GPU's probe daemon: a GPU whose
      probe is not up (or whose supervisor died) serves no units (Unhealthy, with the reason),
      and ``Allocate`` makes each slice container the client of a daemon of its own slice,
      let go on the tick that finds its units released.
    - ``devices``: ``(index, uuid)`` (unit IDs for ``units``) known before the first reading;
      ``None``: those of ``config`` for this resource.

    ``start()`` serves and registers in a background thread; ``stop()`` undoes it.
    """

    def __init__(self, source: AgentFeed, config: PluginConfig = DEFAULT_CONFIG, *,
                 profile: str | None = None, units: bool = False,
                 devices: Iterable[tuple[int, str]] | None = None) -> None:  # fmt: skip
        sharing, timing = config.sharing, config.timing
        if devices is None:
            devices = config.shared_units if units else config.units.get(profile, ())
        self.slicer = (
            Slicer(sharing.unit_mib, policy=sharing.policy, settle_s=sharing.settle_s,
                   clock=timing.clock,
                   kubelet=KubeletView(lambda: source.last_listed, lambda: float(source.clock())),
                   enforcement=Enforcement(sharing.mps,
                                           driver_major=lambda: _driver_major(source)))
            if units else None
        )  # fmt: skip
        #: the shared GPUs' MPS daemons, as the supervisor last wrote them (units under MPS)
        self.mps = _watch(source, sharing.mps) if units and sharing.mps is not None else None
        if self.slicer is not None and self.slicer.daemons is not None:
            # each tick's PodResources list lets go of the daemons of slices that ended
            source.on_tick.append(self._sweep)
        scope = Scope(profile, sharing.shared, units)
        self.inventory = Inventory(source.cache, scope, devices, timing, self.slicer,
                                   self._enforced if self.mps is not None else None)  # fmt: skip
        self.service = DeviceService(self.inventory, slicer=self.slicer, strategies=config.strategies,
                                     poll_s=timing.poll_s)  # fmt: skip
        if units:
            name = sharing.resource_name
        elif profile is not None:
            name = mig_resource_name(config.resource_name, profile)
        else:
            name = config.resource_name
        endpoint = Endpoint(name, config.plugin_dir)
        self.registration = KubeletRegistration(self.service, endpoint, source, timing)
        self._source = source

    def _sweep(self, _result: TickResult) -> None:
        assert self.slicer is not None
        self.slicer.sweep()

    def _enforced(self, uuid: str) -> tuple[bool, str]:
        assert self.mps is not None
        now = self.mps.enforcement(uuid)
        return now.up, now.reason

    # -- the parts, as one plugin ------------------------------------------------------------

    @property
    def resource_name(self) -> str:
        """The extended resource served (``nvidia.com/gpu``)."""
        return self.registration.resource_name

    @property
    def socket_path(self) -> Path:
        """The plugin's socket."""
        return self.registration.socket_path

    @property
    def kubelet_socket(self) -> Path:
        """The kubelet's registration socket."""
        return self.registration.kubelet_socket

    @property
    def registrations(self) -> int:
        """Registrations the kubelet accepted."""
        return self.registration.registrations

    @property
    def serves(self) -> int:
        """gRPC servers started on the socket."""
        return self.registration.serves

    @property
    def refusals(self) -> int:
        """``Allocate`` and ``PreStartContainer`` calls refused."""
        return self.service.refusals

    @property
    def strategies(self) -> tuple[str, ...]:
        """NVIDIA's device list strategies ``Allocate`` answers by."""
        return self.service.strategies

    @property
    def stale(self) -> bool:
        """Whether the last look found the reading stale."""
        return self.inventory.stale

    @property
    def stale_after_s(self) -> float | None:
        """Devices are Unhealthy while the reading is older than this (``None``: off)."""
        return self.inventory.stale_after_s

    def devices(self) -> list[DeviceState]:
        """Every known device with its health from the latest reading (``Inventory.devices``)."""
        return self.inventory.devices()

    def gpu_states(self) -> list[DeviceState]:
        """The known GPUs (for the shared resource, not as units) with their health."""
        return self.inventory.gpu_states()

    def start(self) -> None:
        """Serve and register in a background thread; watch the folder for kubelet restarts."""
        self.registration.start()

    def stop(self, grace_s: float = 1.0) -> None:
        """End the streams (each sends its last list), close the server, remove the socket."""
        self.registration.stop(grace_s)

    def notify(self) -> None:
        """Wake every ``ListAndWatch`` stream now."""
        self.service.notify()

    def wait_registered(self, timeout_s: float) -> bool:
        """True once registered with the kubelet, waiting up to ``timeout_s`` seconds."""
        return self.registration.wait_registered(timeout_s)


def _driver_major(source: AgentFeed) -> int | None:
    """The NVIDIA driver's branch in the agent's latest reading (``None``: none yet)."""
    last = source.cache.last
    return driver_major(last.snapshot.driver_version) if last is not None else None


def _watch(source: AgentFeed, mps: MpsConfig) -> MpsWatch:
    """The agent's watch of the MPS daemons when it has one over the same folders (one read
    and one log line per change, not two), else one of the plugin's own."""
    agents: object = getattr(source, "mps", None)
    if isinstance(agents, MpsWatch) and agents.layout == mps.layout:
        return agents
    return MpsWatch(mps.layout, mps.stale_s)
