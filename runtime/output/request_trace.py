"""RequestTrace: what the engine records of one request whose params ask for a trace
(`SamplingParams.trace`), for the trace view: per output token whether the grammar forced it
and how many tokens its mask allowed, and when the request reached each stage. Requests
without a trace carry None and pay nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class RequestTrace:
    forced: list[bool] = field(default_factory=list)  # per output token: forced, not sampled
    # Per output token: how many tokens the grammar's mask allowed where it was sampled
    # (None: unconstrained, or forced).
    allowed: list[int | None] = field(default_factory=list)
    next_allowed: int | None = None  # the mask count of the token being sampled now
    started: float | None = None  # when the first step that ran the request began
    finished: float | None = None

    def add_tokens(self, num_tokens: int, num_sampled: int) -> None:
        """num_tokens appended to the output, the first num_sampled of them sampled (0 or 1)
        and the rest forced by the grammar."""
        num_sampled = min(num_sampled, num_tokens)
        self.forced += [False] * num_sampled + [True] * (num_tokens - num_sampled)
        self.allowed += [self.next_allowed] * num_sampled + [None] * (num_tokens - num_sampled)
        self.next_allowed = None

    def to_meta(self, arrival: float, first_token: float | None) -> dict:
        """The record as the request's last chunk reports it (monotonic-clock seconds)."""
        return {
            "forced": self.forced,
            "allowed": self.allowed,
            "arrival": arrival,
            "started": self.started,
            "first_token": first_token,
            "finished": self.finished,
        }


def count_allowed(row: torch.Tensor) -> int:
    """How many tokens a bitmask row (int32 words, bit t % 32 of word t // 32) allows."""
    return int(np.unpackbits(row.numpy().view(np.uint8)).sum())
