"""Handing the heap back when the server goes idle. The engine trims glibc's arenas when it
goes idle, but requests refused before they reach it (a 50 MB body, a 15 MB prompt, a
huge schema) never wake it: what their parsing and checking freed stayed resident for good
(docs/reliability.md)."""

from __future__ import annotations

import asyncio
import time

from braid.runtime.engine.heap import release_free_heap

# At most one trim a second: a trim walks the arenas, and a steady trickle of requests goes
# idle between each.
_MIN_INTERVAL_S = 1.0


class TrimWhenIdle:
    """ASGI middleware: once no HTTP request is in flight, trim the heap (in a thread: a trim
    of a large heap takes milliseconds, holding malloc's locks, not the event loop)."""

    def __init__(self, app) -> None:
        self.app = app
        self.in_flight = 0
        self.last_trim = 0.0
        self.trimming: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and time.monotonic() - self.last_trim >= _MIN_INTERVAL_S:
                self.last_trim = time.monotonic()
                self.trimming = asyncio.get_running_loop().create_task(
                    asyncio.to_thread(release_free_heap)
                )
