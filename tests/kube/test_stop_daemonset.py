"""``omaticaya stop-daemonset`` (kube/workloads.py): the chart's pre-delete hook.

The pure parts (label selector text, owned pods, the one-line report) as tables; the request
sequence through a real ``ApiSession`` against a small fake API server on 127.0.0.1 (GET the
DaemonSet, DELETE it with propagationPolicy Foreground and its uid as precondition, LIST its
pods until none it owns is left); the CLI's exit statuses and lines. The real thing, on a real
kube-apiserver + kubelet, is tests/charts/test_helm_install.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from omaticaya_py.cli import main
from omaticaya_py.kube import KubeError
from omaticaya_py.kube.workloads import (
    DaemonSetStop,
    StopWait,
    label_selector,
    owned_pods,
    stop_daemonset,
)
from tests.helpers import Clock
from tests.kube.fake_api_support import serve_fake_api, session, status

NS, NAME, UID = "omaticaya", "omaticaya", "ds-uid-1"
SELECTOR = {
    "matchLabels": {"app.kubernetes.io/name": "omaticaya", "app.kubernetes.io/instance": "o"}
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({}, ""),
        ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
        ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["x", "y"]}]}, "t in (x,y)"),
        ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["x"]}]}, "t notin (x)"),
        ({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, "t"),
        ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, "!t"),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "t", "operator": "Exists"}]},
            "a=1,t",
        ),
    ],
)
def test_label_selector_text(selector, expected):
    assert label_selector(selector) == expected


def test_label_selector_refuses_an_unknown_operator():
    with pytest.raises(ValueError, match="Gt"):
        label_selector({"matchExpressions": [{"key": "t", "operator": "Gt", "values": ["1"]}]})


def pod(name: str, owner: str | None = UID, node: str | None = "gpu-1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": NAME, "uid": owner}]
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def test_owned_pods_follow_the_owner_uid_not_the_labels():
    pods = [pod("a"), pod("b", owner="other"), pod("c", owner=None), pod("d")]
    assert [p["metadata"]["name"] for p in owned_pods(pods, UID)] == ["a", "d"]
    assert owned_pods([], UID) == []


@pytest.mark.parametrize(
    ("result", "line"),
    [
        (DaemonSetStop(NS, NAME, found=False, stopped=True), "not found: nothing to stop"),
        (
            DaemonSetStop(NS, NAME, found=True, stopped=True, waited_s=12.4, pods_seen=3),
            "deleted; its 3 pod(s) stopped within 12 s",
        ),
        (
            DaemonSetStop(
                NS, NAME, found=True, stopped=False, waited_s=120, pods_seen=2,
                left=["a on gpu-1"],
            ),
            "after 120 s 1 pod(s) still run: a on gpu-1; their dynamic labels may stay",
        ),
    ],
)
def test_report_is_one_line(result, line):
    text = result.line()
    assert "\n" not in text and line in text and f"DaemonSet {NS}/{NAME}" in text


# --------------------------------------------------------------- a fake API server ----


class FakeApi:
    """One DaemonSet and its pods; pods go after ``lists_until_gone`` LISTs following the
    DELETE (None: never). Records every request as (method, path, query, body)."""

    def __init__(self) -> None:
        self.exists = True
        self.status_get = 200
        self.status_delete = 200
        self.lists_until_gone: int | None = 2
        self.deleted = False
        self.pods = [pod("omaticaya-a"), pod("not-ours", owner="other-uid")]
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []

    def handle(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        self.requests.append((method, parts.path, query, body))
        ds_path = f"/apis/apps/v1/namespaces/{NS}/daemonsets/{NAME}"
        if parts.path == ds_path and method == "GET":
            if not self.exists:
                return 404, status(404, "NotFound")
            if self.status_get != 200:
                return self.status_get, status(self.status_get, "Forbidden")
            meta: dict[str, Any] = {"name": NAME, "namespace": NS, "uid": UID}
            if self.deleted:
                meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            return 200, {"kind": "DaemonSet", "metadata": meta, "spec": {"selector": SELECTOR}}
        if parts.path == ds_path and method == "DELETE":
            if self.status_delete != 200:
                return self.status_delete, status(self.status_delete, "Conflict")
            self.deleted = True
            return 200, {"kind": "DaemonSet", "metadata": {"name": NAME, "uid": UID}}
        if parts.path == f"/api/v1/namespaces/{NS}/pods" and method == "GET":
            if self.deleted and self.lists_until_gone is not None:
                if self.lists_until_gone <= 0:
                    self.pods = [p for p in self.pods if p["metadata"]["name"] == "not-ours"]
                self.lists_until_gone -= 1
            return 200, {"kind": "PodList", "items": self.pods}
        return 404, status(404, "NotFound")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApi, Path]]:
    fake = FakeApi()
    with serve_fake_api(fake.handle, tmp_path, token="hook-token") as kubeconfig:
        yield fake, kubeconfig


def test_deletes_in_the_foreground_then_waits_for_its_own_pods(api):
    fake, kubeconfig = api
    clock = Clock(100.0)  # moves only when slept on
    result = stop_daemonset(
        session(kubeconfig), NS, NAME, StopWait(timeout_s=30, clock=clock, sleep=clock.sleep)
    )
    assert result == DaemonSetStop(NS, NAME, found=True, stopped=True, waited_s=2.0, pods_seen=1)
    methods = [(m, p.rsplit("/", 1)[1]) for m, p, _, _ in fake.requests]
    assert methods == [("GET", NAME), ("DELETE", NAME)] + [("GET", "pods")] * 3
    _, _, _, body = fake.requests[1]
    assert body == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Foreground",
        "preconditions": {"uid": UID},
    }
    # the pods are listed by the DaemonSet's selector, and kept only when it owns them
    (selector,) = fake.requests[2][2]["labelSelector"]
    assert selector == "app.kubernetes.io/instance=o,app.kubernetes.io/name=omaticaya"
    assert clock.sleeps == [1.0, 1.0]


def test_a_daemonset_not_there_is_nothing_to_stop(api):
    fake, kubeconfig = api
    fake.exists = False
    result = stop_daemonset(session(kubeconfig), NS, NAME, StopWait(timeout_s=30))
    assert (result.found, result.stopped) == (False, True)
    assert [m for m, *_ in fake.requests] == ["GET"]


def test_a_daemonset_already_being_deleted_is_waited_for_not_deleted_again(api):
    fake, kubeconfig = api
    fake.deleted = True  # a first hook attempt deleted it
    clock = Clock(100.0)  # moves only when slept on
    result = stop_daemonset(
        session(kubeconfig), NS, NAME, StopWait(timeout_s=30, clock=clock, sleep=clock.sleep)
    )
    assert result.stopped and "DELETE" not in [m for m, *_ in fake.requests]


@pytest.mark.parametrize("code", [404, 409])
def test_a_daemonset_gone_or_replaced_between_get_and_delete_is_waited_for(api, code):
    fake, kubeconfig = api
    fake.status_delete = code
    fake.lists_until_gone = None
    fake.pods = []
    result = stop_daemonset(session(kubeconfig), NS, NAME, StopWait(timeout_s=30))
    assert result.stopped and result.pods_seen == 0


def test_pods_left_at_the_timeout_are_named(api):
    fake, kubeconfig = api
    fake.lists_until_gone = None  # a NotReady node: its pod never goes
    clock = Clock(100.0)  # moves only when slept on
    result = stop_daemonset(
        session(kubeconfig),
        NS,
        NAME,
        StopWait(timeout_s=2.5, poll_s=1.0, clock=clock, sleep=clock.sleep),
    )
    assert not result.stopped and result.left == ["omaticaya-a on gpu-1"]
    assert result.waited_s == 2.5 and clock.sleeps == [1.0, 1.0, 0.5]


def test_forbidden_raises(api):
    fake, kubeconfig = api
    fake.status_get = 403
    with pytest.raises(KubeError) as err:
        stop_daemonset(session(kubeconfig), NS, NAME, StopWait(timeout_s=30))
    assert err.value.status == 403


# --------------------------------------------------------------------------- the CLI ----


def cli(kubeconfig: Path, *extra: str) -> int:
    return main(
        ["stop-daemonset", "--namespace", NS, "--name", NAME, "--kubeconfig", str(kubeconfig),
         *extra]
    )


def test_cli_done(api, capsys):
    fake, kubeconfig = api
    fake.lists_until_gone = 1
    assert cli(kubeconfig, "--timeout-s", "30") == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"DaemonSet {NS}/{NAME} deleted; its 1 pod(s) stopped") and not err


def test_cli_timeout_is_status_1_with_one_line(api, capsys):
    fake, kubeconfig = api
    fake.lists_until_gone = None
    assert cli(kubeconfig, "--timeout-s", "0.2") == 1
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1
    assert err.startswith("omaticaya: DaemonSet") and "omaticaya-a on gpu-1" in err


def test_cli_api_failure_is_status_1_with_one_line(api, capsys):
    fake, kubeconfig = api
    fake.status_get = 403
    assert cli(kubeconfig) == 1
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "403" in err


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf"])
def test_cli_refuses_a_bad_timeout(api, capsys, bad):
    _, kubeconfig = api
    assert cli(kubeconfig, f"--timeout-s={bad}") == 2
    assert "--timeout-s" in capsys.readouterr().err


def test_cli_needs_namespace_and_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["stop-daemonset", "--name", NAME])
    assert exit_.value.code == 2
