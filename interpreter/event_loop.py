"""The interpreter's event loop: one daemon thread that runs every program state's
operations, so a program's own thread only appends them and reads results."""

from __future__ import annotations

import asyncio
import threading

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def interpreter_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(
                target=_loop.run_forever, name="braid-interpreter", daemon=True
            ).start()
        return _loop
