"""ModelRunner: one forward over a scheduled batch, then sampling and logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from braid.runtime.cuda_graphs import DecodeGraphs
from braid.runtime.forward_batch import ForwardBatch
from braid.runtime.kv_cache import KVPool
from braid.runtime.models import LlamaForCausalLM
from braid.runtime.models.lora import LoraBatch
from braid.runtime.sampler import sample, sampling_probs, step_seed
from braid.runtime.scheduler import Batch
from braid.runtime.spec.verify import rejection_sample
from braid.runtime.tp import Ranks

# The acceptance test's uniform comes from its own stream of the request's seed.
ACCEPT_SALT = 0x2545F4914F6CDD1D


@dataclass
class StepResult:
    # The sampled token, when the request's feed completed; -1 when no token was allowed.
    token: int | None = None
    logprob: float = 0.0  # its logprob under the model's distribution (temperature 1)
    top_logprobs: dict[int, float] = field(default_factory=dict)
    prompt_logprobs: list[float] = field(default_factory=list)  # for the fed prompt tokens
    # With top_logprobs: each of those positions' most likely tokens (id -> logprob).
    prompt_top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # With a draft tree: logits [1 + len(tree), V] of the request's last token (the root) and
    # of each tree node, for the engine to verify the tree with (nothing is sampled here).
    draft_logits: torch.Tensor | None = None


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv: KVPool,
        device: torch.device,
        tokenizer_size: int,
        graphs: DecodeGraphs | None = None,
        ranks: Ranks | None = None,
    ):
        self.model = model
        self.kv = kv
        self.device = device
        self.graphs = graphs  # decode steps replay these when they fit
        self.ranks = ranks  # tensor parallelism: the other ranks run every forward too
        # Rows of the model's vocabulary past the tokenizer's are padding: never sampled.
        self.vocab_size = min(tokenizer_size, model.config.vocab_size)
        self.tokenizer_size = tokenizer_size

    def run(self, batch: Batch) -> list[StepResult]:
        new_tokens, slot_tables, rows, prompt_spans, parents = [], [], [], [], []
        for i, (r, n) in enumerate(zip(batch.requests, batch.num_new, strict=True)):
            start, known, draft = r.num_computed, batch.num_known(i), batch.draft(i)
            new_tokens.append(r.token_ids[start : start + known])
            slot_tables.append(r.slots[: start + n])
            parents.append(None)
            if draft is not None:  # verified after the known tokens, all in this forward
                new_tokens[-1], parents[-1], draft_rows = draft.feed(new_tokens[-1])
                rows.append(draft_rows)
                prompt_spans.append((start, start))
                continue
            # Position p's logits predict token p + 1: prompt logprobs from `first` on need
            # the logits of positions first - 1 .. len(prompt) - 2; this step fed lo .. hi - 1.
            lo = hi = start
            first = r.params.prompt_logprobs_from
            if first is not None and not r.output_ids:
                lo, hi = max(first - 1, start), min(len(r.prompt_ids) - 1, start + n)
                hi = max(hi, lo)
            prompt_spans.append((lo, hi))
            rows.append([p - start for p in range(lo, hi)] + ([n - 1] if batch.samples(i) else []))
        # Draft tree nodes run under their request's adapter like its other new tokens.
        lora = LoraBatch.of(
            [r.lora for r in batch.requests], [len(t) for t in new_tokens], self.device
        )
        # The captured graphs hold no adapter updates.
        if (
            lora is None
            and self.graphs is not None
            and self.graphs.fits(new_tokens, slot_tables, rows)
        ):
            logits = self.graphs.forward(new_tokens, slot_tables)
        else:
            fb = ForwardBatch.build(
                new_tokens, slot_tables, rows, device=self.device, parents=parents, lora=lora
            )
            if self.ranks is None:
                logits = self.model(fb, self.kv)
            else:
                with self.ranks.step(new_tokens, slot_tables, parents):
                    logits = self.model(fb, self.kv)
        logits = logits[:, : self.vocab_size]

        results = [StepResult() for _ in batch.requests]
        offset, sample_rows, sampled = 0, [], []
        for i, r in enumerate(batch.requests):
            lo, hi = prompt_spans[i]
            num_lp = hi - lo
            if num_lp:
                targets = torch.tensor(r.prompt_ids[lo + 1 : hi + 1], device=logits.device)
                logp = torch.log_softmax(logits[offset : offset + num_lp].float(), dim=-1)
                results[i].prompt_logprobs = logp.gather(1, targets[:, None])[:, 0].tolist()
                if r.params.top_logprobs:
                    results[i].prompt_top_logprobs = _top(logp, r.params.top_logprobs)
            if batch.draft(i) is not None:
                results[i].draft_logits = logits[offset : offset + len(rows[i])].float()
            elif batch.samples(i):
                sample_rows.append(offset + num_lp)
                sampled.append(i)
            offset += len(rows[i])
        if sampled:
            if sample_rows != list(range(logits.shape[0])):  # a decode step samples every row
                logits = logits[sample_rows]
            self._sample(
                logits,
                [batch.requests[i] for i in sampled],
                [results[i] for i in sampled],
            )
        return results

    def hidden_states(
        self, new_tokens: list[list[int]], slot_tables: list[torch.Tensor]
    ) -> torch.Tensor:
        """The final normed hidden states [T, hidden] of every new token, in the weights'
        dtype (embeddings pool them): a forward like `run`'s, without the head or sampling."""
        rows = [list(range(len(t))) for t in new_tokens]
        fb = ForwardBatch.build(new_tokens, slot_tables, rows, device=self.device)
        if self.ranks is None:
            return self.model(fb, self.kv, hidden_states=True)
        with self.ranks.step(new_tokens, slot_tables, [None] * len(new_tokens)):
            return self.model(fb, self.kv, hidden_states=True)

    def sample_node(
        self, logits: torch.Tensor, r, drafted: tuple[int, torch.Tensor] | None = None
    ) -> StepResult:
        """r's next token from one draft tree node's logits [V], drawn as decoding draws it
        (the same seed for the same step). `drafted` = (token, q) when a child of the node was
        sampled from a draft model's distribution q: then the rejection rule decides."""
        result = StepResult()
        if drafted is None or r.params.temperature == 0:
            tokens = sample(logits[None], [r], self.tokenizer_size)
        else:
            step = len(r.output_ids)
            p = sampling_probs(logits, r, self.tokenizer_size)
            accept_seed = step_seed(r.seed ^ ACCEPT_SALT, step)
            tokens = [rejection_sample(p, *drafted, accept_seed, step_seed(r.seed, step))]
        self._add_logprobs(logits[None], [r], [result], tokens)
        return result

    def _sample(self, logits: torch.Tensor, reqs: list, results: list[StepResult]) -> None:
        self._add_logprobs(logits, reqs, results, sample(logits, reqs, self.tokenizer_size))

    def _add_logprobs(
        self, logits: torch.Tensor, reqs: list, results: list[StepResult], tokens: list[int]
    ) -> None:
        # A row that allowed no token (-1) has nothing to report: its request fails.
        want_logprobs = [
            i for i, r in enumerate(reqs) if r.params.wants_logprobs and tokens[i] >= 0
        ]
        if want_logprobs:
            logp = torch.log_softmax(logits[want_logprobs].float(), dim=-1)
            for row, i in enumerate(want_logprobs):
                results[i].logprob = float(logp[row, tokens[i]])
                k = reqs[i].params.top_logprobs
                if k:
                    [results[i].top_logprobs] = _top(logp[row : row + 1], k)
        for res, t in zip(results, tokens, strict=True):
            res.token = t


def _top(logp: torch.Tensor, k: int) -> list[dict[int, float]]:
    """Each row's k most likely token ids with their logprobs, best first."""
    top = logp.topk(k)
    return [
        dict(zip(ids, values, strict=True))
        for ids, values in zip(top.indices.tolist(), top.values.tolist(), strict=True)
    ]
