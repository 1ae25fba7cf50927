"""Files other processes read while they are written: replaced whole, never seen half-written.

``write_atomic`` is the one way the product writes such a file: the MPS supervisor's daemon
states (read by the device plugin and the DRA plugin every few seconds), the DRA plugin's CDI
specs (read by containerd) and its checkpoint of prepared claims.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` whole: write ``.<name>.tmp`` in the same folder with
    ``mode`` (whatever the umask), fsync it (``fsync``: a crash keeps the old file or the new
    one; off for a state rewritten every few seconds), rename it over ``path``. Raises
    ``OSError``; the temporary file is removed then."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            os.write(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
