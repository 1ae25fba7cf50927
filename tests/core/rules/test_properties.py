"""Properties over generated readings and settings: every rendered key and value is valid
Kubernetes, numbers are integer strings, and the diff never touches a key outside the prefix."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from omaticaya_py.core.config.settings import Settings
from omaticaya_py.core.model.snapshot import ARCHITECTURES, GpuReading, NodeSnapshot, XidEvent
from omaticaya_py.core.publish.patch import NodeMeta, apply_patch, diff
from omaticaya_py.core.publish.render import TELEMETRY, is_valid_key, is_valid_value, render
from omaticaya_py.core.rules.health import XidPolicy, assess

PROFILE = hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMERIC_NAMES = re.compile(
    r"^(gpu\.count|gpu\.compute\.(major|minor)|cuda\.driver\.(major|minor)|gpu\.memory\.(total|free|free-total)-mib"
    r"|gpu\.utilization-pct|gpu\.idle-count|gpu\.healthy-count"
    r"|gpu-\d+\.(memory\.free-mib|utilization-pct|temperature-c))$"
)

dns_label = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?\Z")
prefixes = st.lists(dns_label, min_size=1, max_size=4).map(".".join)

ints = st.none() | st.integers(-(10**6), 10**6) | st.integers(-(10**80), 10**80)
floats = st.none() | st.floats(-1e6, 1e300, allow_nan=False, allow_infinity=False)
bools = st.none() | st.booleans()
errors = st.sampled_from(
    ["NVMLError_GpuIsLost", "NVMLError_Unknown", "NVMLError_Timeout", "NVMLError_NoPermission"]
)
products = st.none() | st.text(max_size=60) | st.text(min_size=150, max_size=200) | st.sampled_from(
    ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla V100 (PCIe)", "GeForce RTX™ 4090", "日本語", "x" * 200]
)
architectures = st.none() | st.sampled_from(sorted(set(ARCHITECTURES.values()))) | st.text(max_size=20)


@st.composite
def readings(draw, index: int) -> GpuReading:
    if draw(st.integers(0, 9)) == 0:
        return GpuReading(index=index, error=draw(errors), product=draw(products), uuid=draw(st.none() | st.text(max_size=40)))
    return GpuReading(
        index=index,
        uuid=draw(st.none() | st.text(max_size=40)),
        product=draw(products),
        architecture=draw(architectures),
        compute_major=draw(ints),
        compute_minor=draw(ints),
        memory_total_mib=draw(ints),
        memory_used_mib=draw(ints),
        memory_free_mib=draw(ints),
        utilization_pct=draw(floats),
        memory_utilization_pct=draw(floats),
        temperature_c=draw(ints),
        power_w=draw(floats),
        performance_state=draw(ints),
        ecc_uncorrected_volatile=draw(ints),
        ecc_corrected_volatile=draw(ints),
        remapped_rows_pending=draw(bools),
        remapped_rows_failure=draw(bools),
        process_count=draw(ints),
    )


@st.composite
def snapshots(draw) -> NodeSnapshot:
    clock_s = draw(st.floats(0, 1e6, allow_nan=False))
    read_at = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=draw(st.integers(0, 10**9)))
    if draw(st.integers(0, 9)) == 0:
        return NodeSnapshot(read_at=read_at, clock_s=clock_s, error=draw(st.sampled_from(["NVMLError_DriverNotLoaded", "NVMLError_LibraryNotFound"])))
    indices = draw(st.lists(st.integers(0, 99), unique=True, max_size=16))
    gpus = tuple(draw(readings(i)) for i in indices)
    events = draw(
        st.lists(
            st.builds(
                XidEvent,
                index=st.sampled_from(indices) if indices else st.integers(0, 99),
                xid=st.integers(0, 200),
                at_s=st.floats(clock_s - 2000, clock_s, allow_nan=False),
            ),
            max_size=5,
        )
    )
    cuda = draw(st.none() | st.tuples(st.integers(-5, 10**70), st.integers(-5, 99)))
    return NodeSnapshot(
        read_at=read_at,
        clock_s=clock_s,
        gpus=gpus,
        driver_version=draw(st.none() | st.just("580.159.04")),
        cuda_driver_version=cuda,
        xid_events=tuple(events),
    )


settings_st = st.builds(
    lambda **kw: Settings(_env_file=None, **kw),
    prefix=prefixes,
    memory_step_mib=st.integers(1, 1 << 20),
    utilization_step_pct=st.integers(1, 100),
    idle_utilization_pct=st.floats(0, 100, allow_nan=False),
    per_gpu_labels=st.booleans(),
    temperature_labels=st.booleans(),
    xid_all_fatal=st.booleans(),
    xid_quiet_s=st.floats(0, 5000, allow_nan=False),
)


def _evaluate(snap: NodeSnapshot, s: Settings):
    policy = XidPolicy(ignore=s.xid_ignore, all_fatal=s.xid_all_fatal, quiet_s=s.xid_quiet_s)
    health = assess(snap, snap.xid_events, policy)
    return health, render(snap, health, s)


@PROFILE
@given(snap=snapshots(), s=settings_st)
def test_every_rendered_label_is_valid_kubernetes(snap: NodeSnapshot, s: Settings) -> None:
    _, desired = _evaluate(snap, s)
    mark = s.prefix + "/"
    for key, value in desired.labels.items():
        assert key.startswith(mark)
        assert is_valid_key(key), key
        assert is_valid_value(value), (key, value)
        name = key.removeprefix(mark)
        if NUMERIC_NAMES.match(name):
            assert re.fullmatch(r"\d+", value), (key, value)
    for key, _value in desired.dropped:
        assert key not in desired.labels
    assert desired.labels[mark + "gpu.health"] in {"Healthy", "Degraded", "Unhealthy", "Unknown"}
    assert list(desired.annotations) == [mark + TELEMETRY]
    if snap.error is not None:
        assert desired.labels == {mark + "gpu.health": "Unknown"}


other_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9_.]{0,20}[a-z0-9])?\Z")
other_prefixes = st.sampled_from(
    ["kubernetes.io", "nvidia.com", "node.kubernetes.io", "feature.node.kubernetes.io", ""]
) | prefixes


@st.composite
def current_nodes(draw, prefix: str) -> tuple[NodeMeta, dict[str, str], dict[str, str]]:
    """A Node with foreign keys (some that merely start with the prefix text) and stale owned keys."""

    def foreign() -> dict[str, str]:
        keys = draw(
            st.lists(
                st.tuples(other_prefixes | st.just(prefix + ".evil") | st.just(prefix + "x"), other_names),
                max_size=8,
            )
        )
        return {
            (f"{p}/{n}" if p else n): draw(st.text(max_size=20))
            for p, n in keys
            if not f"{p}/{n}".startswith(prefix + "/")
        }

    labels, annotations = foreign(), foreign()
    owned_labels = {
        f"{prefix}/{n}": draw(st.text(max_size=10))
        for n in draw(st.lists(st.sampled_from(["gpu.count", "gpu-9.health", "gpu.health", "old", "gpu.memory.free-mib"]), max_size=4))
    }
    owned_annotations = {f"{prefix}/{TELEMETRY}": "{}"} if draw(st.booleans()) else {}
    node = NodeMeta(
        name="gpu-node-1",
        labels={**labels, **owned_labels},
        annotations={**annotations, **owned_annotations},
    )
    return node, labels, annotations


@PROFILE
@given(data=st.data(), snap=snapshots(), s=settings_st)
def test_diff_never_touches_keys_outside_the_prefix(data, snap: NodeSnapshot, s: Settings) -> None:
    _, desired = _evaluate(snap, s)
    current, other_labels, other_annotations = data.draw(current_nodes(s.prefix))
    telemetry_key = f"{s.prefix}/{TELEMETRY}"
    patch = diff(desired.labels, desired.annotations, current, s.prefix, volatile=[telemetry_key], refresh=True)
    if patch is not None:
        for section in patch["metadata"].values():
            for key in section:
                assert key.startswith(s.prefix + "/"), key
    after = apply_patch(current, patch or {})
    assert after.labels == {**other_labels, **desired.labels}
    assert after.annotations == {**other_annotations, **desired.annotations}
    # and once there, a second diff without refresh asks for nothing
    assert diff(desired.labels, desired.annotations, after, s.prefix, volatile=[telemetry_key]) is None
