"""Token bytes: joining the bytes of a text's tokens must give the text's UTF-8 back."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from braid import grammars

TEXTS = ["Hello, world!", "  indented\n\ttabs", "café naïve", "数据 🙂 ok", '{"k": [1, 2.5]}']


@pytest.fixture(scope="module")
def byte_level(default_model_path):
    return AutoTokenizer.from_pretrained(default_model_path)


def test_byte_level_round_trip(byte_level):
    vocab = grammars.build_vocabulary(byte_level, {byte_level.eos_token_id})
    assert vocab.size == len(byte_level)
    for text in TEXTS:
        ids = byte_level.encode(text, add_special_tokens=False)
        assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode()
    # A character split across tokens: some token holds only part of it.
    partial = [b for b in vocab.token_bytes if b and not _is_utf8(b)]
    assert partial
    for special in byte_level.all_special_ids:
        assert vocab.token_bytes[special] is None
    assert byte_level.eos_token_id in vocab.eos_token_ids


def _sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-2-style tokenizer: Metaspace (U+2581 for spaces), byte fallback <0xNN>."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "a", "b", "c", "f", "▁a", "▁b", "ab", "▁ab", "é", "ca", "caf", "▁caf"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [("▁", "a"), ("▁", "b"), ("a", "b"), ("▁a", "b"), ("c", "a")]
    merges += [("ca", "f"), ("▁", "caf")]
    model = models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def test_sentencepiece_round_trip():
    tokenizer = _sentencepiece_tokenizer()
    vocab = grammars.build_vocabulary(tokenizer)
    assert vocab.token_bytes[tokenizer.convert_tokens_to_ids("▁ab")] == b" ab"
    assert vocab.token_bytes[tokenizer.convert_tokens_to_ids("<0xC3>")] == b"\xc3"
    assert vocab.eos_token_ids == {tokenizer.eos_token_id}
    for text in ("ab ab", "abc d", "café ☃"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        # Metaspace writes the first word with a leading space; the text is the rest.
        assert b"".join(vocab.token_bytes[i] for i in ids) == b" " + text.encode()


def test_vocabularies_differ_in_fingerprint(byte_level):
    a = grammars.build_vocabulary(byte_level, {byte_level.eos_token_id})
    b = grammars.build_vocabulary(byte_level, {byte_level.eos_token_id, 0})
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint == grammars.build_vocabulary(byte_level).fingerprint


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_compile_takes_a_tokenizer_and_builds_its_vocabulary_once(tokenizer, vocab, feeds):
    from braid.grammars.compiling.compiler import as_vocabulary

    built = as_vocabulary(tokenizer)
    assert as_vocabulary(tokenizer) is built  # cached per tokenizer
    assert built.fingerprint == vocab.fingerprint  # what build_vocabulary gives
    grammar = grammars.compile(grammars.Regex("[0-9]{2}"), tokenizer)
    assert grammar is grammars.compile(grammars.Regex("[0-9]{2}"), vocab)
    assert feeds(grammar, "42") and not feeds(grammar, "4")
    compiler = grammars.GrammarCompiler(tokenizer)
    try:
        assert compiler.vocab is built
        assert feeds(compiler.submit(grammars.Regex("[a-c]+")).result(), "abc")
    finally:
        compiler.close()


def test_structures_over_a_vocabulary_are_built_once_while_it_lives():
    """Kept per vocabulary, however many a process holds (an LRU of four rebuilt them for
    each engine's idle measure once five were alive), and freed with it."""
    import gc
    import weakref

    from braid.grammars.vocabulary import TokenVocabulary, per_vocabulary

    builds = []

    @per_vocabulary
    def structure(vocab: TokenVocabulary) -> list:
        builds.append(vocab.fingerprint)
        return [len(vocab.token_bytes)]

    vocabs = [TokenVocabulary((b"a",) * (i + 1), frozenset(), f"v{i}") for i in range(6)]
    first = [structure(v) for v in vocabs]
    assert [structure(v) for v in vocabs] == first
    assert all(a is b for a, b in zip(first, map(structure, vocabs), strict=True))
    assert builds == [f"v{i}" for i in range(6)]
    gone = weakref.ref(vocabs.pop())
    gc.collect()
    assert gone() is None  # the structure does not keep its vocabulary alive
