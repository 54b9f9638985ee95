"""Incremental detokenization and stop-string matching."""

from __future__ import annotations

import pytest

from runtime.detokenizer import IncrementalDetokenizer
from runtime.stop import StopStringMatcher

TEXTS = [
    "Hello, world! How are you?",
    "naïve café — 東京タワー 🚀🎉 done",
    "  leading spaces\n\nand\ttabs  ",
    "<|im_start|>assistant\nspecial tokens in between<|im_end|>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tokenizer, text):
    prompt = tokenizer.encode("Prompt:")
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.add([t]) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_split_multibyte_character_is_held_back(tokenizer):
    ids = tokenizer.encode("🚀")
    assert len(ids) > 1, "the emoji should span several byte tokens"
    detok = IncrementalDetokenizer(tokenizer, [])
    assert [detok.add([t]) for t in ids] == [""] * (len(ids) - 1) + ["🚀"]


def feed(matcher: StopStringMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.add(p) for p in pieces if not matcher.stopped)
    return out + matcher.flush()


def test_stop_string_across_pieces():
    m = StopStringMatcher(("END",))
    assert feed(m, ["abc E", "N", "D more"]) == "abc "
    assert m.stopped


def test_partial_stop_is_held_back_then_released():
    m = StopStringMatcher(("###",))
    assert m.add("one #") == "one "  # "#" could still begin "###"
    assert m.add("#") == ""
    assert m.add("x two") == "##x two"
    assert not m.stopped
    assert m.add("#") == ""
    assert m.flush() == "#"


def test_earliest_of_several_stop_strings_wins():
    m = StopStringMatcher(("\n\n", "Q:"))
    assert feed(m, ["A: yes Q: next\n\n"]) == "A: yes "


def test_no_stop_strings_streams_everything():
    m = StopStringMatcher(())
    assert m.add("abc") == "abc" and m.flush() == ""
