"""Grammar tests share the default tokenizer, its vocabulary, and one way to feed text."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import grammars
from grammars.matcher import allowed_token_ids


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="session")
def vocab(tokenizer):
    return grammars.build_vocabulary(tokenizer, {tokenizer.eos_token_id})


@pytest.fixture(scope="session")
def feeds(tokenizer):
    """feeds(grammar, text): every token of `text` in the mask before it is accepted, then
    EOS, and the matcher terminated; False at the first refusal."""

    def feed_text(grammar, text: str) -> bool:
        matcher = grammar.matcher()
        row = grammars.allocate_bitmask(1, grammar.vocab.size)[0]
        for token in [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]:
            matcher.fill_bitmask(row)
            if token not in allowed_token_ids(row):
                return False
            assert matcher.accept_token(token), "allowed by the mask, refused by accept_token"
        return matcher.is_terminated()

    return feed_text


@pytest.fixture(scope="session")
def check_rollback(tokenizer):
    """check_rollback(grammar, text): after taking `text`'s tokens, rolling back k of them
    (and EOS) gives the masks seen before, and the tokens can be taken again."""

    def check(grammar, text: str) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        eos = tokenizer.eos_token_id
        matcher = grammar.matcher()
        rows = grammars.allocate_bitmask(len(ids) + 1, grammar.vocab.size)
        for i, token in enumerate(ids):
            matcher.fill_bitmask(rows[i])
            assert matcher.accept_token(token)
        matcher.fill_bitmask(rows[-1])
        if eos in allowed_token_ids(rows[-1]):
            assert matcher.accept_token(eos) and matcher.is_terminated()
            matcher.rollback(1)
            assert matcher.accept_token(eos)
            matcher.rollback(1)
        row = grammars.allocate_bitmask(1, grammar.vocab.size)[0]
        for back in (1, 2, len(ids)):
            matcher.rollback(back)
            matcher.fill_bitmask(row)
            assert row.equal(rows[len(ids) - back])
            for token in ids[len(ids) - back :]:
                assert matcher.accept_token(token)
        with pytest.raises(ValueError, match="roll back"):
            matcher.rollback(len(ids) + 1)

    return check
