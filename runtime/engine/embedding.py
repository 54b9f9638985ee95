"""Embeddings from the served generative model, as llama.cpp's server gives them: each input's
final normed hidden states, mean-pooled over its tokens and L2-normalized.

An EmbedJob runs on the engine thread in turns, between generation steps, so a large batch
of inputs does not hold up the requests being generated. A turn borrows KV slots for the
inputs it embeds from the scheduler and hands them back before it ends.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch
import torch.nn.functional as F

from braid.runtime.executor.model_runner import ModelRunner
from braid.runtime.scheduler.scheduler import Scheduler


class EmbedJob:
    """One call's inputs, embedded over as many turns as they take; `done` gets the vectors."""

    def __init__(self, inputs: list[list[int]], max_batch_tokens: int) -> None:
        self.inputs = inputs
        self.max_batch_tokens = max_batch_tokens
        # Left pending until settled, so that a caller who leaves can cancel it.
        self.done: Future[list[list[float]]] = Future()
        self._next = 0  # the first input not yet embedded
        self._vectors: list[list[float]] = []

    def turn(self, runner: ModelRunner, scheduler: Scheduler) -> bool:
        """Embed the next inputs: as many whole ones as fit max_batch_tokens, at least one,
        fewer when the KV pool has no room for them all (none: it waits for a later turn).
        True once every input is embedded."""
        end, num_tokens = self._next + 1, len(self.inputs[self._next])
        while (
            end < len(self.inputs) and num_tokens + len(self.inputs[end]) <= self.max_batch_tokens
        ):
            num_tokens += len(self.inputs[end])
            end += 1
        slots = scheduler.lend(num_tokens)
        if slots is None:
            end, num_tokens = self._next + 1, len(self.inputs[self._next])
            slots = scheduler.lend(num_tokens)
            if slots is None:
                return False  # generation holds the pool: its requests finish and free it
        group = self.inputs[self._next : end]
        try:
            self._vectors += pooled(runner, group, slots, self.max_batch_tokens)
        finally:
            scheduler.take_back(slots)
        self._next = end
        return end == len(self.inputs)

    def settle(self, error: BaseException | None = None) -> None:
        """Hand the caller the vectors (or `error`), unless it cancelled meanwhile."""
        if self.done.set_running_or_notify_cancel():
            if error is None:
                self.done.set_result(self._vectors)
            else:
                self.done.set_exception(error)


def pooled(
    runner: ModelRunner, inputs: list[list[int]], slots: torch.Tensor, max_batch_tokens: int
) -> list[list[float]]:
    """The inputs' embeddings, their KV written to `slots` (sum of their lengths, in order).
    Forwards take at most max_batch_tokens tokens: an input longer than that is fed in chunks,
    each over the KV of the chunks before it, as a prefill is."""
    lengths = [len(ids) for ids in inputs]
    tables = slots.split(lengths)
    sums = torch.zeros(len(inputs), runner.model.config.hidden_size, device=runner.device)
    i = start = 0  # the input and the position in it the next forward starts at
    while i < len(inputs):
        pieces, budget = [], max_batch_tokens  # (input, start, end) fed by this forward
        while budget and i < len(inputs):
            n = min(lengths[i] - start, budget)
            pieces.append((i, start, start + n))
            budget -= n
            start += n
            if start == lengths[i]:
                i, start = i + 1, 0
        states = runner.hidden_states(
            [inputs[j][s:e] for j, s, e in pieces], [tables[j][:e] for j, s, e in pieces]
        )  # (T, hidden)
        owners = torch.tensor([j for j, s, e in pieces for _ in range(e - s)], device=sums.device)
        sums.index_add_(0, owners, states.float())
    means = sums / torch.tensor(lengths, dtype=sums.dtype, device=sums.device)[:, None]
    return F.normalize(means, dim=-1).tolist()
