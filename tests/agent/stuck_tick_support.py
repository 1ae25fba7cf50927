"""What other test files share of test_stuck_tick.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from loguru import logger

from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE


class BlockingReader:
    """A trace reader whose ``read()`` waits on ``gate`` while ``blocked`` is set."""

    def __init__(self) -> None:
        self.inner = TraceReader(H100_TRACE)
        self.blocked = threading.Event()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def read(self) -> Any:
        if self.blocked.is_set():
            self.entered.set()
            self.gate.wait()
        return self.inner.read()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def log_lines():
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip()), level="INFO", format="{message}")
    yield lines
    logger.remove(sink)
