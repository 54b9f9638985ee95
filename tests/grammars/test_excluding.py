"""Free text scanned for words (grammars/regex/excluding.py): its regexes against Python's `re`
and a brute-force reference that looks for the words in the text itself; compiled to token
masks by braid's regex path."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid import grammars
from braid.grammars.regex.excluding import MAX_REGEX_CHARS, excluding, scan

# Few letters, so that words overlap each other and themselves (borders, suffixes, infixes).
LETTERS = "ab<"
words = st.lists(st.text(st.sampled_from(LETTERS), min_size=1, max_size=4), min_size=1, max_size=4)
texts = st.text(st.sampled_from(LETTERS + "x\n"), max_size=12)
# Words a structural tag scans for: end markers and call triggers.
MARKERS = ["</think>", "<tool_call>", "<|channel|>", "<|end|>", "[TOOL_CALLS]", "<function="]


def first_word(text: str, triggers: list[str], excluded: list[str]) -> tuple[str, int] | None:
    """(the word found first, where it ends) reading `text` left to right; "excluded" if an
    excluded word ends there (it wins over a trigger, then the longest trigger does)."""
    for end in range(1, len(text) + 1):
        ending = [w for w in triggers + excluded if text[:end].endswith(w)]
        if any(w in excluded for w in ending):
            return "excluded", end
        if ending:
            return max(ending, key=len), end
    return None


@settings(max_examples=300, deadline=None)
@given(words, texts)
def test_excluding_matches_exactly_the_texts_without_the_words(words, text):
    assert bool(re.fullmatch(excluding(words), text)) == (not any(w in text for w in words))


@settings(max_examples=300, deadline=None)
@given(words, st.integers(0, 4), texts)
def test_each_trigger_ends_the_text_where_it_first_occurs(words, split, text):
    triggers, excluded = words[:split], words[split:]
    scanned = scan(triggers, excluded)
    found = first_word(text, triggers, excluded)
    assert bool(re.fullmatch(scanned.free, text)) == (found is None)
    for trigger in triggers:
        expected = found == (trigger, len(text))
        assert bool(trigger in scanned.until and re.fullmatch(scanned.until[trigger], text)) == (
            expected
        ), (trigger, text)


def test_every_short_text_against_the_reference():
    """Exhaustively, for sets where words are suffixes and infixes of others."""
    cases = [(["ab", "b"], []), (["b"], ["abc"]), (["aa"], ["a<"]), (["<a"], ["a<a", "<"])]
    for triggers, excluded in cases:
        scanned = scan(triggers, excluded)
        for n in range(7):
            for letters in itertools.product(LETTERS + "c", repeat=n):
                text = "".join(letters)
                found = first_word(text, triggers, excluded)
                assert bool(re.fullmatch(scanned.free, text)) == (found is None), text
                for t in triggers:
                    hit = t in scanned.until and re.fullmatch(scanned.until[t], text)
                    assert bool(hit) == (found == (t, len(text))), (t, text)


def test_a_trigger_that_holds_an_excluded_word_is_never_reached():
    scanned = scan(["<ab>"], ["a"])
    assert "<ab>" not in scanned.until
    assert re.fullmatch(scanned.free, "<b>") and not re.fullmatch(scanned.free, "<a")


def test_marker_regexes_stay_small_and_exact():
    regex = excluding(MARKERS)
    assert len(regex) < 20_000
    pattern = re.compile(regex)
    for text in ["", "plain text\n", "<think>", "</think", "<|chan|>", "<tool_call", "[TOOL"]:
        assert pattern.fullmatch(text), text
    for marker in MARKERS:
        for text in (marker, f"a{marker}", f"{marker}b", f"<<{marker}"):
            assert not pattern.fullmatch(text), text


def test_empty_words_and_too_large_sets_are_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        excluding(["a", ""])
    # Long words over two letters, overlapping everywhere: the regex would pass its bound.
    words = ["bbabbbbbba", "abaababaab", "babbbabbba", "aababbabaa", "aaabaabbab"]
    with pytest.raises(ValueError, match=str(MAX_REGEX_CHARS)):
        excluding(words)


def test_the_regex_compiles_to_masks(vocab, feeds):
    grammar = grammars.compile(grammars.Regex(excluding(["</think>", "<tool_call>"])), vocab)
    for text in ["I think so.", "a < b and </thin k>", "<tool_cal"]:
        assert feeds(grammar, text), text
    for text in ["done</think>", "<tool_call>{}", "x</think>y"]:
        assert not feeds(grammar, text), text
