"""Turns each request's SamplingParams into the tensors `kernels.sample` takes, and samples:
`prepare_sampling` builds a batch's arguments once, before its forward, and `sample_prepared`
samples from the forward's logits (`sample` does both).

Penalties, logit_bias and min_tokens are applied to the logits here (penalties need each
request's token history); constrained rows get their grammar's bitmask; masking, temperature,
top-k/top-p/min-p and the draw happen in `kernels.sample` (one fused Triton kernel) on CUDA
and in its PyTorch twin on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from braid import kernels
from braid.grammars.matcher import allocate_bitmask, set_bits
from braid.kernels import cpu
from braid.kernels.reference.sampling import apply_bitmask, filtered_logprobs
from braid.kernels.reference.sampling import sample as reference_sample
from braid.runtime.output.request_trace import count_allowed

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request

_MASK63 = (1 << 63) - 1


def step_seed(request_seed: int, step: int) -> int:
    """A distinct, reproducible seed for each decoding step of a request, so a request
    preempted and recomputed samples the same tokens again."""
    # splitmix64's increment and multiplier spread consecutive steps over the whole range.
    x = (request_seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9) & _MASK63
    return x ^ (x >> 31)


def sample(logits: torch.Tensor, reqs: list[Request], grammar_vocab_size: int) -> list[int]:
    """One token per row of logits [B, V] (row b belongs to reqs[b]); -1 for a row that
    allows no token (its grammar, min_tokens and stop ids leave none, or its logits are all
    -inf): the engine fails that request alone.

    `grammar_vocab_size` is the tokenizer's size, which sets the width of the grammars'
    bitmask rows (it may differ from V, the model's vocabulary, either way)."""
    return sample_prepared(logits, prepare_sampling(reqs, grammar_vocab_size, logits.device))


@dataclass(frozen=True)
class SamplingArgs:
    """What sampling a batch's rows takes besides their logits, built once per batch before
    the forward (`prepare_sampling`)."""

    reqs: list[Request]
    grammar_vocab_size: int
    # temperature, top_k, top_p, min_p, seeds: one value per row each; None when all greedy.
    per_row: tuple[torch.Tensor, ...] | None


def prepare_sampling(
    reqs: list[Request], grammar_vocab_size: int, device: torch.device
) -> SamplingArgs:
    per_row = None
    if not all(r.params.temperature == 0 for r in reqs):
        ps = [r.params for r in reqs]
        per_row = (
            torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in ps], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=device),
            torch.tensor([p.min_p for p in ps], dtype=torch.float32, device=device),
            torch.tensor(
                [step_seed(r.seed, len(r.output_ids)) for r in reqs],
                dtype=torch.int64,
                device=device,
            ),
        )
    return SamplingArgs(reqs, grammar_vocab_size, per_row)


def sample_prepared(logits: torch.Tensor, args: SamplingArgs) -> list[int]:
    """`sample` with the arguments `prepare_sampling` built: one token per row of logits
    [B, V] (row b belongs to args.reqs[b]), -1 for a row that allows no token."""
    logits = _penalised(logits, args.reqs)
    # Filled once the forward was launched (on CUDA the device is still running it). On the
    # CPU a worker thread filling them during the forward competes with its thread team: the
    # steps came out slower than the fill it hid.
    bitmask = _grammar_bitmask(args.reqs, args.grammar_vocab_size)
    if bitmask is not None:
        _close_thoughts(logits, args.reqs, bitmask)
        bitmask = bitmask.to(logits.device)
    if args.per_row is None:
        # All greedy: the argmax is all the reference would compute that we use (logprobs are
        # the runner's job), and skipping it saves two [B, V] temporaries and the per-row
        # parameter tensors.
        tokens = _greedy(logits, bitmask)
        _note_plain_choices(logits, args, tokens)
        return tokens
    # The fused kernel on CUDA, its twin elsewhere; both give -1 for a row allowing no token.
    logits = logits.float()
    fn = kernels.sample if logits.is_cuda else reference_sample
    tokens = fn(logits, bitmask, *args.per_row)[0].tolist()
    _note_plain_choices(logits, args, tokens)
    return tokens


