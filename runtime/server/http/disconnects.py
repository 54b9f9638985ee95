"""Work a client is waiting for, cancelled when it disconnects: for the server's routes and the
`--dp` front alike (this module imports nothing of the engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected; its work was cancelled (its engine requests aborted)."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (ClientGone then)."""
    return await unless(work, _disconnected(request), ClientGone)


async def unless(work: Awaitable[T], stop: Awaitable[None], error: type[Exception]) -> T:
    """Await `work`, cancelling it (and raising `error`) if `stop` returns first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(stop)
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise error()
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected (its request's body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
