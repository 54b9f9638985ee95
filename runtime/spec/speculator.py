"""Speculator: the engine's side of speculative decoding.

Each step the scheduler asks it to attach draft trees to the batch's decoding requests, and
output processing hands it each tree's logits to verify. Here live the per-request state,
the choice of draft length, the grammar pruning of drafts, verification, and the stats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from braid.grammars.matcher import MatcherError
from braid.runtime.config import EngineConfig
from braid.runtime.kv_cache import KVPool
from braid.runtime.spec.adaptive import MAX_ADAPTIVE_LENGTH, Acceptance, StepCost
from braid.runtime.spec.draft_model import DraftModelProposer
from braid.runtime.spec.ngram import NgramIndex
from braid.runtime.spec.tree import DraftTree
from braid.runtime.stats import EngineStats

if TYPE_CHECKING:
    from braid.runtime.request import Request
    from braid.runtime.scheduler import Batch

# A forced-token callable: the tokens that replace a just-accepted token plus whatever text
# the grammar forces after it (GrammarService.forced_tokens).
Forced = Callable[["Request", int], list[int]]


@dataclass(eq=False)
class SpecState:
    """What speculation remembers about one request."""

    acceptance: Acceptance = field(default_factory=Acceptance)
    ngram: NgramIndex = field(default_factory=NgramIndex)
    draft_ids: list[int] = field(default_factory=list)  # tokens whose draft-model KV exists
    draft_slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))


class DraftMatcher:
    """A request's grammar matcher walked along one draft path, then put back (`reset`).

    A draft token the grammar refuses ends the path; text the grammar forces after a token
    joins the path as free draft tokens (verification follows them like any other)."""

    def __init__(self, r: Request, forced: Forced) -> None:
        self.r, self.forced, self.accepted = r, forced, 0

    def push(self, token: int) -> list[int] | None:
        """The tokens the path takes for draft `token`: [token] plus any forced ones; None
        when the grammar refuses it."""
        m = self.r.matcher
        if m is None or token in self.r.stop_ids:
            return [token]
        if self.r.grammar_error is not None:
            return None
        try:
            if m.is_terminated() or not m.accept_token(token):
                return None
            tokens = self.forced(self.r, token)  # the matcher has accepted exactly these
        except MatcherError as e:  # the engine fails r when it samples
            self.r.grammar_error = str(e)
            return None
        if tokens[0] != token:  # token merged with forced text into other tokens: drop it
            m.rollback(len(tokens))
            return None
        self.accepted += len(tokens)
        return tokens

    def reset(self) -> None:
        if self.accepted:
            self.r.matcher.rollback(self.accepted)
            self.accepted = 0


class Speculator:
    """What the core calls: `attach` (the scheduler, for a step's batch), `verify` (output
    processing, with the step's logits of each tree), `observe_step` and `release`."""

    def __init__(
        self,
        config: EngineConfig,
        kv: KVPool,
        stats: EngineStats,
        forced: Forced,
        draft: DraftModelProposer | None = None,
    ) -> None:
        self.kv = kv
        self.method = config.spec_method
        self.fixed_length = config.spec_draft_length
        self.width = config.spec_tree_width
        self.stats = stats
        self.forced = forced
        self.draft = draft
        self.cost = StepCost()

    def attach(self, batch: Batch, budget: int, make_room: Callable[[int], bool]) -> None:
        """Draft trees, within `budget` tokens, for the batch's requests that sample after
        output tokens (decodes, and requests feeding text a grammar forced: that text is
        verified with the draft for free), with KV slots for their nodes; a draft whose slots
        `make_room` cannot free without preempting is dropped."""
        if budget <= 0:
            return
        eligible = [i for i, r in enumerate(batch.requests) if r.output_ids and batch.samples(i)]
        if not eligible:
            return
        batch.drafts = [None] * len(batch.requests)
        trees = self.propose([batch.requests[i] for i in eligible], budget)
        for i, tree in zip(eligible, trees, strict=True):
            if tree is None or len(tree) > budget or not make_room(len(tree)):
                continue
            r = batch.requests[i]
            r.slots = torch.cat([r.slots, self.kv.allocate(len(tree))])
            batch.drafts[i] = tree
            batch.num_new[i] += len(tree)
            budget -= len(tree)

    def verify(
        self,
        r: Request,
        tree: DraftTree,
        logits: torch.Tensor,
        sample_node: Callable,
        add_sampled: Callable,
    ) -> None:
        """Decode along the draft tree: at each node draw the target's token as decoding would
        (`sample_node`, see verify.py), append it (and any forced text) exactly as a decode
        step does (`add_sampled`), then continue from the child holding those tokens, if the
        tree has one. The nodes walked through keep their KV; the other nodes' slots go back
        to the pool, so rejected tokens never reach the radix cache.

        logits: [1 + len(tree), V], the root's row first, then node i's at row i + 1.
        """
        base, draft_slots = r.slots[: r.num_computed], r.slots[r.num_computed :]
        kept: list[int] = []
        node = -1
        while True:
            children = tree.children(node)
            drafted = next(
                ((t, tree.probs[c]) for t, c in children.items() if tree.probs[c] is not None),
                None,
            )
            before = len(r.output_ids)
            # A request finishing here frees its slots past num_computed: the unused nodes'.
            add_sampled(r, sample_node(logits[node + 1], r, drafted))
            if r.finish_reason is not None:
                break
            appended = r.output_ids[before:]
            path = tree.follow(node, appended)
            # The followed nodes' KV is that of the tokens just appended, at their positions.
            kept += path
            unused = torch.ones(len(tree), dtype=torch.bool)
            unused[kept] = False
            r.slots = torch.cat([base, draft_slots[kept], draft_slots[unused]])
            r.num_computed += len(path)
            if len(path) < len(appended):
                break
            node = path[-1]
        if r.finish_reason is None:
            self.kv.free(r.slots[r.num_computed :])
            r.slots = r.slots[: r.num_computed]
        self.record(r, tree, len(kept))

    def propose(self, reqs: list[Request], budget: int) -> list[DraftTree | None]:
        """A draft tree (or None) per decoding request, at most `budget` tokens in all."""
        extra = self.draft.seconds_per_step if self.draft is not None else 0.0
        token_cost = self.cost.token_cost(len(reqs), extra)
        lengths = []
        for r in reqs:
            if r.spec is None:
                r.spec = SpecState()
            limit = min(r.max_new_tokens - len(r.output_ids) - 1, max(budget, 0))
            if self.fixed_length:
                k = min(self.fixed_length, limit)
            else:
                k = r.spec.acceptance.choose_length(token_cost, min(MAX_ADAPTIVE_LENGTH, limit))
            lengths.append(max(k, 0))
            budget -= k  # a tree may hold more nodes than its depth: trimmed below
        matchers = [DraftMatcher(r, self.forced) for r in reqs]
        if self.draft is not None:
            trees = self.draft.propose(reqs, lengths, matchers)
            for m in matchers:
                m.reset()
        else:
            trees = [
                self._ngram(r, k, m) if k else None
                for r, k, m in zip(reqs, lengths, matchers, strict=True)
            ]
        return trees

    def _ngram(self, r: Request, length: int, matcher: DraftMatcher) -> DraftTree | None:
        paths = []
        for path in r.spec.ngram.propose(r.token_ids, length, self.width):
            kept: list[int] = []
            while len(kept) < len(path):
                got = matcher.push(path[len(kept)])
                if got is None:
                    break
                agrees = path[len(kept) : len(kept) + len(got)] == got
                kept += got
                if not agrees or got[-1] in r.stop_ids:
                    break
            matcher.reset()
            if kept:
                paths.append(kept)
        if not paths:
            return None
        # Alternatives to the first candidate may add half as many nodes again: the chosen
        # length prices the step's tokens, and alternatives are less likely to be right.
        tree = DraftTree.from_paths(paths)
        while len(tree) > len(paths[0]) + len(paths[0]) // 2 and len(paths) > 1:
            paths.pop()
            tree = DraftTree.from_paths(paths)
        return tree

    def record(self, r: Request, tree: DraftTree, accepted: int) -> None:
        """A verification step kept `accepted` of `tree`'s nodes."""
        depth = max(_depths(tree), default=0)
        r.spec.acceptance.record(accepted, depth)
        m = self.method
        self.stats.add(
            spec_steps=1,
            spec_proposed_tokens=len(tree),
            spec_accepted_tokens=accepted,
            **{f"spec_{m}_steps": 1, f"spec_{m}_proposed_tokens": len(tree)},
            **{f"spec_{m}_accepted_tokens": accepted},
        )

    def observe_step(self, tokens: int, seconds: float) -> None:
        """A forward of the target over `tokens` new tokens took `seconds`."""
        self.cost.observe(tokens, seconds)

    def release(self, r: Request) -> None:
        """r has finished: free what speculation held for it."""
        if r.spec is not None and self.draft is not None:
            self.draft.release(r)


def _depths(tree: DraftTree) -> list[int]:
    depths: list[int] = []
    for parent in tree.parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths
