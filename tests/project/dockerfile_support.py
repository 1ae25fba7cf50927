"""What other test files share of test_dockerfile.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]


def read_lock(path: Path) -> dict[str, Pin]:
    """{normalised name: Pin} of a ``uv pip compile --generate-hashes`` output."""
    from packaging.utils import canonicalize_name

    pins: dict[str, Pin] = {}
    name = ""
    for block in re.split(r"\n(?=\S)", path.read_text()):
        if block.startswith("#"):
            continue
        head, *rest = block.split("\n")
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", head)
        assert m, f"{path.name}: not a pin: {head!r}"
        name = canonicalize_name(m.group(1))
        text = "\n".join(rest)
        hashes = tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", text))
        via = [
            v for v in re.findall(r"#[ \t]+(?:via[ \t]+)?([^\s#].*)$", text, re.MULTILINE)
            if v != "via"
        ]  # fmt: skip
        pins[name] = Pin(m.group(2), hashes, tuple(v.strip() for v in via))
    return pins
