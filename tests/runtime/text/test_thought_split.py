"""Outputs split into thought and answer as they stream (runtime/text/thought_split.py):
for every way of cutting the text into chunks the events add up to what a reference parser
(a regular expression over the whole text) finds, for think tags and harmony's channels."""

from __future__ import annotations

import re

import pytest

from braid.runtime.text.thought_split import HarmonyReader, ThinkReader


def collect(reader, text: str, step: int) -> dict:
    events = []
    for i in range(0, len(text), step):
        events += reader.feed(text[i : i + step])
    events += reader.finish()
    out: dict = {"reasoning": "", "text": "", "calls": []}
    for e in events:
        if e[0] == "call":
            out["calls"].append((e[1], e[2]))
        else:
            out[e[0]] += e[1]
    return out


def think_reference(text: str, opening: str) -> dict:
    """The whole text split by one regular expression: the thought between the tags (the
    opening tag given by the prompt when it opened the thought), the answer after."""
    if opening == "thinking":
        text = "<think>" + text
    m = re.fullmatch(r"\s*<think>(.*?)(?:</think>(.*))?", text, re.S)
    if m is None or opening == "off":
        return {"reasoning": "", "text": text.lstrip(), "calls": []}
    return {"reasoning": m[1].strip(), "text": (m[2] or "").lstrip(), "calls": []}


THINK_CASES = [
    ("maybe", '<think>\nI should say yes.\n</think>\n\n{"answer": true}'),
    ("maybe", '\n<think>two\n\nlines</think>{"a": 1}'),
    ("maybe", "no thought at all, < and </ inside"),
    ("maybe", "<think>a thought cut off by max_tokens"),
    ("thinking", "the prompt opened it </thi and more\n</think>\n\nanswer"),
    ("thinking", "</think>answer at once"),
    ("off", "<think>literal tags are text here</think>"),
]


@pytest.mark.parametrize("opening, text", THINK_CASES)
@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_think_tags_split_as_the_reference_does(opening, text, step):
    reader = ThinkReader("<think>", "</think>", opening, ())
    assert collect(reader, text, step) == think_reference(text, opening)


def test_a_call_marker_closes_a_thought():
    text = "<think>\nI will look it up <tool_call>\n{}\n</tool_call>"
    for step in (1, 4, 100):
        out = collect(ThinkReader("<think>", "</think>", "maybe", ("<tool_call>",)), text, step)
        assert out["reasoning"] == "I will look it up"
        assert out["text"] == "<tool_call>\n{}\n</tool_call>"


def harmony_reference(text: str) -> dict:
    """Each message's header and body found by one regular expression over the whole text."""
    out: dict = {"reasoning": "", "text": "", "calls": []}
    ends = r"(?:<\|end\|>|<\|call\|>|<\|return\|>|$)"
    message = r"(?:<\|start\|>assistant)?(.*?)<\|message\|>(.*?)" + ends
    for header, body in re.findall(message, text, re.S):
        channel = re.search(r"<\|channel\|>(\w+)", header)[1]
        to = re.search(r"to=functions\.(\w+)", header)
        if to:
            out["calls"].append((to[1], body))
        elif channel == "analysis":
            out["reasoning"] += body
        else:
            out["text"] += body
    return out


HARMONY_CASES = [
    "<|channel|>analysis<|message|>User asks. Answer.<|end|><|start|>assistant<|channel|>final"
    '<|message|>{"answer": true}',
    "<|channel|>final<|message|>Straight to it.",
    "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>two"
    "<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
    " to=functions.f<|channel|>commentary json<|message|>{}",
]


@pytest.mark.parametrize("text", HARMONY_CASES)
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_harmony_channels_split_as_the_reference_does(text, step):
    assert collect(HarmonyReader("maybe"), text, step) == harmony_reference(text)


def test_harmony_openings():
    assert collect(HarmonyReader("thinking"), "Thinking.<|end|>", 1)["reasoning"] == "Thinking."
    assert collect(HarmonyReader("off"), "The answer.", 3)["text"] == "The answer."
    assert collect(HarmonyReader("maybe"), "no header", 2)["text"] == "no header"
