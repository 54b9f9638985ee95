"""Server-sent events: the streaming half of both APIs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import msgspec
from starlette.responses import StreamingResponse

from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.service import Service, Streamer, merged
from braid.runtime.server.wire import BadRequest, error_body

DONE = b"data: [DONE]\n\n"


def event(obj: object) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def event_stream(
    svc: Service,
    jobs: list[tuple[list[int], SamplingParams]],
    stream: Streamer,
    render: Callable[[int, StreamChunk], Iterable[object]],
    last: Callable[[list[dict]], object] | None = None,
    listings: bool = False,
) -> StreamingResponse:
    """Stream the jobs' chunks (read from `stream`: Service.streamer), each rendered into
    events by `render(job index, chunk)` (off the event loop when they list logprobs,
    `listings`: an echoed prompt's whole listing is one event); `last(final metas)` makes a
    closing event.
    Admission is checked now and held while the stream runs; a client that disconnects
    cancels it, which aborts the engine requests. Once the response has started an error
    can only be reported in the stream."""
    svc.check_room(len(jobs))

    def events(i: int, chunk: StreamChunk) -> list[bytes]:
        return [event(obj) for obj in render(i, chunk)]

    async def body():
        with svc.admit(len(jobs), checked=True):  # the headers are out: no 503 now
            metas: list[dict] = [{} for _ in jobs]
            try:
                streams = [stream(ids, p) for ids, p in jobs]
                async for i, chunk in merged(streams):
                    if chunk.meta is not None:
                        metas[i] = chunk.meta
                    for e in await svc.build_reply(partial(events, i, chunk), listings):
                        yield e
                if last is not None:
                    yield event(last(metas))
            except BadRequest as e:  # the request's own parameters failed it midway
                yield event(error_body(400, "invalid_request_error", str(e)))
            except Exception as e:
                yield event(error_body(500, "server_error", str(e)))
            yield DONE

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
