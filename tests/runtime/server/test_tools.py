"""Function calling on /v1/chat/completions through the official openai client, on the tiny
random model: it writes garbage, so every valid call here is the constraint's doing."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import transformers
from conftest import WEATHER, LiveServer
from shared_cases import HERMES_TEMPLATE

from braid.runtime import Engine
from braid.runtime.server.chat import tools
from braid.runtime.server.chat.conversation import Conversation
from braid.runtime.server.wire import ChatCompletionRequest, convert

ORDER = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "tier": {"enum": ["gold", "silver"]},
            },
            "required": ["name", "tier"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"enum": ["A1", "B2", "C3"]},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["sku", "qty"],
            },
            "minItems": 1,
            "maxItems": 3,
        },
        "express": {"type": "boolean"},
    },
    "required": ["customer", "items", "express"],
}


def function(name: str, parameters: dict | None, description: str = "") -> dict:
    spec = {"name": name, "description": description or f"The {name} tool."}
    if parameters is not None:
        spec["parameters"] = parameters
    return {"type": "function", "function": spec}


TOOLS = [
    function("get_weather", WEATHER, "Current weather in a city."),
    function("place_order", ORDER, "Order items for a customer."),
    function("ping", None, "Check the service is up."),
]
SCHEMAS = {"get_weather": WEATHER, "place_order": ORDER, "ping": {"type": "object"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(long_tiny_model):
    path = long_tiny_model(0.01, tied=True)
    engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=8192)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def check_calls(choice, names=tuple(SCHEMAS)) -> list:
    """The choice is whole calls, each naming one of `names` with valid arguments."""
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in calls}) == len(calls)
    return calls


def call_bias(engine) -> dict:
    """Sampling fields that make the model write the call marker in auto mode (the constraint
    then has it finish a call): its tokens biased in decreasing order, each used one pushed
    below the next by the penalties (the model's own logits differ by ~0.01)."""
    ids = engine.tokenizer.encode(tools.MARK, add_special_tokens=False)
    bias = {str(t): 9 - 0.5 * i for i, t in enumerate(ids)}  # each above 9 - 4 = 5
    return {"logit_bias": bias, "presence_penalty": 2, "frequency_penalty": 2}


def test_required_gives_a_call(client):
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        temperature=0,
    )
    [call] = check_calls(out.choices[0])
    assert out.usage.completion_tokens > 0


def test_named_function_is_the_call(client):
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "place_order"}},
        parallel_tool_calls=False,
        max_tokens=160,
        seed=1,
    )
    [call] = check_calls(out.choices[0], names=("place_order",))


def test_auto_is_text_or_a_valid_call(engine, client):
    # Unbiased, the random model writes text: it cannot start with the call marker.
    out = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=8, temperature=0
    )
    choice = out.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "length"
    assert not choice.message.content.startswith(tools.MARK[:2])
    # Biased towards the marker's tokens it starts a call, which the constraint completes.
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="auto",
        parallel_tool_calls=False,
        max_tokens=160,
        temperature=0,
        **call_bias(engine),
    )
    check_calls(out.choices[0])
    # "none": plain text, never parsed for calls.
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=6,
        temperature=0,
        **call_bias(engine),
    )
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].message.content.startswith("<")


def test_parallel_calls(client):
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS[:1] + TOOLS[2:],
        tool_choice="required",
        max_tokens=300,
        seed=3,
        n=3,
    )
    for choice in out.choices:
        if choice.finish_reason == "tool_calls":
            calls = check_calls(choice)
            # A call repeated ends the output: the calls are all different.
            keys = [(c.function.name, c.function.arguments) for c in calls]
            assert len(set(keys)) == len(keys)
        else:  # cut off: the whole calls are there, the cut one is not
            assert choice.finish_reason == "length"
            for call in choice.message.tool_calls or ():
                jsonschema.validate(
                    json.loads(call.function.arguments), SCHEMAS[call.function.name]
                )
    assert any(c.finish_reason == "tool_calls" for c in out.choices)


@pytest.mark.parametrize(
    "choice,parallel",
    [
        ({"type": "function", "function": {"name": "get_weather"}}, None),
        ({"type": "function", "function": {"name": "ping"}}, True),
        ("required", False),
    ],
)
def test_exactly_the_call_asked_for_over_thirty_seeds(client, choice, parallel):
    """A named tool_choice is one call of that function, whatever parallel_tool_calls says;
    required with parallel_tool_calls false is one call. The random model would write more
    if the constraint let it (its EOS is as likely as any token)."""
    names = (choice["function"]["name"],) if isinstance(choice, dict) else tuple(SCHEMAS)
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    for seed in range(30):
        out = client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            # Compact arguments: at temperature 1 the random model pads the whitespace of
            # place_order's many gaps past max_tokens (its call then closes, cut short).
            extra_body={"json_compact": True},
            **extra,
        )
        [call] = check_calls(out.choices[0], names)


def test_a_call_cut_by_max_tokens_is_never_returned(client):
    """Cut in its first call: no tool_calls at all, content null, finish_reason length; the
    stream sends no piece of it either."""
    request = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "place_order"}},
        max_tokens=12,
        seed=5,
    )
    choice = client.chat.completions.create(**request).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None and choice.message.content is None
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def reassemble(chunks) -> list[dict]:
    """Calls from streamed tool_calls deltas, as an SDK client accumulates them."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for piece in chunk.choices[0].delta.tool_calls or ():
            if piece.index not in calls:  # the first piece: id, type and name
                assert piece.id.startswith("call_") and piece.type == "function"
                calls[piece.index] = {"name": piece.function.name, "arguments": ""}
            else:
                assert piece.id is None and piece.function.name is None
            calls[piece.index]["arguments"] += piece.function.arguments or ""
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed_calls_are_the_same_calls(engine, client, choice):
    request = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=200,
        seed=11,
        extra_body={"json_compact": True},  # as above: the random model pads whitespace
        **(call_bias(engine) | {"temperature": 0.05} if choice == "auto" else {}),
    )
    whole = client.chat.completions.create(**request)
    calls = check_calls(whole.choices[0])
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert all(c.choices[0].delta.content is None for c in chunks)
    expected = [{"name": c.function.name, "arguments": c.function.arguments} for c in calls]
    assert reassemble(chunks) == expected
    # The SDK's own stream helper (what agents use) builds the same message.
    with client.chat.completions.stream(**request) as stream:
        final = stream.get_final_completion()
    got = final.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in got] == [
        (c["name"], c["arguments"]) for c in expected
    ]


def test_a_tool_result_turn_is_answered(client):
    first = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        temperature=0,
    )
    [call] = check_calls(first.choices[0])
    # What an agent does: append the reply as it came, then one tool message per call.
    history = [
        *ASK,
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    out = client.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens > first.usage.prompt_tokens
    # Without tools (the final answer), with content null on the calling message.
    plain = {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
    history[1] = plain
    out = client.chat.completions.create(
        model="tiny", messages=history, max_tokens=4, temperature=0
    )
    assert out.choices[0].message.content is not None


def test_fifty_constrained_calls_validate(engine, client):
    """Fifty calls under every mode that forces or allows one, sampled with varied seeds and
    temperatures: every one is whole and its arguments validate."""
    bias = call_bias(engine)
    requests = [
        dict(tool_choice="required", temperature=1.0),
        dict(tool_choice="required", temperature=1.5, top_p=0.95),
        dict(tool_choice={"type": "function", "function": {"name": "place_order"}}),
        dict(tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=2),
        dict(tool_choice="auto", temperature=0.05, **bias),
    ]
    seen = set()
    for k, extra in enumerate(requests * 2):
        out = client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,
            parallel_tool_calls=False,
            max_tokens=200,
            n=5,
            seed=100 + 10 * k,
            **extra,
        )
        for choice in out.choices:
            [call] = check_calls(choice)
            seen.add(call.function.name)
    assert seen == set(SCHEMAS)


def test_response_format_applies_to_the_text_reply(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        max_tokens=20,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    choice = out.choices[0]
    if choice.message.tool_calls is None:
        jsonschema.validate(json.loads(choice.message.content), schema)
    else:
        check_calls(choice)


@pytest.mark.parametrize(
    "extra,message",
    [
        (dict(tool_choice="required", tools=None), "needs tools"),
        (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "not in tools"),
        (dict(tools=[function("bad name!", None)]), "function.name"),
        (dict(tools=[function("twice", None), function("twice", None)]), "twice"),
        (dict(tools=[function("s", {"type": "string"})]), "type 'object'"),
        (
            dict(tools=[function("x", {"type": "object", "properties": {"a": {"type": "nope"}}})]),
            "nope",
        ),
        (dict(extra_body={"regex": "a+"}), "regex"),
    ],
)
def test_bad_tool_requests_get_400(client, extra, message):
    request = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=4) | extra
    if request["tools"] is None:
        del request["tools"]
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(**request)


# ---- rendering ---------------------------------------------------------------------------------

HISTORY = {
    "messages": [
        {"role": "system", "content": "Be useful."},
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "ping", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
    ],
    "tools": TOOLS[:1] + TOOLS[2:],
}


def test_default_rendering_for_a_template_without_tools(engine):
    """The default model's template ignores tools: the preamble, calls and results become
    plain system, assistant and user messages."""
    assert not tools.template_renders_tools(engine.tokenizer)
    req = convert(HISTORY, ChatCompletionRequest)
    messages, tool_list = tools.conversation(
        Conversation(req.messages, req.tools), native=False, system_role=True
    )
    assert tool_list is None
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be useful.\n\n# Tools")
    assert json.dumps(tools.tool_json(convert(TOOLS[0], tools.Tool))) in messages[0]["content"]
    assert messages[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    )
    assert messages[3]["content"] == (
        "<tool_response>\n21 C\n</tool_response>\n<tool_response>\npong\n</tool_response>"
    )
    text = engine.tokenizer.apply_chat_template(messages, tokenize=False)
    assert "# Tools" in text and "pong" in text
    # A template without a system role gets the preamble in the first user message.
    req = convert({**HISTORY, "messages": HISTORY["messages"][1:]}, ChatCompletionRequest)
    messages, _ = tools.conversation(
        Conversation(req.messages, req.tools),
        native=False,
        system_role=False,
    )
    assert messages[0]["role"] == "user" and messages[0]["content"].startswith("# Tools")


def test_a_template_with_tools_renders_them_itself(default_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_path)
    tokenizer.chat_template = HERMES_TEMPLATE
    assert tools.template_renders_tools(tokenizer)
    req = convert(HISTORY, ChatCompletionRequest)
    messages, tool_list = tools.conversation(
        Conversation(req.messages, req.tools), native=True, system_role=True
    )
    assert tool_list == [tools.tool_json(t) for t in req.tools]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[3] == {
        "role": "tool",
        "content": "21 C",
        "tool_call_id": "call_1",
        "name": "get_weather",
    }
    text = tokenizer.apply_chat_template(messages, tools=tool_list, tokenize=False)
    assert '"name": "get_weather", "arguments": {"city": "Paris"}' in text
    assert "<tool_response>\npong\n</tool_response>" in text and '"ping"' in text


# ---- the parser --------------------------------------------------------------------------------


def test_parser_reads_calls_split_anywhere():
    text = (
        '<tool_call>\n{"name": "f", "arguments": {"a":"}{\\"","b":[1,{"c":2}]}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    whole = tools.parse(text)
    assert [(c.name, c.arguments) for c in whole.calls] == [
        ("f", '{"a":"}{\\"","b":[1,{"c":2}]}'),
        ("g", "{}"),
    ]
    assert whole.complete
    for size in (1, 2, 3, 7):
        parser = tools.CallParser()
        args: dict[int, str] = {}
        for i in range(0, len(text), size):
            for event in parser.feed(text[i : i + size]):
                assert event[0] != "text"
                if event[0] == "arguments":
                    args[event[1]] = args.get(event[1], "") + event[2]
        assert [c.arguments for c in parser.calls] == list(args.values())
        assert [(c.name, c.arguments) for c in parser.calls] == [
            (c.name, c.arguments) for c in whole.calls
        ]
    for text in ("", "<", "<tool", "hello", "<tool_x", "<b>"):
        parser = tools.parse(text)
        assert not parser.calls and not parser.complete


def test_parser_reports_whole_calls_only_and_ends_at_a_repeat():
    f = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    g = '<tool_call>\n{"name": "f", "arguments": {"a": 2}}\n</tool_call>'
    cut = tools.parse(f + "\n" + g[:-3])  # the second call's close cut short
    assert [c.arguments for c in cut.calls] == ['{"a": 1}'] and not cut.complete
    assert not tools.parse(f[:30]).calls and not tools.parse(f[:30]).is_text
    looping = tools.parse("\n".join([f, g, f, g, f]) + "\n<tool_call>\n{")
    assert [c.arguments for c in looping.calls] == ['{"a": 1}', '{"a": 2}']
    assert looping.repeated and looping.complete
    assert tools.finish_reason(looping, "length") == "tool_calls"
    assert tools.finish_reason(cut, "length") == "length"
    # The same call again with other whitespace and member order is a repeat all the same.
    h = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": [2]}}\n</tool_call>'
    h_again = '<tool_call>\n{"name": "f", "arguments": { "b":[ 2 ],"a":1 }}\n</tool_call>'
    again = tools.parse("\n".join([h, h_again, g]))
    assert [c.arguments for c in again.calls] == ['{"a": 1, "b": [2]}'] and again.repeated


def test_a_server_on_a_template_with_tools_uses_it(engine):
    """End to end on a Hermes-style template: the template renders the tools and the tool
    turns, and the calls come back constrained as on any other."""
    saved = engine.tokenizer.chat_template
    engine.tokenizer.chat_template = HERMES_TEMPLATE
    server = LiveServer(engine)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(
            model="tiny",
            tools=HISTORY["tools"],
            messages=HISTORY["messages"],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=100,
            seed=2,
        )
        check_calls(out.choices[0], names=("get_weather", "ping"))
        req = convert(HISTORY, ChatCompletionRequest)
        messages, tool_list = tools.conversation(
            Conversation(req.messages, req.tools), native=True, system_role=True
        )
        prompt = engine.tokenizer.apply_chat_template(
            messages, tools=tool_list, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert out.usage.prompt_tokens == len(prompt)
    finally:
        server.stop()
        engine.tokenizer.chat_template = saved


def test_the_default_model_ends_its_calls(default_model_path):
    """The default model, asked for one or more calls, writes its call and then writes it
    again and again: the repeat ends the output, so it gets its one call and "tool_calls"
    rather than a reply cut at max_tokens."""
    engine = Engine(max_kv_tokens=4096)
    server = LiveServer(engine)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        weather = function("get_weather", WEATHER, "Current weather in a city.")
        for seed in range(3):
            out = client.chat.completions.create(
                model="tiny",
                messages=ASK,
                tools=[weather],
                tool_choice="required",
                max_tokens=400,
                temperature=0.7,
                seed=seed,
            )
            calls = check_calls(out.choices[0], names=("get_weather",))
            keys = [c.function.arguments for c in calls]
            assert len(set(keys)) == len(keys)
            assert out.usage.completion_tokens < 400
    finally:
        server.stop()
        engine.shutdown()
