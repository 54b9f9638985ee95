"""Draft trees from Medusa heads: the heads read the final hidden state of the last position
the target computed along what it kept, and each proposes its top tokens for one later
position; the tree holds the likeliest combinations (by the product of the heads' own
probabilities), best first, as many nodes as the draft length and half as many again."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from braid.runtime.spec.constrained import draft_step
from braid.runtime.spec.heads.medusa import MedusaHeads
from braid.runtime.spec.heads.proposer import HeadProposer
from braid.runtime.spec.tree import DraftTree

if TYPE_CHECKING:
    from braid.runtime.executor.model_runner import StepResult
    from braid.runtime.scheduler.request import Request
    from braid.runtime.scheduler.scheduler import Scheduler


@dataclass
class MedusaMemory:
    """The final normed hidden state [hidden] at `position` of one request."""

    hidden: torch.Tensor
    position: int


class MedusaProposer(HeadProposer):
    def __init__(self, heads: MedusaHeads, vocab_size: int, width: int) -> None:
        """`vocab_size`: the columns the target samples from; `width`: top tokens per head."""
        self.heads = heads
        self.vocab_size = vocab_size
        self.width = width

    def observe(
        self,
        r: Request,
        result: StepResult,
        start: int,
        known: int,
        tree: DraftTree | None,
        kept: list[int],
    ) -> None:
        if result.hidden is None:
            return
        if tree is None:
            if result.token is None:  # a prefill chunk that sampled nothing
                return
            row, position = result.hidden[-1], start + known - 1
        else:  # the root's row, then each node's: the last node kept is deepest
            row = result.hidden[kept[-1] + 1 if kept else 0]
            position = start + known - 1 + len(kept)
        r.spec.head = MedusaMemory(row.clone(), position)

    def propose(
        self, reqs: list[Request], lengths: list[int], scheduler: Scheduler
    ) -> list[DraftTree | None]:
        # Head k at position p guesses position p + 2 + k; the tree's first level is
        # position num_tokens. Tokens a grammar forced since p skip the heads for them.
        firsts, rows = [], []
        for r, k in zip(reqs, lengths, strict=True):
            memory = r.spec.head
            first = None
            if k > 0 and isinstance(memory, MedusaMemory):
                first = r.num_tokens - memory.position - 2
                if not 0 <= first < self.heads.num_heads:
                    first = None
            firsts.append(first)
            if first is not None:
                rows.append(memory.hidden)
        if not rows:
            return [None] * len(reqs)
        last = max(f + k for f, k in zip(firsts, lengths, strict=True) if f is not None)
        heads = range(min(last, self.heads.num_heads))
        started = time.perf_counter()
        logits = self.heads(torch.stack(rows), heads)[..., : self.vocab_size].float()
        top = logits.log_softmax(-1).topk(min(self.width, self.vocab_size), dim=-1)
        values, tokens = top.values.cpu(), top.indices.cpu()  # [heads, B, width]
        seconds = (time.perf_counter() - started) / len(heads)
        self.seconds_per_step = 0.8 * self.seconds_per_step + 0.2 * seconds
        trees, row = [], 0
        for r, k, first in zip(reqs, lengths, firsts, strict=True):
            if first is None:
                trees.append(None)
                continue
            depth = min(k, len(heads) - first)
            picks = best_paths(values[first : first + depth, row], k + k // 2)
            trees.append(_walk_paths(r, tokens[first:, row].tolist(), picks))
            row += 1
        return trees


def best_paths(logp: torch.Tensor, count: int) -> list[tuple[int, ...]]:
    """The `count` likeliest choices (i_1, ..., i_d) of one candidate per level (logp
    [depth, width], each level's candidates in descending order), parents before their
    children: best first, each choice reached from its parent (a first candidate one level
    deeper) or from its elder sibling, whose scores bound it."""
    depth, width = logp.shape
    if depth == 0:
        return []
    scores = logp.tolist()
    heap = [(-scores[0][0], (0,))]
    picks: list[tuple[int, ...]] = []
    while heap and len(picks) < count:
        neg, path = heapq.heappop(heap)
        picks.append(path)
        if len(path) < depth:
            heapq.heappush(heap, (neg - scores[len(path)][0], (*path, 0)))
        if path[-1] + 1 < width:
            level, i = len(path) - 1, path[-1]
            sibling = neg + scores[level][i] - scores[level][i + 1]
            heapq.heappush(heap, (sibling, (*path[:-1], i + 1)))
    return picks


def _walk_paths(r: Request, candidates: list[list[int]], picks: list[tuple[int, ...]]):
    """The tree of the picked paths, each walked through r's grammar from the root: a token it
    refuses ends the path, text it forces joins it (and moves the path's later levels to the
    heads of later positions). candidates[j]: the top tokens of the head for level j + 1."""
    paths = []
    for pick in picks:
        kept: list[int] = []
        for i in pick:
            if len(kept) >= len(candidates):
                break
            token = candidates[len(kept)][i]
            got = draft_step(r, token)
            if got is None:
                break
            kept += got
            if token in r.stop_ids:
                break
        if r.constraint is not None:
            r.constraint.reset_draft()
        if kept:
            paths.append(kept)
    return DraftTree.from_paths(paths) if paths else None
