"""SpecWorker: speculative decoding as a worker around the model runner, behind the same
`run(batch)`.

Each step it attaches draft trees to the batch's requests that sample after output tokens
(with KV slots for their nodes), runs the target's forward over them, and hands back, for a
request with a tree, its tokens drawn in turn along the tree (`StepResult.steps`): output
processing appends each as a decode step would, and the walk follows the tree through what
was appended. Here live the per-request state, the choice of draft length, the grammar
pruning of drafts, verification, and the stats.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from braid.grammars.matcher import MatcherError
from braid.runtime.config import EngineConfig
from braid.runtime.executor.model_runner import ModelRunner, StepResult
from braid.runtime.executor.sampler import record_tokens, sample, sampling_probs, step_seed
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.spec.adaptive import MAX_ADAPTIVE_LENGTH, Acceptance, StepCost
from braid.runtime.spec.draft_model import DraftModelProposer
from braid.runtime.spec.ngram import NgramIndex
from braid.runtime.spec.tree import DraftTree
from braid.runtime.spec.verify import rejection_sample
from braid.runtime.stats import EngineStats

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request
    from braid.runtime.scheduler.scheduler import Batch

# The acceptance test's uniform comes from its own stream of the request's seed.
ACCEPT_SALT = 0x2545F4914F6CDD1D

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


class SpecWorker:
    """What the engine calls instead of the runner: `run` and `release`."""

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        stats: EngineStats,
        forced: Forced,
        make_room: Callable[[int], bool],
        draft: DraftModelProposer | None = None,
    ) -> None:
        """`make_room(n)`: the scheduler's, frees n KV slots by evicting cached prefixes."""
        self.runner = runner
        self.kv: KVPool = runner.kv
        self.max_batch_tokens = config.max_batch_tokens
        self.make_room = make_room
        self.method = config.spec_method
        self.fixed_length = config.spec_draft_length
        self.width = config.spec_tree_width
        self.stats = stats
        self.forced = forced
        self.draft = draft
        self.cost = StepCost()

    def run(self, batch: Batch) -> list[StepResult]:
        """The runner's results for `batch` with draft trees attached: a request with a tree
        gets its tokens in turn (`steps`)."""
        if not batch.drafts:  # (a batch run again, its requests one by one, has its trees)
            self._attach(batch, self.max_batch_tokens - sum(batch.num_new))
        started = time.perf_counter()
        results = self.runner.run(batch)
        if all(r.is_decoding for r in batch.requests):
            if self.runner.device.type == "cuda":  # a step that only verifies never waited
                torch.cuda.synchronize(self.runner.device)
            self.cost.observe(sum(batch.num_new), time.perf_counter() - started)
        for i, res in enumerate(results):
            tree = batch.draft(i)
            if tree is not None:
                res.steps = self._walk(batch.requests[i], tree, res.draft_logits)
        return results

    def _attach(self, batch: Batch, budget: int) -> None:
        """Draft trees, within `budget` tokens, for the batch's requests that sample after
        output tokens (decodes, and requests feeding text a grammar forced: that text is
        verified with the draft for free), with KV slots for their nodes; a draft whose slots
        cannot be freed without preempting is dropped."""
        if budget <= 0:
            return
        eligible = [i for i, r in enumerate(batch.requests) if r.output_ids and batch.samples(i)]
        if not eligible:
            return
        batch.drafts = [None] * len(batch.requests)
        trees = self.propose([batch.requests[i] for i in eligible], budget)
        for i, tree in zip(eligible, trees, strict=True):
            if tree is None or len(tree) > budget or not self.make_room(len(tree)):
                continue
            r = batch.requests[i]
            r.add_slots(self.kv.allocate(len(tree)))
            batch.drafts[i] = tree
            batch.num_new[i] += len(tree)
            budget -= len(tree)

    def _walk(self, r: Request, tree: DraftTree, logits: torch.Tensor) -> Iterator[StepResult]:
        """Decode along the draft tree: at each node draw the target's token as decoding would
        (`_sample_node`) once the tokens before it are appended,
        then continue from the child holding what was appended (the token and any forced
        text), if the tree has one. The nodes walked through keep their KV; the other nodes'
        slots go back to the pool, so rejected tokens never reach the radix cache.

        logits: [1 + len(tree), V], the root's row first, then node i's at row i + 1. The
        consumer stops early (closing the walk) when r ends.
        """
        # r's step counted only its known tokens: the tree's slots are past num_computed.
        base, draft_slots = r.slots[: r.num_computed].clone(), r.slots[r.num_computed :].clone()
        kept: list[int] = []
        node = -1
        try:
            while True:
                children = tree.children(node)
                drafted = next(
                    ((t, tree.probs[c]) for t, c in children.items() if tree.probs[c] is not None),
                    None,
                )
                before = len(r.output_ids)
                yield self._sample_node(logits[node + 1], r, drafted)
                appended = r.output_ids[before:]
                path = tree.follow(node, appended)
                # The followed nodes' KV is that of the tokens just appended, at their positions.
                kept += path
                unused = torch.ones(len(tree), dtype=torch.bool)
                unused[kept] = False
                r.slots = torch.cat([base, draft_slots[kept], draft_slots[unused]])
                r.num_computed += len(path)
                if len(path) < len(appended):
                    return
                node = path[-1]
        finally:
            # A request that ended frees its slots past num_computed (the unused nodes') when
            # the scheduler releases it.
            if r.finish_reason is None:
                self.kv.free(r.slots[r.num_computed :])
                r.keep_slots(r.num_computed)
            self._record(r, tree, len(kept))

    def _sample_node(
        self, logits: torch.Tensor, r: Request, drafted: tuple[int, torch.Tensor] | None
    ) -> StepResult:
        """r's next token from one draft tree node's logits [V], drawn as decoding draws it
        (the same seed for the same step). `drafted` = (token, q) when a child of the node was
        sampled from a draft model's distribution q: then the rejection rule decides
        (verify.py)."""
        vocab = self.runner.tokenizer_size
        if drafted is None or r.params.temperature == 0:
            tokens = sample(logits[None], [r], vocab)
        else:
            step = len(r.output_ids)
            p = sampling_probs(logits, r, vocab)
            accept_seed = step_seed(r.seed ^ ACCEPT_SALT, step)
            tokens = [rejection_sample(p, *drafted, accept_seed, step_seed(r.seed, step))]
        result = StepResult()
        record_tokens(logits[None], [r], [result], tokens)
        return result

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

    def _record(self, r: Request, tree: DraftTree, accepted: int) -> None:
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

    def release(self, r: Request) -> None:
        """r has finished: free what speculation held for it."""
        if r.spec is not None and self.draft is not None:
            self.draft.release(r)


def _depths(tree: DraftTree) -> list[int]:
    depths: list[int] = []
    for parent in tree.parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths
