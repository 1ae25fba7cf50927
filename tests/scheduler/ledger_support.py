"""What other test files share of test_ledger.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.inflight import Placement

NOW = 1_800_000_000.0


def node(name: str, *free: int, read_age_s: float = 5, unhealthy: tuple[int, ...] = ()) -> NodeGpuState:
    gpus = tuple(GpuInfo(i, f, i not in unhealthy) for i, f in enumerate(free))
    return NodeGpuState(
        name=name, known=True, health="Healthy", read_at=NOW - read_age_s,
        expires_at=NOW - read_age_s + 330, gpus=gpus,
        free_total_mib=sum(g.free_mib for g in gpus if g.healthy),
    )  # fmt: skip


def res(uid: str, node: str, gpus: tuple[int, ...] = (0,), *, at: float = NOW, mib: int = 30000,
        baseline: int | None = 70000) -> Placement:  # fmt: skip
    return Placement(f"ns/{uid}", uid, node, mib, len(gpus) or 1, placed_at=at,
                     gpus=gpus, bound=False)  # fmt: skip
