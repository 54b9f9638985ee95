"""What the HTTP backends share: an httpx client per event loop, server-sent events, and
turning error replies into the exceptions a local engine would raise."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator

import httpx


class HttpClient:
    def __init__(self, base_url: str, api_key: str | None, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout, connect=10.0)
        # An AsyncClient's connection pool belongs to the loop that made it.
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self.headers,
                timeout=self.timeout,
                limits=httpx.Limits(max_connections=1024, max_keepalive_connections=64),
            )
        return client

    def get_sync(self, path: str) -> dict:
        response = httpx.get(self.base_url + path, headers=self.headers, timeout=self.timeout)
        raise_for_error(response)
        return response.json()

    def post_sync(self, path: str, body: dict) -> None:
        """A POST whose reply only says it was done (/flush_cache)."""
        response = httpx.post(
            self.base_url + path, json=body, headers=self.headers, timeout=self.timeout
        )
        raise_for_error(response)

    async def post(self, path: str, body: dict) -> dict:
        response = await self.client().post(path, json=body)
        raise_for_error(response)
        return response.json()

    async def events(self, path: str, body: dict) -> AsyncIterator[dict]:
        """The JSON objects of a server-sent event stream, up to `[DONE]`; leaving early
        closes the connection, which makes the server abort the request."""
        async with self.client().stream("POST", path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise_for_error(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                obj = json.loads(data)
                if "error" in obj:
                    raise RuntimeError(f"{self.base_url}{path}: {_message(obj)}")
                yield obj


def raise_for_error(response: httpx.Response) -> None:
    """A 400 is the caller's mistake (a ValueError, as a local engine raises); anything
    else is a RuntimeError."""
    if response.status_code == 200:
        return
    try:
        message = _message(response.json())
    except ValueError:
        message = response.text
    where = f"{response.request.method} {response.request.url}"
    if response.status_code == 400:
        raise ValueError(message)
    raise RuntimeError(f"{where} answered {response.status_code}: {message}")


def _message(obj) -> str:
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return str(obj["error"].get("message"))
    if isinstance(obj, dict) and "message" in obj:
        return str(obj["message"])
    return str(obj)
