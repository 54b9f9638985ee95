"""The stored responses of /v1/responses: what `previous_response_id` continues and
`GET /v1/responses/{id}` returns, held in memory within a count and a byte budget, each
under its tenant (the API key's, with --cache-scope key): another tenant's id is not found.

Each response is held encoded, never as Python objects: a dict or a ChatMessage takes several
times the bytes of its JSON, so only bytes objects make the budget count what the store
holds. The body is kept as the JSON a GET
writes, so a GET encodes nothing on the event loop."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from braid.runtime.server.wire import ChatMessage

# A response holds its whole conversation (a long agent run's history is resent by
# reference, not copied), so the budget counts each one's full size: an upper bound.
DEFAULT_MAX_RESPONSES = 4096
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
# What an entry holds beside its encoded body and history and its key's characters: the
# key tuple and strings, the entry object, two bytes headers, the ordered dict's node and
# slots (a bound above what test_responses_store_limits.py measures).
ENTRY_BYTES = 512

# The conversation as msgpack: smaller than JSON (a null field is one byte) and decoded
# straight back into ChatMessages when a request continues it.
_encode_history = msgspec.msgpack.Encoder().encode
_decode_history = msgspec.msgpack.Decoder(list[ChatMessage]).decode


def _exact(encoded: bytes) -> bytes:
    """A copy that holds only its length: msgspec's output keeps the buffer it grew (up to
    twice its length, shrunk in place), which len() and the budget would not see."""
    return bytes(memoryview(encoded))


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: bytes  # the response object as it was returned, as JSON
    history: bytes  # its conversation: input and output, without instructions (msgpack)
    num_bytes: int  # what holding it takes, at most

    def messages(self) -> list[ChatMessage]:
        """The conversation, for a request that continues it."""
        return _decode_history(self.history)


class ResponseStore:
    """Responses by (tenant, id), the least recently used evicted first once there are more than
    `max_responses` or their sizes (the bytes each entry holds) add up to more than
    `max_bytes`. A response larger than the whole budget is not kept. Used on the event loop
    only: no locking."""

    def __init__(
        self, max_responses: int = DEFAULT_MAX_RESPONSES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_responses < 1 or max_bytes < 1:
            raise ValueError("ResponseStore's max_responses and max_bytes must be >= 1")
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[tuple[str | None, str], StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tenant: str | None, body: dict[str, Any], history: list[ChatMessage]) -> bool:
        """Keep the response (under the tenant and body["id"]), encoded; False if it alone is
        over the budget."""
        response_id = body["id"]
        encoded = _exact(msgspec.json.encode(body))
        conversation = _exact(_encode_history(history))
        size = len(encoded) + len(conversation) + ENTRY_BYTES + len(response_id) + len(tenant or "")
        if size > self.max_bytes:
            return False
        self.delete(tenant, response_id)
        self._entries[(tenant, response_id)] = StoredResponse(encoded, conversation, size)
        self.num_bytes += size
        while len(self._entries) > self.max_responses or self.num_bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= evicted.num_bytes
        return True

    def get(self, tenant: str | None, response_id: str) -> StoredResponse | None:
        entry = self._entries.get((tenant, response_id))
        if entry is not None:
            self._entries.move_to_end((tenant, response_id))
        return entry

    def delete(self, tenant: str | None, response_id: str) -> bool:
        entry = self._entries.pop((tenant, response_id), None)
        if entry is None:
            return False
        self.num_bytes -= entry.num_bytes
        return True
