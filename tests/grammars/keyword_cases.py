"""What the keyword test files share (imported by name, as conftest): the drafts' `$schema`
URIs, and the check of one implemented keyword's case against jsonschema's judgement."""

from __future__ import annotations

import functools
import json
import random

import jsonschema
import numpy as np
import torch
from jsonschema.validators import validator_for

from braid import grammars
from braid.runtime.cli.bench.grammar_cases import serialize

D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"


def case_ids(cases: dict[str, list[tuple]]) -> list[tuple[str, int]]:
    """(keyword, index) of every case, for parametrize."""
    return [(k, i) for k, listed in cases.items() for i in range(len(listed))]


def check_case(case: tuple, seed: str, vocab, feeds) -> None:
    """One case, (schema, instances that must get through, instances that must be refused):
    every invalid instance refused by the masks, every valid one admitted (written as
    braid writes JSON: compact, properties in the schema's order), and seeded random walks
    over the masks writing documents jsonschema accepts."""
    schema, valid, invalid = case
    judge = _judge(schema)
    grammar = grammars.compile(grammars.JsonSchema.of(schema), vocab)
    for value in invalid:
        assert not judge.is_valid(value), f"mislabelled: {value!r} is valid"
        assert not feeds(grammar, serialize(value, schema)), f"invalid {value!r} admitted"
    for value in valid:
        assert judge.is_valid(value), f"mislabelled: {value!r} is invalid"
        assert feeds(grammar, serialize(value, schema)), f"valid {value!r} refused"
    _check_walks(grammar, judge, random.Random(seed))


def _judge(schema):
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=jsonschema.FormatChecker())


def _check_walks(grammar, judge, rng: random.Random, walks: int = 3) -> None:
    """Random walks over the masks (closing strings and containers once long) must write
    documents the judge accepts."""
    vocab = grammar.vocab
    eos = min(vocab.eos_token_ids)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    closing = _closers(vocab)
    for _ in range(walks):
        matcher, out = grammar.matcher(), b""
        for step in range(100):
            matcher.fill_bitmask(row)
            allowed = _allowed(row, vocab.size)
            assert allowed.any(), f"dead end after {out!r}"
            if allowed[eos] and (allowed.sum() == 1 or rng.random() < 0.5):
                break
            allowed[eos] = False
            if step > 40 and (allowed & closing).any():
                allowed &= closing
            choices = np.flatnonzero(allowed)
            token = int(choices[rng.randrange(len(choices))])
            assert matcher.accept_token(token)
            out += vocab.token_bytes[token]
        else:
            continue
        value = json.loads(out.decode("utf-8"))
        assert judge.is_valid(value), f"the masks wrote {out!r}, which is invalid"


def _allowed(row: torch.Tensor, size: int) -> np.ndarray:
    """A bitmask row as one bool per token (bit t % 32 of word t // 32, little-endian)."""
    return np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:size].astype(bool)


@functools.cache
def _closers(vocab) -> np.ndarray:
    """Tokens that end a string, an array or an object (walks take them once long)."""
    return np.array([bool(b and set(b) & set(b'"]}')) for b in vocab.token_bytes])
