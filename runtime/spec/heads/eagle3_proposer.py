"""Draft chains from the EAGLE-3 draft layer, over its own KV (Request.draft_slots, one
layer, handed out by the scheduler like a draft model's).

A request's draft KV holds rows first .. first + rows - 1, each made from the target's hidden
states at that position (they never go stale: the target computed them along what it kept).
The target's states not fed yet wait in `pending`. A proposal feeds them (the last one again
each time: its output starts the draft), then one row per step for all requests at once:
tokens a grammar forced that the target has not computed yet, then draft tokens, each row's
hidden state the draft's own output before. Those rows are dropped at the next proposal.

Where the target computed no states for a prefix (found in the radix cache) or the scheduler
took the draft's KV back, the draft's context restarts at the first position it has states
for: drafts get worse there, never wrong (verification decides).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.layers.ops import LayerOps
from braid.runtime.spec.constrained import draft_step
from braid.runtime.spec.heads.eagle3 import Eagle3Head
from braid.runtime.spec.heads.proposer import HeadProposer
from braid.runtime.spec.tree import ROOT, DraftTree

if TYPE_CHECKING:
    from braid.runtime.executor.model_runner import StepResult
    from braid.runtime.scheduler.request import Request
    from braid.runtime.scheduler.scheduler import Scheduler


@dataclass
class EagleMemory:
    first: int  # the position of draft row 0 (r.draft_slots[0])
    rows: int  # rows kept from the target's states
    pending: torch.Tensor | None  # the target's states [n, C * hidden] not fed yet ...
    pending_start: int  # ... from this position


class Eagle3Proposer(HeadProposer):
    def __init__(
        self, head: Eagle3Head, kv: KVPool, ops: LayerOps, vocab_size: int, device
    ) -> None:
        self.head = head
        self.kv = kv
        self.ops = ops
        self.device = device
        # Draft ids whose target id the target never samples (padding rows) are never drafted.
        ids = head.target_ids(torch.arange(head.d2t.numel(), device=head.d2t.device))
        self.refused = ids >= vocab_size

    def observe(
        self,
        r: Request,
        result: StepResult,
        start: int,
        known: int,
        tree: DraftTree | None,
        kept: list[int],
    ) -> None:
        aux = result.aux_hidden
        if aux is None:
            return
        if tree is not None:  # the fed tokens, then the nodes the target kept
            rows = list(range(known)) + [known + node for node in kept]
            aux = aux[torch.tensor(rows, device=aux.device)]
        memory = r.spec.head
        if not isinstance(memory, EagleMemory):
            r.spec.head = EagleMemory(start, 0, aux.clone(), start)
            return
        need = memory.first + memory.rows  # the next position the draft lacks
        have = need if memory.pending is None else memory.pending_start + len(memory.pending)
        if start > have:  # a gap: the context restarts here
            memory.first, memory.rows, memory.pending = start, 0, aux.clone()
            memory.pending_start = start
            return
        if start < need:  # computed again (after a preemption): the draft has those
            aux, start = aux[need - start :], need
        if memory.pending is None:
            memory.pending, memory.pending_start = aux.clone(), start
        else:
            memory.pending = torch.cat([memory.pending[: start - memory.pending_start], aux])

    @torch.inference_mode()
    def propose(
        self, reqs: list[Request], lengths: list[int], scheduler: Scheduler
    ) -> list[DraftTree | None]:
        trees = [DraftTree([], []) for _ in reqs]
        active, feeds, states = [], [], []
        for i, r in enumerate(reqs):
            fed = self._catch_up(r, lengths[i], scheduler)
            if fed is not None:
                active.append(i)
                feeds.append(fed[0])
                states.append(fed[1])
        if not active:
            return [None] * len(reqs)
        hidden = self.head.fc(torch.cat(states))
        positions = [reqs[i].spec.head.pending_start for i in active]  # each one's last row
        nodes = [ROOT] * len(reqs)
        while active:
            started = time.perf_counter()
            fb = ForwardBatch.build(
                feeds, [reqs[i].draft_slots for i in active], device=self.device
            )
            logits, hidden = self.head(fb, self.kv, hidden, self.ops)
            logits = logits.float().masked_fill_(self.refused, float("-inf"))
            picked = self.head.target_ids(logits.argmax(-1)).tolist()
            if all(len(f) == 1 for f in feeds):  # catch-up feeds are not a draft step's cost
                seconds = time.perf_counter() - started
                self.seconds_per_step = 0.8 * self.seconds_per_step + 0.2 * seconds
            feeds, still, rows = [], [], []
            for row, (i, p) in enumerate(zip(active, positions, strict=True)):
                r = reqs[i]
                if p + 2 < r.num_tokens:  # forced text the target has not computed yet
                    token = r.token_ids[p + 2]
                else:
                    token = picked[row]
                    got = draft_step(r, token)
                    if got is None:
                        continue
                    for t in got:
                        nodes[i] = trees[i].add(nodes[i], t)
                    if len(got) > 1 or token in r.stop_ids or len(trees[i]) >= lengths[i]:
                        continue
                if not scheduler.grow_draft(r):
                    continue
                feeds.append([token])
                still.append(i)
                rows.append(row)
            positions = [p + 1 for i, p in zip(active, positions, strict=True) if i in still]
            active, hidden = still, hidden[rows]
        return [t if len(t) else None for t in trees]

    def _catch_up(
        self, r: Request, length: int, scheduler: Scheduler
    ) -> tuple[list[int], torch.Tensor] | None:
        """r's rows to feed from the target's states (tokens, states), with draft slots for
        them and room for the steps to come; None when r gets no draft."""
        memory = r.spec.head
        if length <= 0 or not isinstance(memory, EagleMemory) or memory.pending is None:
            return None
        if memory.first + memory.rows != memory.pending_start or (
            r.draft_slots.numel() < memory.rows  # the scheduler took the draft's KV back
        ):
            memory.first, memory.rows = memory.pending_start, 0
        # Row p needs token p + 1: rows up to num_tokens - 2.
        usable = min(len(memory.pending), r.num_tokens - 1 - memory.pending_start)
        if usable <= 0:
            return None
        start = memory.pending_start
        forced = r.num_tokens - 2 - (start + usable - 1)
        if not scheduler.resize_draft(r, memory.rows, usable, headroom=forced + length):
            memory.first, memory.rows = start, 0
            return None
        tokens = r.token_ids[start + 1 : start + 1 + usable]
        states = memory.pending[:usable]
        # All but the last row are kept; the last is fed again next time (its output starts
        # that draft).
        memory.rows += usable - 1
        memory.pending = memory.pending[usable - 1 :]
        memory.pending_start = start + usable - 1
        return tokens, states
