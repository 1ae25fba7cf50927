"""The extender's second port (``OMATICAYA_EXTENDER_SCRAPE_PORT``): ``/metrics`` alone on
``OMATICAYA_EXTENDER_SCRAPE_ADDRESS``, for Prometheus to scrape from the pod's IP, while the
filter, prioritize and preempt verbs and the probes stay on ``OMATICAYA_EXTENDER_ADDRESS`` (the
chart: 127.0.0.1). ``serve`` runs for real, its node cache against an API server that does not
answer (no cluster: the cache retries, the ports serve meanwhile). The two addresses are two
loopback addresses, 127.0.0.1 and 127.0.0.2 (Linux answers on all of 127/8), so that each
port's reach is seen from another address than its own."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from omaticaya_py.core.config.settings import SettingsError
from omaticaya_py.scheduler import ExtenderSettings
from omaticaya_py.scheduler.settings import load_extender_settings
from tests.extender import metric
from tests.helpers import free_port
from tests.scheduler.offline_extender_support import ServedExtender, http, offline_settings

VERBS_AT, METRICS_AT = "127.0.0.1", "127.0.0.2"


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _settings(tmp_path: Path, **kw: Any) -> ExtenderSettings:
    return offline_settings(tmp_path, address=VERBS_AT, settle_s=0, **kw)


def test_the_scrape_port_serves_metrics_alone_and_the_verbs_stay_on_their_address(tmp_path):
    port, scrape_port = free_port(), free_port()
    served = ServedExtender(_settings(tmp_path, port=port, scrape_port=scrape_port,
                               scrape_address=METRICS_AT))  # fmt: skip
    try:
        assert served.ready.wait(30), "extender did not start"
        status, text = http(f"http://{METRICS_AT}:{scrape_port}/metrics")
        assert status == 200
        assert metric(text, "omaticaya_extender_cache_synced") == 0  # the API server is away
        assert "omaticaya_extender_decisions_total" in text
        # the same registry on both ports: a decision counted by a verb shows on the metrics port
        pod = {"metadata": {"name": "p", "annotations": {"omaticaya.io/gpu-memory-mib": "1024"}}}
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["n1"]}).encode()
        assert http(f"http://{VERBS_AT}:{port}/filter", body)[0] == 200
        _, text = http(f"http://{METRICS_AT}:{scrape_port}/metrics")
        assert sum(metric(text, "omaticaya_extender_decisions_total", verb="filter", result=r)
                   for r in ("passed", "failed")) >= 1  # fmt: skip
        # nothing else on the metrics port: not the verbs, not the probes
        for path in ("/filter", "/prioritize", "/preempt"):
            assert http(f"http://{METRICS_AT}:{scrape_port}{path}", b"{}")[0] == 404, path
        for path in ("/healthz", "/readyz"):
            assert http(f"http://{METRICS_AT}:{scrape_port}{path}")[0] == 404, path
        # the verbs' port is not reachable at the metrics address; /metrics is on it as well
        assert _refused(METRICS_AT, port)
        assert http(f"http://{VERBS_AT}:{port}/metrics")[0] == 200
    finally:
        served.close()
    assert served.code == [0]
    assert _refused(METRICS_AT, scrape_port) and _refused(VERBS_AT, port)


def test_a_scrape_port_in_use_ends_the_extender_and_frees_its_verbs_port(tmp_path):
    taken = socket.socket()
    taken.bind((METRICS_AT, 0))
    taken.listen()
    port = free_port()
    try:
        served = ServedExtender(_settings(tmp_path, port=port, scrape_port=taken.getsockname()[1],
                                   scrape_address=METRICS_AT))  # fmt: skip
        served.thread.join(30)
        assert served.code == [1] and not served.ready.is_set()
    finally:
        taken.close()
    with socket.socket() as again:  # the verbs' socket was closed, not left bound
        again.bind((VERBS_AT, port))


def test_without_a_scrape_port_only_the_verbs_port_listens(tmp_path):
    port = free_port()
    served = ServedExtender(_settings(tmp_path, port=port))
    try:
        assert served.ready.wait(30), "extender did not start"
        assert http(f"http://{VERBS_AT}:{port}/metrics")[0] == 200
        assert _refused(METRICS_AT, port)
    finally:
        served.close()


@pytest.mark.parametrize(("env", "says"), [
    ({"OMATICAYA_EXTENDER_SCRAPE_PORT": "8888"},
     "OMATICAYA_EXTENDER_SCRAPE_PORT must differ from OMATICAYA_EXTENDER_PORT (both 8888)"),
    ({"OMATICAYA_EXTENDER_PORT": "9404", "OMATICAYA_EXTENDER_SCRAPE_PORT": "9404"},
     "must differ from OMATICAYA_EXTENDER_PORT (both 9404)"),
    ({"OMATICAYA_EXTENDER_SCRAPE_PORT": "-1"}, "OMATICAYA_EXTENDER_SCRAPE_PORT"),
    ({"OMATICAYA_EXTENDER_SCRAPE_PORT": "65536"}, "OMATICAYA_EXTENDER_SCRAPE_PORT"),
    ({"OMATICAYA_EXTENDER_SCRAPE_ADDRESS": "localhost"}, "expected an IP address"),
])  # fmt: skip
def test_bad_scrape_settings_are_refused_naming_the_variable(monkeypatch, tmp_path, env, says):
    for key in [k for k in os.environ if k.startswith("OMATICAYA_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as err:
        load_extender_settings()
    assert says in str(err.value)


def test_the_scrape_port_is_off_by_default_and_binds_every_address():
    s = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]
    assert (s.address, s.port, s.scrape_port, s.scrape_address) == ("127.0.0.1", 8888, 0, "0.0.0.0")
