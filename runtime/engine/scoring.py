"""Scoring continuations of a prefix (what `select` ranks choices by): one request per
continuation, all sharing the prefix's tokens, which the radix cache computes once.

Lives in the runtime so the local backend and the server's scoring endpoint run the very
same alignment, and a remote program selects exactly what a local one does.
"""

from __future__ import annotations

from braid.runtime.kvcache.radix_cache import common_prefix_length
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.text.tokenizer import adds_bos


def score_requests(
    tokenizer, eos_token_ids: set[int], prefix: str, continuations: list[str]
) -> list[tuple[list[int], SamplingParams]]:
    """One request per continuation: the tokens of prefix + continuation, with params asking
    only for the logprobs of the tokens past those every continuation shares with the
    prefix."""
    if not continuations:
        raise ValueError("score: give at least one continuation")
    start_ids = _document_start(tokenizer, eos_token_ids, prefix)
    prefix_ids = start_ids + tokenizer.encode(prefix)
    full = [start_ids + tokenizer.encode(prefix + c) for c in continuations]
    # Tokens at the boundary may merge ("Answer:" + " Paris" -> ":" " Paris" or
    # ": Paris"): everything from the first position where any continuation departs
    # from the prefix's tokens is scored, the same span of text for every choice.
    start = min(common_prefix_length(ids, prefix_ids) for ids in full)
    if start == 0:
        raise ValueError("select needs text before the choices to score them against")
    params = SamplingParams(max_tokens=0, prompt_logprobs_from=start)
    return [(ids, params) for ids in full]


def _document_start(tokenizer, eos_token_ids: set[int], prefix: str) -> list[int]:
    """Scoring needs at least one token of context: with an empty prefix (an unconditional
    score) the document starts with BOS, or EOS where there is none."""
    if prefix:
        return []
    if adds_bos(tokenizer):
        return []  # encode adds it
    start = tokenizer.bos_token_id
    return [start if start is not None else min(eos_token_ids)]
