"""At start, seed the Xid ledger from the Node's own telemetry (``core.rules.xid_seed``): a GPU that
was Unhealthy for a fatal Xid stays so across a restart until its quiet window ends.

The Node is read once, on a thread of its own, when the first reading comes; the first tick
waits for it at most ``wait_s`` (an API server that does not answer must not hold the reading
back: the seed is applied at a later tick then). A failure to read the Node seeds nothing and is
said once; refused entries are said in one line and counted (``XidLedger.seed_refused``).
"""

from __future__ import annotations

import threading
from typing import Any

from loguru import logger

from ..core.model.snapshot import NodeSnapshot
from ..core.publish.patch import NodeMeta
from ..core.rules.health import XidLedger
from ..core.rules.xid_seed import seed_events
from ..core.schema import TELEMETRY
from ..kube import KubeError, NodeClient

__all__ = ["XidSeeder"]


class XidSeeder:
    """Seeds an ``XidLedger`` once from ``<prefix>/telemetry`` on the agent's Node.

    Call ``seed(ledger, snapshot)`` before each tick's assessment until it returns ``None``
    (done: seeded, nothing to seed, or the Node could not be read); it returns itself while
    the Node's answer or a reading with GPUs is still to come. The Node it read is handed to
    the agent's writer when that has none yet, so that the first write needs no GET of its
    own."""

    def __init__(self, node: NodeClient, prefix: str, wait_s: float = 2.0) -> None:
        self._node = node
        self._key = f"{prefix}/{TELEMETRY}"
        self.wait_s = wait_s
        self._fetched = threading.Event()
        self._thread: threading.Thread | None = None
        self._meta: NodeMeta | None = None
        self._failed = False

    def _fetch(self) -> None:
        try:
            self._meta = self._node.get_node()
        except KubeError as exc:
            self._failed = True
            logger.warning("could not read the Node's telemetry to carry Xid health over ({}): "
                           "starting with none", exc)
        except Exception:  # noqa: BLE001 - a bug here must not stop the agent's start
            self._failed = True
            logger.exception("reading the Node's telemetry for Xid health failed")
        finally:
            self._fetched.set()

    def seed(
        self, ledger: XidLedger, snapshot: NodeSnapshot, writer: Any = None
    ) -> XidSeeder | None:
        """Seed ``ledger`` for the GPUs of ``snapshot`` once the Node is read; ``None`` when
        done, ``self`` to be called again with a later reading. ``writer``: the agent's
        ``NodeWriter``, given the Node read when its ``meta`` is still ``None``."""
        first = self._thread is None
        if first:
            self._thread = threading.Thread(target=self._fetch, name="xid-seed", daemon=True)
            self._thread.start()
        if not self._fetched.wait(self.wait_s if first else 0):
            return self
        if self._failed or self._meta is None:
            return None
        if writer is not None and getattr(writer, "meta", False) is None:
            writer.meta = self._meta
        if snapshot.error is not None or not snapshot.gpus:
            return self  # no GPU to match the entries to yet
        found = seed_events(self._meta.annotations.get(self._key), snapshot)
        ledger.seed(found.events, len(found.refused))
        if found.refused:
            logger.warning(
                "Xid health in the Node's telemetry refused, nothing carried over for: {}",
                "; ".join(found.refused[:5]) + (f" and {len(found.refused) - 5} more"
                                                 if len(found.refused) > 5 else ""),
            )
        if ledger.seeded:
            logger.info(
                "carried over {} Xid events from the Node's telemetry: {}", ledger.seeded,
                ", ".join(f"GPU {e.index} xid-{e.xid}" for e in found.events
                          if ledger.policy.fatal(e.xid)),
            )
        return None
