"""Running the server to a bounded stop: SIGTERM drains the requests in flight within the
shutdown deadline (uvicorn's graceful-shutdown timeout, set by ConnectionLimits), and a second
SIGTERM, like a second Ctrl+C, stops at once. uvicorn itself forces a stop only on a second
SIGINT, so a server draining long requests outlived a second SIGTERM (SIGKILL was needed)."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

import uvicorn

# uvicorn.run's exit status when the server never started (a port taken...).
_STARTUP_FAILURE = 3


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig in (signal.SIGTERM, signal.SIGINT):
            self.force_exit = True
        super().handle_exit(sig, frame)


def run(app: Any, **options: Any) -> None:
    """uvicorn.run(app, **options) for one process (no reload, no workers), stopped as above."""
    server = _Server(uvicorn.Config(app, **options))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(_STARTUP_FAILURE)
