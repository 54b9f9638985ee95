"""Grammar masks in sampling: a constrained batch mixed with unconstrained rows and a row whose
matcher raises (its request's constraint error set, its row sampled unmasked) samples what each
row alone does; greedy rows masked only where the mask refuses their argmax pick what
masking every row picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from braid import grammars
from braid.grammars.matcher import Matcher, MatcherError
from braid.runtime import SamplingParams
from braid.runtime.constraint.state import ConstraintState, JumpForward
from braid.runtime.executor.sampler import _greedy, prepare_sampling, sample, sample_prepared

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class _Failing(Matcher):
    """Gives out at its first mask, as a lazy automaton past its memory budget does."""

    def fill_bitmask(self, row: torch.Tensor) -> None:
        raise MatcherError("out of states")

    def accept_token(self, token_id: int) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False

    def rollback(self, n: int) -> None:
        pass

    def jump_forward(self) -> str:
        return ""


def _requests(vocab, temperature: float) -> list[SimpleNamespace]:
    """Regex, JSON and choices rows, unconstrained ones (one with penalties and min_tokens),
    and a row whose matcher raises."""
    regex = grammars.compile(grammars.Regex(r"[0-9]{2,5}"), vocab)
    schema = grammars.compile(grammars.JsonSchema.of(SCHEMA, whitespace=grammars.COMPACT), vocab)
    choices = grammars.compile(grammars.Choices(("yes", "no")), vocab)
    t = temperature
    rows = [
        (regex.matcher(), SamplingParams(temperature=t, seed=1)),
        (None, SamplingParams(temperature=0, seed=2)),
        (schema.matcher(), SamplingParams(temperature=t, top_k=50, seed=3)),
        (_Failing(), SamplingParams(temperature=t, seed=4)),
        (None, SamplingParams(temperature=t, repetition_penalty=1.3, min_tokens=4, seed=5)),
        (choices.matcher(), SamplingParams(temperature=t, top_p=0.9, seed=6)),
    ]
    jump = JumpForward(None, vocab, enabled=False)  # masks only: nothing is accepted here
    return [
        SimpleNamespace(
            params=params,
            constraint=None if matcher is None else ConstraintState(matcher, jump),
            seed=params.seed,
            token_ids=[1, 2, 3, 7 * i],
            output_ids=[7 * i],
            max_new_tokens=params.max_tokens,
            stop_ids={min(vocab.eos_token_ids)},
            trace=None,
        )
        for i, (matcher, params) in enumerate(rows)
    ]


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_mixed_batch_with_a_failing_matcher(vocab, temperature):
    torch.manual_seed(0)
    logits = torch.randn(6, vocab.size) * 4
    reqs = _requests(vocab, temperature)
    got = sample_prepared(logits, prepare_sampling(reqs, vocab.size, logits.device))
    alone = [
        sample(logits[i : i + 1], [r], vocab.size)[0]
        for i, r in enumerate(_requests(vocab, temperature))
    ]
    assert got == alone
    errors = [r.constraint and r.constraint.error for r in reqs]
    assert errors == [None, None, None, "out of states", None, None]
    # The failing row sampled unmasked: as an unconstrained request with its params.
    unmasked = _requests(vocab, temperature)[3]
    unmasked.constraint = None
    assert got[3] == sample(logits[3:4], [unmasked], vocab.size)[0]
    # The constrained rows kept to their grammars.
    assert vocab.token_bytes[got[0]].isdigit()
    assert vocab.token_bytes[got[2]].startswith(b"{")
    assert any(c.startswith(vocab.token_bytes[got[5]]) for c in (b"yes", b"no"))


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [B, V] -> the int32 bitmask [B, ceil(V / 32)] allowing those tokens."""
    rows, vocab = allowed.shape
    bits = torch.nn.functional.pad(allowed, (0, -vocab % 32)).view(rows, -1, 32).long()
    words = (bits << torch.arange(32)).sum(-1)  # uint32 values
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_masks_only_the_rows_that_need_it(dtype):
    torch.manual_seed(1)
    rows, vocab = 64, 1000
    logits = (torch.randn(rows, vocab) * 3).to(dtype)
    logits[5] = float("-inf")  # nothing to pick, whatever the mask allows
    logits[6, 17] = logits[6, 900] = 99  # a tie: the first index wins
    allowed = torch.rand(rows, vocab) < 0.5
    allowed[:16] = True  # every argmax allowed
    allowed[16:20] = False  # nothing allowed
    argmax = logits.float().argmax(-1)
    allowed[torch.arange(20, 40), argmax[20:40]] = False  # the argmax refused, others not
    allowed[6, 17], allowed[6, 900] = False, True  # the tie's first index refused
    masked = logits.masked_fill(~allowed, float("-inf"))
    ids = masked.float().argmax(-1)
    picked = masked.gather(1, ids[:, None])[:, 0]
    expected = ids.masked_fill(torch.isneginf(picked), -1).tolist()
    assert _greedy(logits, _pack(allowed)) == expected
    assert expected[5] == expected[16] == -1 and expected[6] == 900
