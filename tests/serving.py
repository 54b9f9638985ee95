"""A real braid server on loopback for tests: uvicorn in a background thread, serving an
engine the test also holds (so it can read the engine's counters and KV directly)."""

from __future__ import annotations

import threading
import time

import uvicorn

from runtime.server import create_app


class LiveServer:
    def __init__(self, engine, **app_options) -> None:
        app = create_app(engine, model_name="tiny", **app_options)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="test-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