def _note_plain_choices(logits: torch.Tensor, args: SamplingArgs, tokens: list[int]) -> None:
    """For each row whose mask was steered to close its document in time, the token the
    plain mask would have given (the same draw: the same logits and seed), so the request
    knows whether steering changed its output."""
    for i, r in enumerate(args.reqs):
        plain = r.constraint.plain_mask if r.constraint is not None else None
        if plain is None or tokens[i] < 0:
            continue
        row, mask = logits[i : i + 1], plain[None].to(logits.device)
        if args.per_row is None:
            [token] = _greedy(row, mask)
        else:
            fn = kernels.sample if logits.is_cuda else reference_sample
            [token] = fn(row, mask, *(x[i : i + 1] for x in args.per_row))[0].tolist()
        r.constraint.note_plain_choice(token)


def _greedy(logits: torch.Tensor, bitmask: torch.Tensor | None) -> list[int]:
    """The argmax of each row of logits [B, V] over the tokens its bitmask row allows; -1 where
    that is -inf (no token allowed)."""
    if bitmask is not None and logits.is_cuda:  # masking all rows costs little there
        logits, bitmask = apply_bitmask(logits, bitmask), None
    ids = _argmax(logits)
    picked = logits.gather(1, ids[:, None])[:, 0]
    if bitmask is not None:
        # Where the mask allows a row's argmax (the first index of its maximum), the masked
        # argmax is the same token: only the other rows pay for unpacking their mask.
        words = bitmask.gather(1, (ids >> 5)[:, None])[:, 0]
        refused = ((words >> (ids & 31)) & 1) == 0
        if refused.any():
            redo = refused.nonzero()[:, 0]
            masked = apply_bitmask(logits[redo], bitmask[redo])
            ids[redo] = _argmax(masked)
            picked[redo] = masked.gather(1, ids[redo][:, None])[:, 0]
    return ids.masked_fill(torch.isneginf(picked), -1).tolist()


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy tokens of logits [B, V]: on the CPU the kernel where it is built (torch's
    argmax over a vocabulary is ~11x slower in float32, more in bfloat16; both take the first
    index on ties)."""
    lib = cpu.load() if logits.is_cpu else None
    if lib is not None and lib.supports(logits.dtype) and logits.stride(-1) == 1:
        return lib.argmax(logits)
    return logits.argmax(dim=-1)


def sampling_probs(logits: torch.Tensor, r: Request, grammar_vocab_size: int) -> torch.Tensor:
    """The distribution [V] `sample` draws r's next token from, given logits [V] (r must
    sample, temperature > 0): penalties, grammar mask, temperature and filters applied."""
    logits = _penalised(logits[None], [r])
    bitmask = _grammar_bitmask([r], grammar_vocab_size)
    if bitmask is not None:
        _close_thoughts(logits, [r], bitmask)
        logits = apply_bitmask(logits, bitmask.to(logits.device))
    p = r.params

    def one(value, dtype) -> torch.Tensor:
        return torch.tensor([value], dtype=dtype, device=logits.device)

    kept = filtered_logprobs(
        logits.float(),
        one(p.temperature, torch.float32),
        one(p.top_k, torch.int64),
        one(p.top_p, torch.float32),
        one(p.min_p, torch.float32),
    )
    return torch.softmax(kept[0], dim=-1)


def _penalised(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
    """logits with penalties, logit_bias and min_tokens applied (a float32 copy when any
    applies)."""
    if any(
        r.params.has_penalties or r.params.logit_bias or len(r.output_ids) < r.params.min_tokens
        for r in reqs
    ):
        logits = logits.to(torch.float32, copy=True)
        for row, r in enumerate(reqs):
            _apply_penalties(logits[row], r)
            if r.params.logit_bias:
                _apply_logit_bias(logits[row], r.params.logit_bias)
    return logits


def _grammar_bitmask(reqs: list[Request], grammar_vocab_size: int) -> torch.Tensor | None:
    """The grammars' bitmask rows of reqs on the CPU (None when none is constrained); an
    unconstrained row allows everything."""
    if all(r.constraint is None for r in reqs):
        return None
    bitmask = allocate_bitmask(len(reqs), grammar_vocab_size)
    for row, r in enumerate(reqs):
        # A constraint that fails leaves its row unmasked: output processing then fails r.
        if r.constraint is not None and r.constraint.fill_bitmask(bitmask[row], _tokens_left(r)):
            if r.trace is not None:
                r.trace.next_allowed = count_allowed(bitmask[row])
    return bitmask


def _tokens_left(r: Request) -> int | None:
    """The room left in r's output (the token sampled now included) when its constraint
    steers the text to close in time, else None."""
    if not r.params.close_documents:
        return None
    return r.max_new_tokens - len(r.output_ids)


# A soft thinking budget closes the thought where its end marker is among this many of the
# model's likeliest tokens.
CLOSE_AMONG = 5


def _close_thoughts(logits: torch.Tensor, reqs: list[Request], bitmask: torch.Tensor) -> None:
    """Force the end marker on each row whose soft thinking budget offers it and whose
    logits rank it among the CLOSE_AMONG likeliest (the thought ends at a point the model
    would end it itself)."""
    for row, r in enumerate(reqs):
        token = r.constraint.close_candidate() if r.constraint is not None else None
        if token is None or token >= logits.shape[-1]:
            continue
        k = min(CLOSE_AMONG, logits.shape[-1])
        if token in logits[row].topk(k).indices.tolist():
            bitmask[row].zero_()
            set_bits(bitmask[row], [token])


def _apply_penalties(logits: torch.Tensor, r: Request) -> None:
    """In place on one row [V]. Conventions as in vLLM/OpenAI: repetition (CTRL-style, over
    prompt and output) divides positive logits and multiplies negative ones; frequency and
    presence subtract per output occurrence / once."""
    p, vocab = r.params, logits.numel()
    if len(r.output_ids) < p.min_tokens:
        logits[[t for t in r.stop_ids if t < vocab]] = float("-inf")
    if p.repetition_penalty != 1:
        seen = torch.tensor(r.token_ids, device=logits.device).unique()
        seen = seen[seen < vocab]
        vals = logits[seen]
        logits[seen] = torch.where(
            vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
        )
    if (p.frequency_penalty or p.presence_penalty) and r.output_ids:
        counts = torch.bincount(torch.tensor(r.output_ids, device=logits.device), minlength=vocab)
        counts = counts[:vocab].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _apply_logit_bias(logits: torch.Tensor, bias: dict[int, float]) -> None:
    """In place on one row [V]: OpenAI's logit_bias, each value added to its token's logit
    (ids past V, which Engine.prepare refuses, are skipped)."""
    vocab = logits.numel()
    kept = [(t, b) for t, b in bias.items() if 0 <= t < vocab]
    if kept:
        ids = torch.tensor([t for t, _ in kept], device=logits.device)
        logits[ids] += torch.tensor([b for _, b in kept], dtype=logits.dtype, device=logits.device)


def record_tokens(
    logits: torch.Tensor, reqs: list[Request], results: list, tokens: list[int]
) -> None:
    """Give each result (a StepResult) its token, with the token's logprob and top
    alternatives when its request asked for them (logits [B, V], row b for reqs[b])."""
    # A row that allowed no token (-1) has nothing to report: its request fails.
    want_logprobs = [i for i, r in enumerate(reqs) if r.params.wants_logprobs and tokens[i] >= 0]
    if want_logprobs:
        logp = torch.log_softmax(logits[want_logprobs].float(), dim=-1)
        for row, i in enumerate(want_logprobs):
            results[i].logprob = float(logp[row, tokens[i]])
            k = reqs[i].params.top_logprobs
            if k:
                [results[i].top_logprobs] = top_logprobs(logp[row : row + 1], k)
    for res, t in zip(results, tokens, strict=True):
        res.token = t


def top_logprobs(logp: torch.Tensor, k: int) -> list[dict[int, float]]:
    """Each row's k most likely token ids with their logprobs, best first."""
    top = logp.topk(k)
    return [
        dict(zip(ids, values, strict=True))
        for ids, values in zip(top.indices.tolist(), top.values.tolist(), strict=True)
    ]
