"""Tiny reasoning models that write a chosen text greedily, with the chat templates of Qwen3,
DeepSeek-R1, SmolLM3 and GPT-OSS (written from the real ones) and their control tokens added
to the default model's tokenizer.

A scripted model is a Llama whose attention and MLP outputs are zero, so its last hidden state
is the current token's embedding: each token of the script has an orthonormal embedding row,
and the LM head row of its successor points at it. The next token therefore depends on the
current token alone, and a script is writable only when every token in it (and the prompt's
last token before it) has one successor: in practice, when they are all distinct.

Test modules take the fixture by name: `scripted_models = reasoning_models.scripted_models`.
"""

# ruff: noqa: E501 (the chat templates' lines are long in the real ones too)

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import transformers
from tokenizers import AddedToken

from braid.runtime.loading.default_model import default_model_dir

QWEN3 = r"""
{%- set first_system = messages[0].content if messages and messages[0].role == 'system' else none %}
{%- if tools %}
{{- '<|im_start|>system\n' }}{% if first_system is not none %}{{ first_system + '\n\n' }}{% endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{ '\n' + tool | tojson }}{% endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif first_system is not none %}{{ '<|im_start|>system\n' + first_system + '<|im_end|>\n' }}
{%- endif %}
{#- Thoughts are kept only after the last real user query (not a wrapped tool response). #}
{%- set ns = namespace(query=messages|length - 1, searching=true) %}
{%- for m in messages[::-1] %}
{%- if ns.searching and m.role == 'user' and m.content is string and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) %}
{%- set ns.query = messages|length - 1 - loop.index0 %}{% set ns.searching = false %}
{%- endif %}
{%- endfor %}
{%- for m in messages %}
{%- set content = m.content if m.content is string else '' %}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' }}
{%- elif m.role == 'assistant' %}
{%- set thought = m.reasoning_content if m.reasoning_content is string else '' %}
{%- if m.reasoning_content is not string and '</think>' in content %}
{%- set thought = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{{- '<|im_start|>assistant\n' }}
{%- if loop.index0 > ns.query and (loop.last or thought) %}
{{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}{{ content }}{% endif %}
{%- for call in m.tool_calls or [] %}
{%- if content or not loop.first %}{{ '\n' }}{% endif %}
{%- set f = call.function if call.function else call %}
{{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' + (f.arguments if f.arguments is string else f.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}
{%- endif %}"""

# The newer R1 template (R1-0528, the distills' later revisions): the prompt opens the thought.
# As in the real one, an assistant turn after tool outputs is written without its header.
DEEPSEEK_R1 = r"""
{%- set ns = namespace(system='', first=true, in_tools=false) %}
{%- for m in messages if m.role == 'system' %}
{%- set ns.system = m.content if ns.first else ns.system + '\n\n' + m.content %}{% set ns.first = false %}
{%- endfor %}
{{- bos_token + ns.system }}
{%- for m in messages %}
{%- if m.role == 'user' %}{% set ns.in_tools = false %}{{ '<｜User｜>' + m.content }}
{%- elif m.role == 'assistant' and m.tool_calls %}{% set ns.in_tools = false %}
{{- '<｜Assistant｜>' + (m.content or '') + '<｜tool▁calls▁begin｜>' }}
{%- for call in m.tool_calls %}{% if not loop.first %}{{ '\n' }}{% endif %}
{{- '<｜tool▁call▁begin｜>' + call.type + '<｜tool▁sep｜>' + call.function.name + '\n```json\n' + call.function.arguments + '\n```<｜tool▁call▁end｜>' }}
{%- endfor %}{{ '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
{%- elif m.role == 'assistant' and ns.in_tools %}{% set ns.in_tools = false %}
{{- '<｜tool▁outputs▁end｜>' + m.content + '<｜end▁of▁sentence｜>' }}
{%- elif m.role == 'assistant' %}
{{- '<｜Assistant｜>' + m.content.split('</think>')[-1] + '<｜end▁of▁sentence｜>' }}
{%- elif m.role == 'tool' %}
{{- ('\n' if ns.in_tools else '<｜tool▁outputs▁begin｜>') + '<｜tool▁output▁begin｜>' + m.content + '<｜tool▁output▁end｜>' }}{% set ns.in_tools = true %}
{%- endif %}
{%- endfor %}
{%- if ns.in_tools %}{{ '<｜tool▁outputs▁end｜>' }}{% elif add_generation_prompt %}{{ '<｜Assistant｜><think>\n' }}{% endif %}"""

# As the real one does, it reads tools from `xml_tools` / `python_tools` (not `tools`), writes
# them with Python's repr (`|string`), and closes the system turn only when it lists tools.
SMOLLM3 = r"""
{%- set mode = '/no_think' if enable_thinking is defined and not enable_thinking else '/think' %}
{%- set system = messages[0].content if messages[0].role == 'system' else '' %}
{%- set mode = '/no_think' if '/no_think' in system else ('/think' if '/think' in system else mode) %}
{%- set custom = system.replace('/no_think', '').replace('/think', '').rstrip() %}
{{- '<|im_start|>system\n' }}
{%- if '/system_override' in system %}{{ custom.replace('/system_override', '').rstrip() + '<|im_end|>\n' }}
{%- else %}
{{- '## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: ' + strftime_now('%d %B %Y') + '\nReasoning Mode: ' + mode + '\n\n## Custom Instructions\n\n' }}
{%- if custom %}{{ custom + '\n\n' }}
{%- elif mode == '/think' %}{{ "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves thoroughly exploring questions through a systematic thinking process before providing the final precise and accurate solutions. This requires engaging in a comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to develop well-considered thinking process. Please structure your response into two main sections: Thought and Solution using the specified format: <think> Thought section </think> Solution section. In the Thought section, detail your reasoning process in steps. Each step should include detailed considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the Solution section, based on various attempts, explorations, and reflections from the Thought section, systematically present the final solution that you deem correct. The Solution section should be logical, accurate, and concise and detail necessary steps needed to reach the conclusion.\n\n" }}
{%- else %}{{ 'You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n' }}
{%- endif %}
{%- if xml_tools or python_tools %}{{ '### Tools\n\n' }}
{%- if xml_tools %}{{ 'You may call one or more functions to assist with the user query.\nYou are provided with function signatures within <tools></tools> XML tags:\n\n<tools>\n' }}
{%- for tool in xml_tools %}{{ tool | string + '\n' }}{% endfor %}
{{- '</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- endif %}
{%- if python_tools %}{{ "When you send a message containing Python code between '<code>' and '</code>' tags, it will be executed in a stateful Jupyter notebook environment, and you will then be given the output to continued reasoning in an agentic loop.\n\nYou can use the following tools in your python code like regular functions:\n<tools>\n" }}
{%- for tool in python_tools %}{{ tool | string + '\n' }}{% endfor %}
{{- '</tools>\n\nThe state persists between code executions: so variables that you define in one step are still available thereafter.' }}
{%- endif %}{{ '\n\n<|im_end|>\n' }}
{%- endif %}
{%- endif %}
{%- set empty_thought = '' if mode == '/think' else '<think>\n\n</think>\n' %}
{%- for m in messages %}
{%- set content = m.content if m.content is string else '' %}
{%- if m.role == 'user' or m.role == 'tool' %}{{ '<|im_start|>' + ('user' if m.role == 'tool' else m.role) + '\n' + content + '<|im_end|>\n' }}
{%- elif m.role == 'assistant' %}{% generation %}{{ '<|im_start|>assistant\n' + empty_thought + content.lstrip('\n') + '<|im_end|>\n' }}{% endgeneration %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' + empty_thought }}{% endif %}"""

# Harmony. The tool's TypeScript covers the JSON Schema types the real template does, less
# oneOf and type lists (written `any` here).
GPT_OSS = r"""
{%- macro ts_type(s) %}
{%- if s.type == 'array' %}{{ (ts_type(s['items']) if s['items'] else 'any') + '[]' + (' | null' if s.nullable else '') }}
{%- elif s.type == 'string' and s.enum %}{{ '"' + s.enum | join('" | "') + '"' }}
{%- elif s.type == 'string' %}{{ 'string' + (' | null' if s.nullable else '') }}
{%- elif s.type in ('number', 'integer') %}{{ 'number' }}
{%- elif s.type == 'boolean' %}{{ 'boolean' }}
{%- elif s.type == 'object' and s.properties %}{{ '{\n' }}
{%- for name, p in s.properties.items() %}{{ name + ('' if name in (s.required or []) else '?') + ': ' + ts_type(p) + ('' if loop.last else ', ') }}{% endfor %}{{ '}' }}
{%- elif s.type == 'object' %}{{ 'object' }}
{%- else %}{{ 'any' }}{% endif %}
{%- endmacro %}
{{- '<|start|>system<|message|>' + (model_identity or 'You are ChatGPT, a large language model trained by OpenAI.') + '\nKnowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\n\nReasoning: ' + (reasoning_effort or 'medium') + '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.' }}
{%- if tools %}{{ "\nCalls to these tools must go to the commentary channel: 'functions'." }}{% endif %}{{ '<|end|>' }}
{%- set has_developer = messages and messages[0].role in ('system', 'developer') %}
{%- set instructions = messages[0].content if has_developer else '' %}
{%- if instructions or tools %}{{ '<|start|>developer<|message|>' }}
{%- if instructions %}{{ '# Instructions\n\n' + instructions + '\n\n' }}{% endif %}
{%- if tools %}{{ '# Tools\n\n## functions\n\nnamespace functions {\n\n' }}
{%- for tool in tools %}{% set f = tool.function %}{{ '// ' + f.description + '\ntype ' + f.name + ' = ' }}
{%- if f.parameters and f.parameters.properties %}{{ '(_: {\n' }}
{%- for name, p in f.parameters.properties.items() %}
{%- if p.description %}{{ '// ' + p.description + '\n' }}{% endif %}
{{- name + ('' if name in (f.parameters.required or []) else '?') + ': ' + ts_type(p) }}
{%- if p.default is defined %}{{ (', // default: ' + p.default) if p.enum else (', // default: ' + p.default | tojson) }}{% endif %}{{ ',\n' }}
{%- endfor %}{{ '}) => any;\n\n' }}
{%- else %}{{ '() => any;\n\n' }}{% endif %}
{%- endfor %}{{ '} // namespace functions' }}
{%- endif %}{{ '<|end|>' }}
{%- endif %}
{%- set turns = messages[1:] if has_developer else messages %}
{%- set last_call = namespace(name=none) %}
{%- for m in turns %}
{%- if m.role == 'assistant' and 'tool_calls' in m %}
{#- A call's thought is kept until a final answer follows it. #}
{%- set later = namespace(final=false) %}
{%- for n in turns[loop.index:] %}{% if n.role == 'assistant' and 'tool_calls' not in n %}{% set later.final = true %}{% endif %}{% endfor %}
{%- if m.content and m.thinking %}{{ raise_exception('Cannot pass both content and thinking in an assistant message with tool calls!') }}{% endif %}
{%- if (m.content or m.thinking) and not later.final %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + (m.content or m.thinking) + '<|end|>' }}{% endif %}
{%- set call = m.tool_calls[0].function if m.tool_calls[0].function else m.tool_calls[0] %}
{{- '<|start|>assistant to=functions.' + call.name + '<|channel|>commentary ' + (call.content_type if call.content_type is defined else 'json') + '<|message|>' + call.arguments | tojson + '<|call|>' }}
{%- set last_call.name = call.name %}
{%- elif m.role == 'assistant' and loop.last and not add_generation_prompt %}
{%- if 'thinking' in m %}{{ '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}{% endif %}
{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|return|>' }}
{%- elif m.role == 'assistant' %}{{ '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}{% set last_call.name = none %}
{%- elif m.role == 'tool' %}
{%- if last_call.name is none %}{{ raise_exception('Message has tool role, but there was no previous assistant message with a tool call!') }}{% endif %}
{{- '<|start|>functions.' + last_call.name + ' to=assistant<|channel|>commentary<|message|>' + m.content | tojson + '<|end|>' }}
{%- elif m.role == 'user' %}{{ '<|start|>user<|message|>' + m.content + '<|end|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"""


class Family(NamedTuple):
    template: str
    plain: tuple[str, ...]  # added as non-special tokens (the tags a reasoning parser reads)
    special: tuple[str, ...]
    eos: str
    stops: tuple[str, ...] = ()  # generation_config.json's eos_token_id list, when there is one
    bos: str | None = None


FAMILIES = {
    "qwen3": Family(
        QWEN3,
        tuple("<think> </think> <tool_call> </tool_call> <tool_response> </tool_response>".split()),
        (),
        "<|im_end|>",
    ),
    "r1": Family(
        DEEPSEEK_R1,
        ("<think>", "</think>"),
        ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
        "<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
    ),
    "smollm3": Family(SMOLLM3, ("<think>", "</think>"), (), "<|im_end|>"),
    "gpt_oss": Family(
        GPT_OSS,
        (),
        ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>")
        + ("<|call|>",),
        "<|return|>",
        stops=("<|return|>", "<|call|>"),
    ),
}


class Script(NamedTuple):
    family: str
    text: str
    template_kwargs: dict  # of the generation prompt the script continues


# Writable scripts: each token in them, and the prompt's last one, is distinct. Qwen3's and
# SmolLM3's prompts end in "\n" (R1's after "<think>" too), so "\n" cannot recur in their
# scripts: the thoughts sit right against their tags. "\n\n" before a text encodes as two "\n"
# tokens (the pre-tokenizer splits it off), so answers follow "</think>" at once too. Harmony
# repeats <|channel|> and <|message|> in an analysis-then-final output: one script holds one
# message (its last followed by <|return|>, or ending in <|call|>). Answers are compact JSON:
# braid's JSON grammar writes no whitespace between tokens yet (issue 61).
QUESTION = [{"role": "user", "content": "Is the sky blue?"}]
SCRIPTS = {
    "qwen3_thinking": Script("qwen3", '<think>I should say yes.</think>{"answer":true}', {}),
    "qwen3_no_thinking": Script("qwen3", '{"answer":true}', {"enable_thinking": False}),
    "qwen3_tool_call": Script(
        "qwen3",
        '<think>Checking the forecast.</think><tool_call>{"name":"weather","arguments":{}}'
        "</tool_call>",
        {},
    ),
    "r1_thinking": Script("r1", 'I should say yes.</think>{"answer":true}', {}),
    "smollm3_thinking": Script("smollm3", '<think>I should say yes.</think>{"answer":true}', {}),
    "smollm3_no_thinking": Script("smollm3", '{"answer":true}', {"enable_thinking": False}),
    "gpt_oss_final": Script("gpt_oss", "<|channel|>final<|message|>Yes.", {}),
    "gpt_oss_analysis": Script(
        "gpt_oss", "<|channel|>analysis<|message|>I should say yes.<|end|>", {}
    ),
    "gpt_oss_tool_call": Script(
        "gpt_oss",
        '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city":"Paris"}'
        "<|call|>",
        {},
    ),
}

LOGIT = 20.0  # each successor's logit; every other token's is 0


def family_tokenizer(family: str, default_model_path: Path, directory: Path) -> Path:
    """The default model's tokenizer with `family`'s tokens and chat template, saved to
    `directory`."""
    spec = FAMILIES[family]
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_path)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.plain])
    added = [AddedToken(t, special=True, normalized=False) for t in spec.special]
    tokenizer.add_tokens(added, special_tokens=True)
    tokenizer.eos_token = spec.eos
    if spec.bos is not None:
        tokenizer.bos_token = spec.bos
    tokenizer.chat_template = spec.template
    tokenizer.save_pretrained(directory)
    return Path(directory)


