"""Batch: what one engine step feeds, as the scheduler chose it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request
    from braid.runtime.spec.tree import DraftTree


@dataclass
class Batch:
    requests: list[Request] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens each feeds, drafts included
    # Whether each request was prefilling when scheduled (else it decodes one token).
    is_prefill: list[bool] = field(default_factory=list)
    # A draft tree to verify after request i's last token (speculative decoding), or None.
    drafts: list[DraftTree | None] = field(default_factory=list)
    # Requests that cannot go on even with the whole pool to themselves: they end ("length").
    out_of_kv: list[Request] = field(default_factory=list)

    def add(self, r: Request, num_new: int, is_prefill: bool) -> None:
        self.requests.append(r)
        self.num_new.append(num_new)
        self.is_prefill.append(is_prefill)

    def draft(self, i: int) -> DraftTree | None:
        return self.drafts[i] if i < len(self.drafts) else None

    def subset(self, indices: list[int]) -> Batch:
        """The batch of these requests only, each feeding what it feeds here."""
        return Batch(
            [self.requests[i] for i in indices],
            [self.num_new[i] for i in indices],
            [self.is_prefill[i] for i in indices],
            [self.draft(i) for i in indices] if self.drafts else [],
        )

    def num_known(self, i: int) -> int:
        """Tokens of request i's own sequence fed this step (the rest are draft tokens)."""
        draft = self.draft(i)
        return self.num_new[i] - (len(draft) if draft is not None else 0)

    def completes_feed(self, i: int) -> bool:
        """Does request i's feed reach its last token (so the step ends with its logits)?
        Asked before the step's output is appended."""
        r = self.requests[i]
        return r.num_computed + self.num_known(i) == r.num_tokens

    def samples(self, i: int) -> bool:
        """Does request i get a new token from this step (its feed completes)?"""
        return self.completes_feed(i) and self.requests[i].max_new_tokens > 0
