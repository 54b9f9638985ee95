"""The tokenizer's vocabulary as raw bytes: what every grammar walks over.

Grammars constrain text, but the model emits tokens, so each token id needs the exact bytes
it appends to the output. Byte-level BPE vocabularies (GPT-2, Llama 3, SmolLM2, Qwen) spell
bytes as printable unicode stand-ins; SentencePiece vocabularies (Llama 2, Mistral) spell a
space as U+2581 and raw bytes as `<0xNN>`. A token may hold part of a multi-byte character,
which is why this works on bytes and never on str.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # the compile worker unpickles vocabularies without importing transformers
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """`token_bytes[id]` is what token `id` appends to the text, or None for tokens a grammar
    never allows (special/control tokens). `eos_token_ids` are allowed exactly where the
    grammar accepts. `size` is the tokenizer's length; model rows wider than it (a padded
    lm_head) are never allowed under a constraint."""

    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: frozenset[int]
    fingerprint: str  # identifies the vocabulary in cache keys

    @property
    def size(self) -> int:
        return len(self.token_bytes)


_Built = TypeVar("_Built")


def per_vocabulary(
    build: Callable[[TokenVocabulary], _Built],
) -> Callable[[TokenVocabulary], _Built]:
    """`build(vocab)` once per vocabulary, kept while the vocabulary lives. (An LRU of a few
    entries thrashed where a process holds more vocabularies than it keeps, several engines'
    in one process: every idle compile thread's measure rebuilt a vocabulary's structures.)
    What `build` returns must not refer to the vocabulary, or it would never be freed."""
    built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(build)
    def get(vocab: TokenVocabulary) -> _Built:
        with lock:
            found = built.get(vocab)
        if found is None:  # built outside the lock; a racing build's result is dropped
            found = build(vocab)
            with lock:
                found = built.setdefault(vocab, found)
        return found

    return get


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable stand-in char -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is not None and "ByteLevel" in repr(decoder):
        return True
    vocab = tokenizer.get_vocab()
    return "Ġ" in "".join(list(vocab)[:5000]) and "▁" not in "".join(list(vocab)[:5000])


def _byte_level_bytes(token: str) -> bytes | None:
    decoder = _byte_decoder()
    try:
        return bytes(decoder[c] for c in token)
    except KeyError:
        return None  # not a byte-level spelling: an added token written as plain text


def _sentencepiece_bytes(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("▁", " ").encode("utf-8")


def build_vocabulary(
    tokenizer: PreTrainedTokenizerBase, eos_token_ids: set[int] | frozenset[int] = frozenset()
) -> TokenVocabulary:
    """Bytes of every token id in `tokenizer` (ids 0 .. len(tokenizer) - 1)."""
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = set(tokenizer.all_special_ids)
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items()}
    byte_level = _is_byte_level(tokenizer)
    eos = set(eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)

    out: list[bytes | None] = []
    for i, token in enumerate(tokens):
        if token is None or i in special or i in eos or (i in added and added[i].special):
            out.append(None)
        elif i in added:
            out.append(added[i].content.encode("utf-8"))  # added tokens are stored verbatim
        elif byte_level:
            out.append(_byte_level_bytes(token))
        else:
            out.append(_sentencepiece_bytes(token))
    digest = hashlib.sha256()
    for b in out:
        digest.update(b"\xff" if b is None else len(b).to_bytes(2, "little") + b)
    digest.update(repr(sorted(eos)).encode())
    return TokenVocabulary(tuple(out), frozenset(eos), digest.hexdigest()[:16])
