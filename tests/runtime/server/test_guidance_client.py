"""A guidance program through guidance's OpenAI backend against a braid server: guidance
rebuilds the streamed text from each chunk's logprobs, so a server that sent them all in the
last chunk made it repeat the text."""

from __future__ import annotations

import json

import httpx
import pytest

guidance = pytest.importorskip("guidance")


class Recording(httpx.HTTPTransport):
    """A transport keeping the bytes of every response body it streams."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytearray] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = bytearray()
        self.bodies.append(body)
        inner = response.stream

        class Tee(httpx.SyncByteStream):
            def __iter__(self):
                for piece in inner:
                    body.extend(piece)
                    yield piece

            def close(self) -> None:
                inner.close()

        response.stream = Tee()
        return response


def test_a_guidance_program_reads_the_servers_text(server):
    from guidance import assistant, gen, user
    from guidance.models import OpenAI

    transport = Recording()
    http = httpx.Client(transport=transport)
    lm = OpenAI("tiny", base_url=server.url + "/v1", api_key="unused", echo=False, http_client=http)
    with user():
        lm += "What is the capital of France?"
    with assistant():
        lm += gen("answer", max_tokens=12)
    [body] = transport.bodies
    events = [
        json.loads(line.removeprefix("data: "))
        for line in body.decode().splitlines()
        if line.startswith("data: {")
    ]
    chunks = [e["choices"][0] for e in events if e["choices"]]
    assert sum(1 for c in chunks if (c["logprobs"] or {}).get("content")) > 1  # asked for
    assert lm["answer"] == "".join(c["delta"].get("content") or "" for c in chunks)
