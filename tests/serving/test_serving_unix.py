"""``serving.listen_unix``: the one way both kubelet plugins listen on their unix socket, with a
real gRPC server. A path gRPC cannot bind used to raise a bare ``RuntimeError`` from
``add_insecure_port``, which the device plugin's retry did not catch: its registration thread
died and the plugin never served (seen under pytest-xdist, whose temporary folders are longer)."""

from __future__ import annotations

import tempfile
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from omaticaya_py.serving import UNIX_PATH_MAX, listen_unix


def _server() -> grpc.Server:
    return grpc.server(futures.ThreadPoolExecutor(max_workers=1))


def test_a_socket_it_can_bind_is_listened_on():
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        path = Path(folder) / "plugin.sock"
        server = _server()
        listen_unix(server, path)
        server.start()
        try:
            assert path.is_socket()
        finally:
            server.stop(0)


@pytest.mark.parametrize("extra", [UNIX_PATH_MAX, 300], ids=["one byte over", "far over"])
def test_a_path_too_long_is_an_oserror_that_says_so(extra):
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        path = Path(folder) / ("s" * (extra - len(folder))) / "p.sock"
        assert len(str(path).encode()) > UNIX_PATH_MAX
        with pytest.raises(OSError, match=rf"cannot listen on {path}: \d+ bytes, a unix socket's path is at most 107"):
            listen_unix(_server(), path)


def test_a_folder_that_is_not_there_is_an_oserror_not_a_runtimeerror():
    server = _server()
    with pytest.raises(OSError, match="cannot listen on /nonexistent-omaticaya/x.sock"):
        listen_unix(server, "/nonexistent-omaticaya/x.sock")