def render(tokenizer, messages: list[dict], **kwargs) -> str:
    """transformers' rendering of `messages` (the reference braid's renderer is held to)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def prompt_ids(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    """The ids of `messages` with the generation prompt (the template writes any BOS)."""
    text = render(tokenizer, messages, add_generation_prompt=True, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def successors(
    tokenizer, last_token: int, script: list[int], stops: set[int], eos: int
) -> dict[int, int]:
    """token -> the one token that follows it, from the prompt's last token through the
    script to EOS (none after a script that ends in a stop token). ValueError if a token
    would need two."""
    if any(t in stops for t in script[:-1]):
        raise ValueError("the script writes a stop token before its end")
    chain = [last_token, *script] + ([] if script and script[-1] in stops else [eos])
    after: dict[int, int] = {}
    for token, following in zip(chain, chain[1:], strict=False):
        if after.setdefault(token, following) != following:
            shown = [repr(tokenizer.decode([t])) for t in (token, after[token], following)]
            raise ValueError(
                f"token {shown[0]} ({token}) would be followed by both {shown[1]} and "
                f"{shown[2]}: a scripted model's next token depends on the current one alone"
            )
    return after


def scripted_model(
    directory: Path,
    family: str,
    prompt_ids_or_last_token: list[int] | int,
    script: str | list[int],
    also: dict[str | int, tuple[str | int, float]] | None = None,
) -> Path:
    """A Llama directory (with `family`'s tokenizer) whose greedy decoding after a prompt
    ending in the given token writes `script` (its text as the tokenizer encodes it, or ids),
    then EOS. `also={token: (other, weight)}`: after `token`, `other` is the runner-up, its
    logit `weight` times the successor's."""
    directory = Path(directory)
    family_tokenizer(family, default_model_dir(), directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    spec = FAMILIES[family]
    last = prompt_ids_or_last_token
    last = last if isinstance(last, int) else last[-1]
    ids = tokenizer.encode(script, add_special_tokens=False) if isinstance(script, str) else script
    eos, stops = _stops(tokenizer, spec)
    after = successors(tokenizer, last, list(ids), stops, eos)

    # Room for one orthonormal direction per token that has a successor.
    hidden = max(64, 32 * math.ceil(len(after) / 32))
    heads = hidden // 16
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=4096,  # GPT-OSS's system prompt and tools take hundreds
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    directions = torch.linalg.qr(torch.randn(hidden, hidden))[0]
    # The final norm scales a unit row to sqrt(hidden): the head rows are scaled back.
    head = LOGIT / math.sqrt(hidden)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.zero_()
        lm_head.zero_()
        rows = {token: directions[i] for i, token in enumerate(after)}
        for token, following in after.items():
            embed[token] = rows[token]
            lm_head[following] += head * rows[token]
        for token, (other, weight) in (also or {}).items():
            token, other = _one_token(tokenizer, token), _one_token(tokenizer, other)
            if token not in rows:
                raise ValueError(f"{tokenizer.decode([token])!r} is not in the script")
            if other == after[token]:
                raise ValueError(f"{tokenizer.decode([other])!r} is the successor already")
            lm_head[other] += weight * head * rows[token]
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=sorted(stops) if spec.stops else eos,
        pad_token_id=eos,
    )
    model.save_pretrained(directory)
    return directory


def _stops(tokenizer, spec: Family) -> tuple[int, set[int]]:
    """The family's EOS id, and every id that ends a generation."""
    eos = tokenizer.convert_tokens_to_ids(spec.eos)
    return eos, {tokenizer.convert_tokens_to_ids(t) for t in spec.stops} | {eos}


def _one_token(tokenizer, token: str | int) -> int:
    if isinstance(token, int):
        return token
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{token!r} is {len(ids)} tokens, not one")
    return ids[0]


class ScriptedModel(NamedTuple):
    path: Path
    prompt_ids: list[int]  # QUESTION's generation prompt, with the script's template kwargs
    script_ids: list[int]
    output_ids: list[int]  # what greedy decoding writes: the script, then EOS unless it stopped


@pytest.fixture(scope="session")
def scripted_models(tmp_path_factory):
    """make(name, also=None): SCRIPTS[name]'s model (built once per name and `also`), with the
    prompt it continues and the ids it writes."""
    built: dict[tuple, ScriptedModel] = {}

    def make(name: str, also: dict | None = None) -> ScriptedModel:
        key = (name, json.dumps(also, sort_keys=True))
        if key not in built:
            family, text, template_kwargs = SCRIPTS[name]
            path = tmp_path_factory.mktemp(name)
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                family_tokenizer(family, default_model_dir(), path)
            )
            prompt = prompt_ids(tokenizer, QUESTION, **template_kwargs)
            scripted_model(path, family, prompt, text, also)
            ids = tokenizer.encode(text, add_special_tokens=False)
            eos, stops = _stops(tokenizer, FAMILIES[family])
            built[key] = ScriptedModel(path, prompt, ids, ids + ([] if ids[-1] in stops else [eos]))
        return built[key]

    return make
