"""HeadProposer: what the speculative worker asks of a trained draft head (Medusa, EAGLE-3):
drafts, and to see each step's hidden states along what the target kept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid.runtime.spec.tree import DraftTree

if TYPE_CHECKING:
    from braid.runtime.executor.model_runner import StepResult
    from braid.runtime.kvcache.pool import KVPool
    from braid.runtime.scheduler.request import Request
    from braid.runtime.scheduler.scheduler import Scheduler


class HeadProposer:
    """Drafts from the target's own hidden states (ModelRunner.capture says which the
    forward copies out). Drafted tokens are point masses (probs None): verification then
    draws each node's token as decoding would, so greedy and seeded outputs are exactly
    those without speculation (verify.py)."""

    kv: KVPool | None = None  # a pool of the head's own (Request.draft_slots), if it has one
    seconds_per_step: float = 0.0  # EMA of one more draft token's cost, for the cost model

    def propose(
        self, reqs: list[Request], lengths: list[int], scheduler: Scheduler
    ) -> list[DraftTree | None]:
        """A draft tree (or None) per request, at most lengths[i] tokens deep, its paths
        walked through the request's constraint (reset by the caller)."""
        raise NotImplementedError

    def observe(
        self,
        r: Request,
        result: StepResult,
        start: int,
        known: int,
        tree: DraftTree | None,
        kept: list[int],
    ) -> None:
        """r's step fed `known` of its tokens from position `start`, then `tree` (whose
        nodes `kept` the target followed, in order): `result` holds the hidden states the
        forward copied out for r's rows."""
        raise NotImplementedError
