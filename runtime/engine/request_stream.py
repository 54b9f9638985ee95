"""RequestStream: one request's chunks, handed from the engine thread to its consumer.

Every way into the engine makes one stream per request. Its consumer is an asyncio task
(`async for`, or `await output()`), a blocking caller (`result()`), or a callback given at
creation, called on the engine thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from braid.runtime.protocol.outputs import GenerateOutput, StreamChunk


class RequestStream:
    def __init__(
        self,
        rid: int,
        loop: asyncio.AbstractEventLoop | None = None,
        on_chunk: Callable[[StreamChunk], None] | None = None,
    ) -> None:
        """`loop`: the event loop of an asyncio consumer; `on_chunk`: a callback consumer;
        neither: a blocking one."""
        self.rid = rid
        self._loop = loop
        self._on_chunk = on_chunk
        self._queue: asyncio.Queue[StreamChunk] | None = asyncio.Queue() if loop else None
        self._chunks: list[StreamChunk] = []  # a blocking consumer's, until the last
        self._done = threading.Event()
        self.finished = False  # the consumer has read the last chunk

    def put(self, chunk: StreamChunk) -> None:
        """On the engine thread: hand over a chunk. Raises when the consumer is gone (its
        event loop closed, its callback raised): the engine then aborts the request."""
        if self._on_chunk is not None:
            self._on_chunk(chunk)
        elif self._loop is not None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, chunk)
        else:
            self._chunks.append(chunk)
            if chunk.finish_reason is not None:
                self._done.set()

    async def __aiter__(self) -> AsyncIterator[StreamChunk]:
        """The chunks as they come, the last one included (an asyncio consumer's)."""
        while not self.finished:
            chunk = await self._queue.get()
            self.finished = chunk.finish_reason is not None
            yield chunk

    async def output(self) -> GenerateOutput:
        """The whole output, once the request has ended (an asyncio consumer's)."""
        chunks = [chunk async for chunk in self]
        return _output(chunks)

    def result(self) -> GenerateOutput:
        """The whole output, blocking until the request has ended (a blocking consumer's)."""
        self._done.wait()
        self.finished = True
        return _output(self._chunks)


def _output(chunks: list[StreamChunk]) -> GenerateOutput:
    """The output the chunks make; raises the request's error (ValueError when the request
    itself was at fault, RuntimeError when the engine was)."""
    last = chunks[-1]
    if last.error:
        raise (ValueError if last.request_error else RuntimeError)(last.error)
    text = "".join(c.text for c in chunks)
    token_ids = [t for c in chunks for t in c.token_ids]
    return GenerateOutput(text, token_ids, last.finish_reason, last.meta or {})
