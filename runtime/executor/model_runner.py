"""ModelRunner: one forward over a scheduled batch, then sampling and logprobs."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import torch

from braid.runtime.executor.cuda_graphs import DecodeGraphs
from braid.runtime.executor.forward_batch import ForwardBatch, HiddenCapture
from braid.runtime.executor.sampler import (
    SamplingArgs,
    prepare_sampling,
    record_tokens,
    sample_prepared,
    top_logprobs,
)
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.lora.adapter import LoraBatch
from braid.runtime.models import LlamaForCausalLM
from braid.runtime.scheduler.batch import Batch
from braid.runtime.tp import Ranks


@dataclass
class StepResult:
    # The sampled token, when the request's feed completed; -1 when no token was allowed.
    token: int | None = None
    logprob: float = 0.0  # its logprob under the model's distribution (temperature 1)
    # Its top alternatives when asked for (with max_tokens=0 and no token: those after the
    # prompt).
    top_logprobs: dict[int, float] = field(default_factory=dict)
    prompt_logprobs: list[float] = field(default_factory=list)  # for the fed prompt tokens
    # With top_logprobs: each of those positions' most likely tokens (id -> logprob).
    prompt_top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # With a draft tree: logits [1 + len(tree), V] of the request's last token (the root) and
    # of each tree node, for the engine to verify the tree with (nothing is sampled here).
    draft_logits: torch.Tensor | None = None
    # Set by the speculative worker for a request with a draft tree: its tokens, each drawn
    # once the ones before it are appended (output processing consumes them in turn), and,
    # once that walk is closed, the tree nodes it followed (their KV is kept).
    steps: Generator[StepResult, None, None] | None = None
    kept_nodes: list[int] = field(default_factory=list)
    # For draft heads (ModelRunner.capture): the final normed hidden states of the logits
    # rows above (a tree's root and nodes; the sampled row last), and the target's states at
    # the heads' layers for every token the request fed (draft nodes included), [n, C * H].
    hidden: torch.Tensor | None = None
    aux_hidden: torch.Tensor | None = None


@dataclass
class PreparedBatch:
    """What `ModelRunner.prepare` builds from a batch, once, before its forward."""

    batch: Batch
    # The forward's inputs, one entry per request.
    new_tokens: list[list[int]]
    slot_tables: list[torch.Tensor]
    rows: list[list[int]]  # the new tokens whose logits are kept (indices into new_tokens)
    parents: list[list[int] | None]  # a draft tree's parent links, else None
    lora: LoraBatch | None
    # What to read from the logits: request i's rows start at offsets[i]; its prompt
    # logprobs are for positions prompt_spans[i] = (lo, hi).
    offsets: list[int]
    prompt_spans: list[tuple[int, int]]
    sampled: list[int]  # the requests that sample a token here (draft trees are verified)
    sample_rows: list[int]  # their logits rows
    sampling: SamplingArgs | None  # their sampling arguments (None when none samples)
    capture: HiddenCapture | None = None  # what the forward copied out for draft heads


class ModelRunner:
    """`run(batch)` = `prepare` (inputs and sampling arguments, once) -> `forward` (logits)
    -> `sample` (tokens and logprobs)."""

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
        # What draft heads read from every forward (runtime/spec/heads sets it), or None.
        self.capture: HiddenCapture | None = None

    def run(self, batch: Batch) -> list[StepResult]:
        prepared = self.prepare(batch)
        return self.sample(prepared, self.forward(prepared))

    def prepare(self, batch: Batch) -> PreparedBatch:
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
            last = batch.samples(i) or _reports_next_top(batch, i)
            rows.append([p - start for p in range(lo, hi)] + ([n - 1] if last else []))
        # Draft tree nodes run under their request's adapter like its other new tokens.
        lora = LoraBatch.of(
            [r.lora for r in batch.requests], [len(t) for t in new_tokens], self.device
        )
        offsets, sampled, sample_rows, offset = [], [], [], 0
        for i, (lo, hi) in enumerate(prompt_spans):
            offsets.append(offset)
            if batch.draft(i) is None and batch.samples(i):
                sampled.append(i)
                sample_rows.append(offset + hi - lo)
            offset += len(rows[i])
        sampling = None
        if sampled:
            reqs = [batch.requests[i] for i in sampled]
            sampling = prepare_sampling(reqs, self.tokenizer_size, self.device)
        return PreparedBatch(
            batch, new_tokens, slot_tables, rows, parents, lora,
            offsets, prompt_spans, sampled, sample_rows, sampling,
        )  # fmt: skip

    def forward(self, prepared: PreparedBatch) -> torch.Tensor:
        """The logits [rows, vocab_size] of every kept row, request by request."""
        p = prepared
        if self.capture is not None:  # filled per forward: a template
            p.capture = HiddenCapture(self.capture.layers, self.capture.final)
        # The captured graphs hold no adapter updates, nor the heads' hidden states.
        if (
            p.lora is None
            and p.capture is None
            and self.graphs is not None
            and self.graphs.fits(p.new_tokens, p.slot_tables, p.rows)
        ):
            logits = self.graphs.forward(p.new_tokens, p.slot_tables)
        else:
            fb = ForwardBatch.build(
                p.new_tokens, p.slot_tables, p.rows, self.device, parents=p.parents, lora=p.lora
            )
            # (Only llama.py's forward takes a capture: the heads check the target's.)
            extra = {} if p.capture is None else {"capture": p.capture}
            if self.ranks is None:
                logits = self.model(fb, self.kv, **extra)
            else:
                with self.ranks.step(p.new_tokens, p.slot_tables, p.parents):
                    logits = self.model(fb, self.kv, **extra)
        return logits[:, : self.vocab_size]

    def sample(self, prepared: PreparedBatch, logits: torch.Tensor) -> list[StepResult]:
        """Each request's result from the forward's logits: prompt logprobs, a draft tree's
        logits, or a sampled token with its logprobs."""
        batch = prepared.batch
        results = [StepResult() for _ in batch.requests]
        if prepared.capture is not None:
            _hand_out_capture(prepared, results)
        for i, r in enumerate(batch.requests):
            offset, (lo, hi) = prepared.offsets[i], prepared.prompt_spans[i]
            num_lp = hi - lo
            if num_lp:
                targets = torch.tensor(r.prompt_ids[lo + 1 : hi + 1], device=logits.device)
                logp = torch.log_softmax(logits[offset : offset + num_lp].float(), dim=-1)
                results[i].prompt_logprobs = logp.gather(1, targets[:, None])[:, 0].tolist()
                if r.params.top_logprobs:
                    results[i].prompt_top_logprobs = top_logprobs(logp, r.params.top_logprobs)
            if batch.draft(i) is not None:
                results[i].draft_logits = logits[offset : offset + len(prepared.rows[i])].float()
            elif _reports_next_top(batch, i):  # nothing is sampled: only the alternatives
                logp = torch.log_softmax(logits[offset + num_lp : offset + num_lp + 1].float(), -1)
                [results[i].top_logprobs] = top_logprobs(logp, r.params.top_logprobs)
        sampling = prepared.sampling
        if sampling is not None:
            rows = prepared.sample_rows
            if rows != list(range(logits.shape[0])):  # a decode step samples every row
                logits = logits[rows]
            tokens = sample_prepared(logits, sampling)
            picked = [results[i] for i in prepared.sampled]
            record_tokens(logits, sampling.reqs, picked, tokens)
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


def _hand_out_capture(prepared: PreparedBatch, results: list[StepResult]) -> None:
    """Each request's share of the hidden states the forward copied out."""
    capture, token = prepared.capture, 0
    for i, res in enumerate(results):
        n, offset, rows = len(prepared.new_tokens[i]), prepared.offsets[i], len(prepared.rows[i])
        if capture.aux is not None:
            res.aux_hidden = capture.aux[token : token + n]
        if capture.normed is not None and rows:
            res.hidden = capture.normed[offset : offset + rows]
        token += n


def _reports_next_top(batch: Batch, i: int) -> bool:
    """Request i has max_tokens=0 and asks for top_logprobs, and its feed completes here: it
    gets the most likely tokens after its prompt, with nothing sampled (SGLang reports them
    for max_new_tokens=0)."""
    r = batch.requests[i]
    return r.max_new_tokens == 0 and r.params.top_logprobs > 0 and batch.completes_feed(i)
