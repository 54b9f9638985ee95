"""What the client scripts share (each runs in the clients' own venv, never braid's): the
request bodies a library sent, kept by an httpx event hook on the client it is given, and
the one JSON line a script prints for the test to read."""

from __future__ import annotations

import json

import httpx


class Sent:
    """The JSON bodies POSTed through the clients it makes, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def _keep(self, request: httpx.Request) -> None:
        if request.method == "POST":
            self.bodies.append({"path": request.url.path, "body": json.loads(request.content)})

    async def _akeep(self, request: httpx.Request) -> None:
        self._keep(request)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"request": [self._keep]}, timeout=120)

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"request": [self._akeep]}, timeout=120)

    def take(self) -> list[dict]:
        bodies, self.bodies = self.bodies, []
        return bodies


def emit(result: dict) -> None:
    print(json.dumps(result, default=str))
