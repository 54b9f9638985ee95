"""SpecWorker: speculative decoding as a worker around the model runner, behind the same
`run(batch)`.

Each step it attaches draft trees to the batch's requests that sample after output tokens
(with KV slots for their nodes, which the scheduler reserves), runs the target's forward over
them, and hands back, for a request with a tree, its tokens drawn in turn along the tree
(`StepResult.steps`): output processing appends each as a decode step would, and the walk
follows the tree through what was appended, recording the nodes it followed
(`StepResult.kept_nodes`) for the scheduler to count as computed. Here live the per-request
state, the choice of draft length, the grammar pruning of drafts, verification, and the
stats.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from braid.runtime.config import EngineConfig
from braid.runtime.executor.model_runner import ModelRunner, StepResult
from braid.runtime.executor.sampler import record_tokens, sample, sampling_probs, step_seed
from braid.runtime.spec.adaptive import MAX_ADAPTIVE_LENGTH, Acceptance, StepCost
from braid.runtime.spec.constrained import draft_step
from braid.runtime.spec.draft_model import DraftModelProposer
from braid.runtime.spec.heads.proposer import HeadProposer
from braid.runtime.spec.ngram import NgramIndex
from braid.runtime.spec.suffix import SuffixStore
from braid.runtime.spec.tree import DraftTree
from braid.runtime.spec.verify import rejection_sample
from braid.runtime.stats import EngineStats

if TYPE_CHECKING:
    from braid.runtime.scheduler.batch import Batch
    from braid.runtime.scheduler.request import Request
    from braid.runtime.scheduler.scheduler import Scheduler

# The acceptance test's uniform comes from its own stream of the request's seed.
ACCEPT_SALT = 0x2545F4914F6CDD1D
# Output tokens the suffix store keeps across requests (~0.6 KB each with their index).
SUFFIX_STORE_TOKENS = 1 << 16


@dataclass(eq=False)
class SpecState:
    """What speculation remembers about one request."""

    acceptance: Acceptance = field(default_factory=Acceptance)
    ngram: NgramIndex = field(default_factory=NgramIndex)
    # The tokens whose draft-model KV exists (in Request.draft_slots).
    draft_ids: list[int] = field(default_factory=list)
    # The request's output in the suffix store: its id there and how many tokens it holds.
    suffix_id: int | None = None
    suffix_stored: int = 0
    # A trained draft head's memory of the request (runtime/spec/heads: hidden states).
    head: object = None


class SpecWorker:
    """What the engine calls instead of the runner: `run`."""

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        stats: EngineStats,
        scheduler: Scheduler,
        draft: DraftModelProposer | HeadProposer | None = None,
    ) -> None:
        """`scheduler`: where the draft trees' KV slots (and the draft model's) come from.
        `draft`: a draft model or a trained head; without one, n-gram and suffix lookups."""
        self.runner = runner
        self.max_batch_tokens = config.max_batch_tokens
        self.scheduler = scheduler
        self.method = config.spec_method
        self.fixed_length = config.spec_draft_length
        self.width = config.spec_tree_width
        self.stats = stats
        self.proposer = draft
        # A trained head sees every step's hidden states.
        self.heads = draft if isinstance(draft, HeadProposer) else None
        self.cost = StepCost()
        # Earlier requests' outputs, by cache namespace (a tenant's never reach another's).
        self.suffix = None
        if self.method in ("auto", "suffix"):
            self.suffix = SuffixStore(SUFFIX_STORE_TOKENS)

    def run(self, batch: Batch) -> list[StepResult]:
        """The runner's results for `batch` with draft trees attached: a request with a tree
        gets its tokens in turn (`steps`)."""
        if not batch.drafts:  # (a batch run again, its requests one by one, has its trees)
            self._attach(batch, self.max_batch_tokens - sum(batch.num_new))
        # Where each request's feed starts, before the step counts it as computed.
        starts = [r.num_computed for r in batch.requests]
        started = time.perf_counter()
        results = self.runner.run(batch)
        if all(r.is_decoding for r in batch.requests):
            if self.runner.device.type == "cuda":  # a step that only verifies never waited
                torch.cuda.synchronize(self.runner.device)
            self.cost.observe(sum(batch.num_new), time.perf_counter() - started)
        for i, res in enumerate(results):
            tree, r, known = batch.draft(i), batch.requests[i], batch.num_known(i)
            if tree is not None:
                res.steps = self._walk(r, tree, res, starts[i], known)
            elif self.heads is not None:
                if r.spec is None:
                    r.spec = SpecState()
                self.heads.observe(r, res, starts[i], known, None, [])
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
            if tree is None or len(tree) > budget:
                continue
            if not self.scheduler.reserve(batch.requests[i], len(tree)):
                continue
            batch.drafts[i] = tree
            batch.num_new[i] += len(tree)
            budget -= len(tree)

    def _walk(
        self, r: Request, tree: DraftTree, root: StepResult, start: int, known: int
    ) -> Iterator[StepResult]:
        """Decode along the draft tree: at each node draw the target's token as decoding would
        (`_sample_node`) once the tokens before it are appended, then continue from the child
        holding what was appended (the token and any forced text), if the tree has one. The
        nodes walked through hold the KV of the tokens appended at their positions: they go
        to `root.kept_nodes` when the walk is closed (the scheduler keeps their slots and
        frees the others', so rejected tokens never reach the radix cache).

        root.draft_logits: [1 + len(tree), V], the root's row first, then node i's at row
        i + 1. The consumer stops early (closing the walk) when r ends. A trained head sees
        the hidden states along the kept path then (r fed `known` tokens from `start`).
        """
        logits = root.draft_logits
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
                kept += path
                if len(path) < len(appended):
                    return
                node = path[-1]
        finally:
            root.kept_nodes = kept
            self._record(r, tree, len(kept))
            if self.heads is not None:
                self.heads.observe(r, root, start, known, tree, kept)

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
        extra = self.proposer.seconds_per_step if self.proposer is not None else 0.0
        token_cost = self.cost.token_cost(len(reqs), extra)
        lengths = []
        for r in reqs:
            if r.spec is None:
                r.spec = SpecState()
            if self.suffix is not None:
                self._store_output(r)
            limit = min(r.max_new_tokens - len(r.output_ids) - 1, max(budget, 0))
            if self.fixed_length:
                k = min(self.fixed_length, limit)
            else:
                k = r.spec.acceptance.choose_length(token_cost, min(MAX_ADAPTIVE_LENGTH, limit))
            lengths.append(max(k, 0))
            budget -= k  # a tree may hold more nodes than its depth: trimmed below
        if self.proposer is not None:
            trees = self.proposer.propose(reqs, lengths, self.scheduler)
            for r in reqs:
                if r.constraint is not None:
                    r.constraint.reset_draft()
        else:
            trees = [self._lookup(r, k) if k else None for r, k in zip(reqs, lengths, strict=True)]
        return trees

    def _candidates(self, r: Request, length: int) -> list[list[int]]:
        """Continuations of r's last tokens: from its own prompt and output (n-gram), then
        from earlier outputs of its namespace (suffix store), distinct, at most `width`."""
        paths = []
        if self.method in ("auto", "ngram"):
            paths = r.spec.ngram.propose(r.token_ids, length, self.width)
        if self.suffix is not None:
            for path in self.suffix.propose(r.cache_namespace, r.token_ids, length, self.width):
                if path not in paths and len(paths) < self.width:
                    paths.append(path)
        return paths

    def _store_output(self, r: Request) -> None:
        """r's output so far into the suffix store (its later requests' drafts)."""
        state = r.spec
        new = r.output_ids[state.suffix_stored :]
        if not new:
            return
        if state.suffix_id is None:
            state.suffix_id = self.suffix.add(r.cache_namespace, new)
        else:
            self.suffix.extend(state.suffix_id, new)
        state.suffix_stored = len(r.output_ids)

    def _lookup(self, r: Request, length: int) -> DraftTree | None:
        paths = []
        for path in self._candidates(r, length):
            kept: list[int] = []
            while len(kept) < len(path):
                got = draft_step(r, path[len(kept)])
                if got is None:
                    break
                agrees = path[len(kept) : len(kept) + len(got)] == got
                kept += got
                if not agrees or got[-1] in r.stop_ids:
                    break
            if r.constraint is not None:
                r.constraint.reset_draft()
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


def _depths(tree: DraftTree) -> list[int]:
    depths: list[int] = []
    for parent in tree.parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths
