"""The scripted reasoning models of tests/reasoning_models.py: transformers' greedy decoding
and braid's Engine write each script, `also` makes a runner-up, an unwritable script is
refused; the four chat templates render as the real ones do (and as braid's renderer does)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import reasoning_models
import torch
import transformers
from reasoning_models import QUESTION, SCRIPTS, family_tokenizer, render, scripted_model

from braid.runtime import Engine, SamplingParams
from braid.runtime.text import template_render

scripted_models = reasoning_models.scripted_models

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "A city."}},
            "required": ["city"],
        },
    },
}
CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, default_model_path):
    """family -> its tokenizer."""
    return {
        family: transformers.AutoTokenizer.from_pretrained(
            family_tokenizer(family, default_model_path, tmp_path_factory.mktemp(family))
        )
        for family in reasoning_models.FAMILIES
    }


# ---- the scripted models ---------------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPTS)
def test_transformers_greedy_writes_the_script_then_eos(scripted_models, name):
    m = scripted_models(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(m.path)
    out = model.generate(torch.tensor([m.prompt_ids]), max_new_tokens=64, do_sample=False)
    assert out[0, len(m.prompt_ids) :].tolist() == m.output_ids
    tokenizer = transformers.AutoTokenizer.from_pretrained(m.path)
    assert tokenizer.decode(m.script_ids) == SCRIPTS[name].text


@pytest.mark.slow  # an engine per script; the reasoning tests run these engines anyway
@pytest.mark.parametrize("name", SCRIPTS)
def test_the_engine_writes_the_script_greedily(scripted_models, name):
    m = scripted_models(name)
    engine = Engine(model=str(m.path), device="cpu", dtype="float32", max_kv_tokens=4096)
    try:
        out = engine.generate(m.prompt_ids, SamplingParams(temperature=0, max_tokens=64))
    finally:
        engine.shutdown()
    assert out.token_ids == m.output_ids
    assert out.finish_reason == "stop"


def test_also_makes_the_runner_up(scripted_models):
    m = scripted_models("qwen3_thinking", also={" yes": ("</think>", 0.5)})
    tokenizer = transformers.AutoTokenizer.from_pretrained(m.path)
    model = transformers.AutoModelForCausalLM.from_pretrained(m.path)
    yes = m.script_ids.index(tokenizer.encode(" yes", add_special_tokens=False)[0])
    with torch.no_grad():
        logits = model(torch.tensor([m.prompt_ids + m.script_ids[: yes + 1]])).logits[0, -1]
    top = logits.topk(3)
    assert tokenizer.convert_ids_to_tokens(top.indices[:2].tolist()) == [".", "</think>"]
    assert top.values[1] / top.values[0] == pytest.approx(0.5)
    assert top.values[2] == pytest.approx(0, abs=1e-4)  # every other token
    out = model.generate(torch.tensor([m.prompt_ids]), max_new_tokens=64, do_sample=False)
    assert out[0, len(m.prompt_ids) :].tolist() == m.output_ids


def test_an_unwritable_script_names_the_conflicting_token(tmp_path, tokenizers):
    prompt = reasoning_models.prompt_ids(tokenizers["qwen3"], QUESTION)  # ends in "\n"
    with pytest.raises(ValueError, match=r"token '\\n' \(198\) would be followed by both"):
        scripted_model(tmp_path, "qwen3", prompt, "<think>\nI should say yes.\n</think>")
    with pytest.raises(ValueError, match="stop token before its end"):
        scripted_model(tmp_path, "gpt_oss", 7, "<|channel|>final<|return|>Yes")


def test_a_script_given_as_ids_may_end_in_a_stop_token(tmp_path, tokenizers):
    tokenizer = tokenizers["gpt_oss"]
    tokens = ["<|channel|>", "final", "<|message|>", "Yes", "<|return|>"]
    ids = tokenizer.convert_tokens_to_ids(tokens)
    prompt = reasoning_models.prompt_ids(tokenizer, QUESTION)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        scripted_model(tmp_path, "gpt_oss", prompt, ids)
    )
    out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    assert out[0, len(prompt) :].tolist() == ids
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>"])


def test_the_family_tokens_are_single_tokens_of_their_kind(tokenizers):
    for family, spec in reasoning_models.FAMILIES.items():
        tokenizer = tokenizers[family]
        added = {t.content: t.special for t in tokenizer.added_tokens_decoder.values()}
        for token in spec.plain + spec.special:
            assert tokenizer.encode(token, add_special_tokens=False) == [
                tokenizer.convert_tokens_to_ids(token)
            ]
            assert added[token] == (token in spec.special), (family, token)
        assert tokenizer.eos_token == spec.eos
    assert tokenizers["r1"].bos_token == "<｜begin▁of▁sentence｜>"


# ---- the chat templates, against the real ones' output ---------------------------------------


def test_qwen3_generation_prompts(tokenizers):
    turn = "<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    tokenizer = tokenizers["qwen3"]
    assert render(tokenizer, QUESTION, add_generation_prompt=True) == turn
    closed = render(tokenizer, QUESTION, add_generation_prompt=True, enable_thinking=False)
    assert closed == turn + "<think>\n\n</think>\n\n"


def test_qwen3_keeps_thoughts_after_the_last_query_only(tokenizers):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hello!"},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "Need the tool.",
            "content": "",
            "tool_calls": [CALL],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "<think>\nIt is sunny.\n</think>\n\nSunny."},
    ]
    assert render(tokenizers["qwen3"], messages) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nIt is sunny.\n</think>\n\nSunny.<|im_end|>\n"
    )


def test_qwen3_lists_tools_in_the_system_turn(tokenizers):
    messages = [{"role": "system", "content": "Be brief."}, *QUESTION]
    text = render(tokenizers["qwen3"], messages, tools=[WEATHER])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert f"<tools>\n{json.dumps(WEATHER)}\n</tools>" in text
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' in text


def test_r1_opens_the_thought_and_drops_old_ones(tokenizers):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet.\n</think>\n\nHello!"},
        *QUESTION,
    ]
    assert render(tokenizers["r1"], messages, add_generation_prompt=True) == (
        "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>\n\nHello!<｜end▁of▁sentence｜>"
        "<｜User｜>Is the sky blue?<｜Assistant｜><think>\n"
    )


def test_smollm3_reasoning_modes(tokenizers):
    tokenizer = tokenizers["smollm3"]
    thinking = render(tokenizer, QUESTION, add_generation_prompt=True)
    assert "Reasoning Mode: /think\n" in thinking
    assert thinking.endswith(
        "<|im_start|>user\nIs the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    )
    off = render(tokenizer, QUESTION, add_generation_prompt=True, enable_thinking=False)
    assert "Reasoning Mode: /no_think\n" in off
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    flagged = [{"role": "system", "content": "Be brief. /no_think"}, *QUESTION]
    today = datetime.now().strftime("%d %B %Y")
    assert render(tokenizer, flagged, add_generation_prompt=True) == (
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\n"
        f"Today Date: {today}\nReasoning Mode: /no_think\n\n## Custom Instructions\n\n"
        "Be brief.\n\n<|im_start|>user\nIs the sky blue?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n"
    )


def harmony_system(tools: bool, effort: str = "medium") -> str:
    calls = "\nCalls to these tools must go to the commentary channel: 'functions'." * tools
    return (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {datetime.now().strftime('%Y-%m-%d')}\n\n"
        f"Reasoning: {effort}\n\n# Valid channels: analysis, commentary, final. Channel must be "
        f"included for every message.{calls}<|end|>"
    )


def test_gpt_oss_generation_prompt(tokenizers):
    text = render(
        tokenizers["gpt_oss"], QUESTION, add_generation_prompt=True, reasoning_effort="high"
    )
    assert text == (
        harmony_system(False, "high")
        + "<|start|>user<|message|>Is the sky blue?<|end|><|start|>assistant"
    )


def test_gpt_oss_keeps_a_calls_thinking_until_a_final_answer(tokenizers):
    tokenizer = tokenizers["gpt_oss"]
    called = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "thinking": "Need the tool.", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny"},
    ]
    call = (
        "<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>'
        '<|start|>functions.weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
    )
    head = harmony_system(True) + (
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// The weather in a city.\ntype weather = (_: {\n// A city.\n"
        "city: string,\n}) => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|>"
    )
    assert render(tokenizer, called, tools=[WEATHER], add_generation_prompt=True) == (
        head
        + "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
        + call
        + "<|start|>assistant"
    )
    answered = [*called, {"role": "assistant", "thinking": "Say it.", "content": "Sunny."}]
    final = "<|start|>assistant<|channel|>final<|message|>Sunny."
    assert render(tokenizer, answered, tools=[WEATHER]) == (
        head
        + call
        + "<|start|>assistant<|channel|>analysis<|message|>Say it.<|end|>"
        + final
        + "<|return|>"
    )
    thanked = [*answered, {"role": "user", "content": "Thanks!"}]
    assert render(tokenizer, thanked, tools=[WEATHER], add_generation_prompt=True) == (
        head + call + final + "<|end|><|start|>user<|message|>Thanks!<|end|><|start|>assistant"
    )


CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, *QUESTION],
    [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "thinking": "Tool.", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "reasoning_content": "Said.", "content": "Sunny."},
        *QUESTION,
    ],
]


@pytest.mark.parametrize("family", reasoning_models.FAMILIES)
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["system", "tools"])
def test_braids_renderer_renders_them_as_transformers_does(tokenizers, family, messages):
    tokenizer = tokenizers[family]
    if family == "r1":  # its template concatenates the arguments: a string, as OpenAI's API sends
        call = {**CALL, "function": {**CALL["function"], "arguments": '{"city": "Paris"}'}}
        messages = [{**m, "tool_calls": [call]} if "tool_calls" in m else m for m in messages]
    for tools in (None, [WEATHER]):
        ours = template_render.render(tokenizer, messages, tools, add_generation_prompt=True)
        assert ours == render(tokenizer, messages, tools=tools, add_generation_prompt=True)
