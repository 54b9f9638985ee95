"""Incremental detokenization and stop-string and stop-regex matching."""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from braid.grammars.regex.char_regex import CharRegex
from braid.runtime.output.detokenizer import IncrementalDetokenizer
from braid.runtime.output.stop import StopMatcher

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


def feed(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.add(p) for p in pieces if not matcher.stopped)
    return out + matcher.flush()


def test_stop_string_across_pieces():
    m = StopMatcher(("END",))
    assert feed(m, ["abc E", "N", "D more"]) == "abc "
    assert m.stopped


def test_partial_stop_is_held_back_then_released():
    m = StopMatcher(("###",))
    assert m.add("one #") == "one "  # "#" could still begin "###"
    assert m.add("#") == ""
    assert m.add("x two") == "##x two"
    assert not m.stopped
    assert m.add("#") == ""
    assert m.flush() == "#"


def test_earliest_of_several_stop_strings_wins():
    m = StopMatcher(("\n\n", "Q:"))
    assert feed(m, ["A: yes Q: next\n\n"]) == "A: yes "


def test_no_stop_strings_streams_everything():
    m = StopMatcher(())
    assert m.add("abc") == "abc" and m.flush() == ""


def first_completed_match(pattern: str, text: str) -> int | None:
    """Reference for stop regexes, by brute force with `re`: the start of the match that is
    complete earliest in the text (the leftmost start among those ending there)."""
    for end in range(1, len(text) + 1):
        starts = [b for b in range(end) if re.fullmatch(pattern, text[b:end])]
        if starts:
            return min(starts)
    return None


STOP_REGEXES = [r"[0-9]+\.", r"\n\n", r"a.*z", r"END|ab+c", r"(ab)+\n", r"[^a-z ]{2}"]


@given(
    pattern=st.sampled_from(STOP_REGEXES),
    text=st.lists(
        st.sampled_from(["a", "b", "cz", " ", "1", "9.", "\n", "EN", "D", "ab"]), max_size=12
    ).map("".join),
    cuts=st.lists(st.integers(0, 24), max_size=6),
)
def test_stop_regex_matches_re_at_any_piece_boundaries(pattern, text, cuts):
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    m = StopMatcher((), (CharRegex(pattern),))
    streamed = []
    for piece in pieces:
        if not m.stopped:
            streamed.append(m.add(piece))
    streamed.append(m.flush())
    start = first_completed_match(pattern, text)
    assert m.stopped == (start is not None)
    assert "".join(streamed) == (text if start is None else text[:start])


@pytest.mark.parametrize("pattern", [r"[^a-z ]{2}", r"x[^a]+y", r".é", r"[^\n]+\n"])
def test_a_stop_regex_back_from_the_compile_worker_takes_characters_it_does_not_list(pattern):
    """Stop regexes are compiled in the worker and pickled back: interegular's marker for the
    characters a pattern does not list is found by identity, which a copy lacks, so a negated
    class took none of them once unpickled."""
    regex = pickle.loads(pickle.dumps(CharRegex(pattern)))
    for text in ("xéy", "é€😀", "ab\n", "12é!", "xaé€y\n"):
        m = StopMatcher((), (regex,))
        out = m.add(text) + m.flush()
        start = first_completed_match(pattern, text)
        assert out == (text if start is None else text[:start]), (pattern, text)


def test_partial_stop_regex_is_held_back_then_released():
    m = StopMatcher((), (CharRegex(r"Q[0-9]+:"),))
    assert m.add("hi Q") == "hi "  # "Q" could begin a match
    assert m.add("12") == ""
    assert m.add(" no") == "Q12 no"
    assert m.add(" Q3:") == " "  # the text before the stop, the request's last
    assert m.stopped and m.flush() == ""


def test_stop_string_and_regex_together():
    m = StopMatcher(("END",), (CharRegex(r"a.*z"),))
    assert feed(m, ["xxa", "bcE", "ND"]) == "xxabc"


@pytest.mark.parametrize(
    "pattern, problem",
    [
        ("(", "missing )"),
        ("^x", "not supported"),
        ("a(?=b)", "lookarounds"),
        (r"(a)\1", "not supported"),
        ("x*", "matches the empty string"),
    ],
)
def test_bad_stop_regex_is_refused_by_name(pattern, problem):
    from braid.runtime import SamplingParams

    with pytest.raises(ValueError, match="stop_regex") as e:
        SamplingParams(stop_regex=[pattern])
    assert problem in str(e.value)
