"""Request: one sequence's state as it moves through the engine.

Each part has one writer. The scheduler writes the lifecycle: `status`, the KV slots
(`slots`, `draft_slots`, `cache_node`, `num_tree_slots`), `num_computed`, `finish_reason`,
the preemption count. Output processing appends the output (`append_output`) and its
logprobs, and feeds the detokenizer, the stop matcher and the trace. The constraint's
matcher is advanced only through `constraint` (runtime/constraint/state.py).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from braid.runtime.constraint.state import ConstraintState
from braid.runtime.kvcache.radix_cache import Node
from braid.runtime.output.detokenizer import IncrementalDetokenizer
from braid.runtime.output.request_trace import RequestTrace
from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from braid.runtime.lora.adapter import LoraAdapter
    from braid.runtime.spec.worker import SpecState
from braid.runtime.output.stop import StopMatcher


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A prompt plus its generated tokens, and where their KV lives.

    `slots[:num_computed]` hold the KV of `token_ids[:num_computed]`; the first
    `num_tree_slots` of them belong to the radix cache (locked through `cache_node`), the
    rest are the request's own. Prefill feeds `token_ids[num_computed:]` in chunks; a token
    is sampled when everything has been fed. After preemption the request starts over from
    `num_computed = 0` with its output so far as part of what it feeds.
    """

    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    emit: Callable[[StreamChunk], None]  # called on the engine thread with each chunk
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopMatcher
    stop_ids: frozenset[int]
    max_new_tokens: int
    priority: int = 0
    # The radix cache's namespace: cached prefixes are shared only among requests of one
    # (their cache_salt, None for requests without one; with an adapter, (its serial, salt)).
    cache_namespace: Hashable = None
    lora: LoraAdapter | None = None  # the LoRA adapter the request runs under, if any
    # (cache_namespace, program id) of the program state that sent it: its prefix is
    # leased to that state when it finishes (runtime/kvcache/leases.py); None for a plain request.
    lease_key: Hashable = None
    constraint: ConstraintState | None = None  # the request's grammar position, if any
    arrival: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)  # grown by append_output only
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # The slots live at the front of a buffer with room to grow: a decode step appends one
    # slot per request without allocating (see `slots`, `add_slots`).
    _slot_buffer: torch.Tensor = field(
        default_factory=lambda: torch.empty(0, dtype=torch.int64), repr=False
    )
    _num_slots: int = field(default=0, repr=False)
    num_computed: int = 0
    num_tree_slots: int = 0
    cache_node: Node | None = None
    num_cached_prompt_tokens: int = 0  # prompt tokens found in the radix cache at admission
    num_preemptions: int = 0
    first_token_time: float | None = None
    finish_reason: str | None = None
    spec: SpecState | None = None  # speculative decoding's memory of this request
    # The draft model's KV of spec.draft_ids, in its own pool (speculation with a draft model).
    draft_slots: torch.Tensor = field(
        default_factory=lambda: torch.empty(0, dtype=torch.int64), repr=False
    )
    trace: RequestTrace | None = None  # kept only when params.trace asks for it
    # prompt_ids + output_ids, kept as one list: the hot paths read it every step.
    token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.token_ids = self.prompt_ids + self.output_ids
        if self.params.trace and self.trace is None:
            self.trace = RequestTrace()

    def append_output(self, tokens: list[int]) -> None:
        self.output_ids.extend(tokens)
        self.token_ids.extend(tokens)

    @property
    def slots(self) -> torch.Tensor:
        """The KV slot of each of the request's positions so far (a view: copy to keep)."""
        return self._slot_buffer[: self._num_slots]

    @slots.setter
    def slots(self, value: torch.Tensor) -> None:
        """Replace the slots (copied in: the buffer never aliases another tensor)."""
        self._num_slots = 0
        self.add_slots(value)

    def keep_slots(self, n: int) -> None:
        """Keep the first n slots (the caller frees or hands on the rest)."""
        self._num_slots = n

    def add_slots(self, new: torch.Tensor) -> None:
        """Append slots, growing the buffer geometrically when it is full."""
        start, end = self._num_slots, self._num_slots + new.numel()
        if end > self._slot_buffer.numel():
            grown = torch.empty(max(end, 2 * self._slot_buffer.numel()), dtype=torch.int64)
            grown[:start] = self._slot_buffer[:start]
            self._slot_buffer = grown
        self._slot_buffer[start:end] = new
        self._num_slots = end

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Everything but the last sampled token is in the KV cache."""
        return bool(self.output_ids) and self.num_uncomputed == 1

    @property
    def max_cached_prefix(self) -> int:
        """How much of the sequence may come from the cache: at least one token must be
        computed to get logits, and prompt logprobs need logits from their start on."""
        limit = self.num_tokens - 1
        start = self.params.prompt_logprobs_from
        if start is not None and not self.output_ids:
            limit = min(limit, start - 1)
        return limit
