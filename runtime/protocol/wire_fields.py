"""Which SamplingParams fields travel as sampling fields over HTTP: the server reads them
from a request body by these names, and RemoteBackend writes them so."""

from __future__ import annotations

import msgspec

from braid.runtime.protocol.sampling_params import SamplingParams

# How many logprobs a request reports is each API's own field, not a sampling field.
REPORTING_FIELDS = frozenset({"logprobs", "top_logprobs", "prompt_logprobs_from"})
# The constraint the server makes of a chat request's tools (SamplingParams.tool_calls) is
# never sent.
SAMPLING_FIELDS = frozenset(f.name for f in msgspec.structs.fields(SamplingParams)) - (
    REPORTING_FIELDS | {"tool_calls"}
)


def wire_sampling(params: SamplingParams) -> dict:
    """The params' sampling fields as JSON-ready values (what /generate's sampling_params
    and /braid/prepare take)."""
    return {k: v for k, v in msgspec.to_builtins(params).items() if k in SAMPLING_FIELDS}
