"""Drafts from a smaller model sharing the tokenizer (or the target's first layers), run
autoregressively over its own KV pool."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.executor.sampler import sample, sampling_probs, step_seed
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.kvcache.radix_cache import common_prefix_length
from braid.runtime.spec.constrained import draft_step
from braid.runtime.spec.tree import ROOT, DraftTree
from braid.runtime.spec.verify import race

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request
    from braid.runtime.scheduler.scheduler import Scheduler

# Seeds of the draft's own draws differ from the target's (salted request seed).
DRAFT_SALT = 0x5DEECE66D

Forward = Callable[[ForwardBatch, KVPool], torch.Tensor]


class DraftModelProposer:
    """Each request keeps the draft's KV of the tokens it has fed (`SpecState.draft_ids` in
    `Request.draft_slots`, which the scheduler hands out from the draft's pool). A proposal
    first feeds whatever the draft lacks (after a rollback, the tokens since the first one
    that differs), then one token per step for all requests at once. Draft slots are freed
    when the request finishes or the pool runs short."""

    def __init__(
        self, forward: Forward, kv: KVPool, vocab_size: int, tokenizer_size: int, device
    ) -> None:
        self.forward = forward
        self.kv = kv
        self.vocab_size = vocab_size  # columns compared with the target's distribution
        self.tokenizer_size = tokenizer_size
        self.device = device
        self.seconds_per_step = 0.0  # EMA of one draft forward, for the cost model

    def propose(
        self, reqs: list[Request], lengths: list[int], scheduler: Scheduler
    ) -> list[DraftTree | None]:
        """A draft tree (or None) per request, at most lengths[i] tokens deep, its path
        walked through the request's constraint (reset by the caller)."""
        trees = [DraftTree([], []) for _ in reqs]
        nodes = [ROOT] * len(reqs)
        feeds, active = [], []
        for i, r in enumerate(reqs):
            if lengths[i] > 0 and self._catch_up(r, lengths[i], scheduler):
                feeds.append(r.token_ids[len(r.spec.draft_ids) :])
                r.spec.draft_ids = list(r.token_ids)
                active.append(i)
        while active:
            tables = [reqs[i].draft_slots for i in active]
            started = time.perf_counter()
            fb = ForwardBatch.build(feeds, tables, device=self.device)
            logits = self.forward(fb, self.kv)[:, : self.vocab_size]
            depths = [len(trees[i]) for i in active]
            tokens, probs = self._draw(logits, [reqs[i] for i in active], depths)
            # Timed after the draw, which waits for the device (CUDA runs the forward async).
            if all(len(f) == 1 for f in feeds):  # catch-up feeds are not a draft step's cost
                seconds = time.perf_counter() - started
                self.seconds_per_step = 0.8 * self.seconds_per_step + 0.2 * seconds
            feeds, still = [], []
            for row, i in enumerate(active):
                r, x = reqs[i], tokens[row]
                got = draft_step(r, x)
                if got is None:
                    continue
                for j, t in enumerate(got):
                    nodes[i] = trees[i].add(nodes[i], t, probs[row] if j == 0 else None)
                done = len(got) > 1 or x in r.stop_ids or len(trees[i]) >= lengths[i]
                if done or not scheduler.grow_draft(r):
                    continue
                r.spec.draft_ids.append(x)
                feeds.append([x])
                still.append(i)
            active = still
        return [t if len(t) else None for t in trees]

    def _catch_up(self, r: Request, length: int, scheduler: Scheduler) -> bool:
        """Roll r's draft KV back to what still agrees with r's tokens and make room for the
        rest (the last token is always fed again: its logits give the first draft token)."""
        st = r.spec
        keep = min(common_prefix_length(st.draft_ids, r.token_ids), r.num_tokens - 1)
        st.draft_ids = st.draft_ids[:keep]
        grow = r.num_tokens - keep
        return scheduler.resize_draft(r, keep, grow, headroom=length - 1)

    def _draw(
        self, logits: torch.Tensor, reqs: list[Request], depths: list[int]
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Greedy requests take the draft's argmax (a point mass); sampled ones draw from the
        draft's own distribution q, kept for the rejection rule."""
        tokens: list[int] = [0] * len(reqs)
        probs: list[torch.Tensor | None] = [None] * len(reqs)
        greedy = [i for i, r in enumerate(reqs) if r.params.temperature == 0]
        if greedy:
            picked = sample(logits[greedy], [reqs[i] for i in greedy], self.tokenizer_size)
            for i, t in zip(greedy, picked, strict=True):
                tokens[i] = t
        for i, r in enumerate(reqs):
            if r.params.temperature != 0:
                q = sampling_probs(logits[i], r, self.tokenizer_size)
                seed = step_seed(r.seed ^ DRAFT_SALT, len(r.output_ids) + depths[i])
                tokens[i], probs[i] = race(q, seed), q
        return tokens, probs


def load_draft_proposer(config, target, tokenizer, vocab_size: int, num_slots: int):
    """The proposer for `config.draft_model`: "self" / "self:K" (the target's first K layers
    and its head; K defaults to a quarter of its layers) or an HF directory of a smaller
    model with the same tokenizer. Its KV pool has as many slots as the target's."""
    from braid.runtime.loading.model_loader import load_model, load_model_config, resolve_model_dir
    from braid.runtime.text.tokenizer import load_tokenizer

    name, device, dtype = config.draft_model, config.torch_device, target.norm.weight.dtype
    mc = target.config
    if name == "self" or name.startswith("self:"):
        layers = int(name[5:]) if name != "self" else max(1, mc.num_layers // 4)
        if not 1 <= layers < mc.num_layers:
            raise ValueError(
                f"EngineConfig.draft_model: {name!r} must keep 1 to {mc.num_layers - 1} layers"
            )

        def forward(batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
            return target(batch, kv, num_layers=layers)

    else:
        path = resolve_model_dir(name)
        if load_tokenizer(path).get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"EngineConfig.draft_model: {path} has another tokenizer")
        mc = load_model_config(path)
        if mc.vocab_size < vocab_size:
            raise ValueError(
                f"EngineConfig.draft_model: {path} has {mc.vocab_size} vocabulary rows, "
                f"the target samples from {vocab_size}"
            )
        forward = load_model(path, mc, dtype, device, config.cpu_kernels)
        layers = mc.num_layers
    kv = KVPool(layers, num_slots, mc.num_kv_heads, mc.head_dim, dtype, device)
    return DraftModelProposer(forward, kv, vocab_size, len(tokenizer), device)
