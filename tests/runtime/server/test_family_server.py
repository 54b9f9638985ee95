"""Every model family through the server: a tiny random HF model per family, with a chat
template in the family's own format, served as `braid serve` serves it. /v1/chat/completions
renders the conversation with that template (the prompt's token ids are transformers'
apply_chat_template's), answers what the engine answers for the prompt, and, where the
family's template has tools (Qwen3, SmolLM3, Phi-4-mini), a tool call comes back valid and
its result goes back in the next turn."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import torch
import transformers
from conftest import WEATHER, LiveServer
from family_models import tiny_model

from braid.runtime import Engine, SamplingParams
from braid.runtime.server.chat import tools
from braid.runtime.server.chat.conversation import Conversation
from braid.runtime.server.wire import ChatCompletionRequest, convert

# Each template is a short one in the family's own format (its real one, less the branches
# these tests do not reach: images, reasoning, multi-step tool loops).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}"
    "\n{{ (first if loop.first else '') + m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Phi-4-mini's: tools ride on the system message (its `tools` field, JSON text), not on the
# template's `tools`; the server's tool preamble takes their place.
PHI4_MINI_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and 'tools' in m and m['tools'] is not none %}"
    "<|system|>{{ m['content'] }}<|tool|>{{ m['tools'] }}<|/tool|><|end|>"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% else %}{{ eos_token }}{% endif %}"
)
# The Hermes tool section Qwen3's and SmolLM3's templates share (in their own words).
_HERMES_TOOLS = (
    "You may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)
_HERMES_TURNS = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|im_start|>user\n{{ m['content'] }}<|im_end|>\n"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] or '' }}"
    "{% for call in m['tool_calls'] or [] %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n{% endif %}{% endfor %}"
)
QWEN3_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\n" + _HERMES_TOOLS + "<|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    + _HERMES_TURNS
    + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)
SMOLLM3_TEMPLATE = (
    "<|im_start|>system\n## Metadata\n\nReasoning Mode: /no_think\n\n## Custom Instructions\n\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "{% if tools %}### Tools\n\n"
    + _HERMES_TOOLS
    + "\n\n{% endif %}<|im_end|>\n"
    + _HERMES_TURNS
    + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n{% endif %}"
)
MIXTRAL_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{% if m['role'] == 'user' %}"
    "[INST] {{ (first if loop.first else '') + m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
OLMOE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] + eos_token }}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endif %}"
    "{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}"
)

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
FAMILIES = {
    "gemma3": (
        transformers.Gemma3TextConfig,
        dict(
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
            architectures=["Gemma3ForCausalLM"],
        ),
        GEMMA3_TEMPLATE,
    ),
    "phi4-mini": (
        transformers.Phi3Config,
        dict(
            tie_word_embeddings=True,
            original_max_position_embeddings=16,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
            },
        ),
        PHI4_MINI_TEMPLATE,
    ),
    "smollm3": (transformers.SmolLM3Config, dict(no_rope_layer_interval=2), SMOLLM3_TEMPLATE),
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
        QWEN3_TEMPLATE,
    ),
    "mixtral": (
        transformers.MixtralConfig,
        dict(num_local_experts=4, num_experts_per_tok=2),
        MIXTRAL_TEMPLATE,
    ),
    "olmoe": (
        transformers.OlmoeConfig,
        dict(num_experts=4, num_experts_per_tok=2, num_key_value_heads=4),
        OLMOE_TEMPLATE,
    ),
}
WITH_TOOLS = ("phi4-mini", "smollm3", "qwen3_moe")
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the weather like in Paris today?"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": WEATHER,
    },
}


def _randomize(name: str, p: torch.nn.Parameter) -> None:
    if "norm" in name:
        p.normal_(1.0, 0.3)
    elif name.endswith("gate.weight"):  # the routers
        p.normal_(0.0, 0.5)


class Served:
    """A family's model behind a live server, with the prompts the server handed the engine."""

    def __init__(self, family: str, path, engine: Engine) -> None:
        self.family = family
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.engine = engine
        self.prompts: list[list[int]] = []
        stream = engine.stream

        def recording(ids, params, **kwargs):
            self.prompts.append(list(ids))
            return stream(ids, params, **kwargs)

        engine.stream = recording  # what the server's chat routes call
        self.server = LiveServer(engine)

    def chat(self, **body) -> dict:
        self.prompts.clear()
        body = {"model": "tiny", "max_tokens": 8, "temperature": 0} | body
        r = httpx.post(self.server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert len(self.prompts) == 1
        return r.json()

    def rendered(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """transformers' prompt ids of the conversation through the model's template."""
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    def greedy(self, ids: list[int], max_tokens: int = 8) -> str:
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        return self.engine.generate(ids, params).text


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory, default_model_path):
    config_cls, fields, template = FAMILIES[request.param]
    path = tiny_model(
        tmp_path_factory.mktemp(request.param),
        default_model_path,
        config_cls,
        TINY | fields,
        _randomize,
        template,
    )
    engine = Engine(model=str(path), dtype="float32")
    served = Served(request.param, path, engine)
    yield served
    served.server.stop()
    engine.shutdown()


def test_chat_renders_the_family_template_and_answers_as_the_engine(served):
    out = served.chat(messages=MESSAGES)
    assert served.prompts[0] == served.rendered(MESSAGES)
    text = served.tokenizer.decode(served.prompts[0])
    assert "You answer briefly." in text and "Paris" in text
    assert out["choices"][0]["message"]["content"] == served.greedy(served.prompts[0])


def test_a_tool_call_round_trip(served):
    """tool_choice="required": a valid get_weather call; its result sent back (with the
    call) renders through the template, and the reply is the engine's for that prompt."""
    if served.family not in WITH_TOOLS:
        pytest.skip(f"{served.family}'s template has no tools")
    native = served.family != "phi4-mini"  # Phi-4-mini's gets the server's tool preamble
    assert tools.template_renders_tools(served.tokenizer) == native
    out = served.chat(
        messages=MESSAGES,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=200,
        json_compact=True,  # the random model would pad the arguments' whitespace
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER)
    asked = served.prompts[0]
    if native:  # the template itself lists the tool
        assert asked == served.rendered(MESSAGES, tools=[WEATHER_TOOL])
    text = served.tokenizer.decode(asked)
    assert '"get_weather"' in text and "Current weather in a city." in text

    history = MESSAGES + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21}'},
    ]
    body = dict(messages=history, tools=[WEATHER_TOOL], tool_choice="none")
    out = served.chat(**body)
    req = convert({"model": "tiny", **body}, ChatCompletionRequest)
    messages, tool_list = tools.conversation(
        Conversation(req.messages, req.tools), native=native, system_role=True
    )
    assert served.prompts[0] == served.rendered(messages, tool_list)
    text = served.tokenizer.decode(served.prompts[0])
    assert '{"temperature": 21}' in text and arguments["city"] in text
    assert out["choices"][0]["message"]["content"] == served.greedy(served.prompts[0])
