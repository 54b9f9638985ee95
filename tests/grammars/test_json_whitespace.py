"""JSON grammars allow the whitespace models write (issue 61): where a model's own greedy
output is already valid, the constrained output is that output, compact, spaced or indented;
compact stays an option; what the regexes accept stays valid (jsonschema); nested models
(chains of $refs) compile whole, and a hostile chain is refused by name."""

from __future__ import annotations

import json
import re

import jsonschema
import pydantic
import pytest
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reasoning_models import QUESTION, family_tokenizer, prompt_ids, scripted_model

from braid import grammars
from braid.grammars.compiling.constraint_regex import constraint_regex
from braid.grammars.constraints import COMPACT, JSON_WHITESPACE, JsonSchema, ToolCalls, ToolSchema
from braid.grammars.json_schema.convert import MAX_NESTING, schema_to_regex
from braid.runtime import Engine, SamplingParams
from braid.runtime.cli.bench.grammar_cases import CORPUS_DIR, feed, load_corpus, serialize
from braid.runtime.loading.default_model import default_model_dir
from braid.runtime.server.wire import ChatCompletionRequest, openai_request

WEATHER = {
    "type": "object",
    "properties": {"days": {"type": "integer"}, "warm": {"type": "boolean"}},
    "required": ["warm"],
    "additionalProperties": False,
}
# What a model may write for WEATHER: compact, spaced as json.dumps writes by default (with
# the newline many models end on), and indented on lines as pretty-printers write. (Texts a
# scripted model can write: spelt in distinct tokens.)
STYLES = {
    "compact": '{"days":3,"warm":true}',
    "spaced": '{"days": 3, "warm": true}\n',
    "indented": '{\n  "warm": true\n}',
}


def distinct_tokens(tokenizer, text: str, avoid: int) -> list[int]:
    """A spelling of `text` in tokens that are all distinct and not `avoid` (a scripted
    model's next token depends on its current one alone), longest tokens first."""
    pieces = {tokenizer.decode([i]): i for i in range(len(tokenizer)) if i != avoid}
    pieces = {p: i for p, i in pieces.items() if p and "\ufffd" not in p and p in text}

    def spell(at: int, used: frozenset[int]) -> list[int] | None:
        if at == len(text):
            return []
        starting = sorted((p for p in pieces if text.startswith(p, at)), key=len, reverse=True)
        for p in starting:
            if (
                pieces[p] not in used
                and (rest := spell(at + len(p), used | {pieces[p]})) is not None
            ):
                return [pieces[p], *rest]
        return None

    ids = spell(0, frozenset())
    assert ids is not None and tokenizer.decode(ids) == text, text
    return ids


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """style -> (model path, prompt ids, script ids): a Qwen3-templated model that answers
    QUESTION by writing STYLES[style] greedily."""
    made = {}
    for style, text in STYLES.items():
        path = tmp_path_factory.mktemp(f"json_{style}")
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            family_tokenizer("qwen3", default_model_dir(), path)
        )
        prompt = prompt_ids(tokenizer, QUESTION, enable_thinking=False)
        script = distinct_tokens(tokenizer, text, prompt[-1])
        scripted_model(path, "qwen3", prompt, script)
        made[style] = (path, prompt, script)
    return made


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=48, **fields)


@pytest.mark.parametrize("style", list(STYLES))
def test_a_valid_answer_is_the_models_own(scripted, style):
    """The constraint removes nothing the model would write: greedy under the schema is
    greedy without it, token for token (jump-forward off: it spells forced text in tokens
    of its own choosing, which is not the grammar's doing)."""
    path, prompt, script = scripted[style]
    engine = Engine(model=str(path), device="cpu", dtype="float32", jump_forward=False)
    try:
        free = engine.generate(prompt, greedy())
        held = engine.generate(prompt, greedy(json_schema=WEATHER))
        compact = engine.generate(prompt, greedy(json_schema=WEATHER, json_compact=True))
    finally:
        engine.shutdown()
    assert free.token_ids[: len(script)] == script and free.text == STYLES[style]
    jsonschema.validate(json.loads(free.text), WEATHER)
    assert held.token_ids == free.token_ids and held.text == free.text
    # Compact: a valid document without whitespace outside its strings; the model's own
    # where it writes compact.
    jsonschema.validate(json.loads(compact.text), WEATHER)
    assert not re.search(r"\s", re.sub(r'"([^"\\]|\\.)*"', "", compact.text)), compact.text
    assert (compact.text == free.text) == (style == "compact")


@pytest.mark.model
@pytest.mark.parametrize("jump", [False, True], ids=["sampled", "jump-forward"])
@pytest.mark.parametrize(
    "prompt",
    [
        'Here is the person as JSON:\n{"name": "Ada", "age": 36}\n'
        "Here is another person as JSON:\n",
        'Write a JSON object with keys "name" and "age" for Alice, who is 30.\nJSON: ',
    ],
)
def test_the_default_models_json_is_kept(prompt, jump):
    """The default model writes spaced and indented JSON (a leading newline too) after
    these prompts: under a schema it validates, its greedy output is unchanged; with
    jump-forward too (the forced text's last token is left to the model where it could
    write a longer one: `name"` before `:` is `":` to its tokenizer)."""
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    stops = ["```", "\n\n", "\nHere"]
    engine = Engine(max_kv_tokens=1024, jump_forward=jump)
    try:
        free = engine.generate(prompt, greedy(stop=stops))
        held = engine.generate(prompt, greedy(stop=stops, json_schema=person))
    finally:
        engine.shutdown()
    jsonschema.validate(json.loads(free.text), person)
    assert re.search(r"[ \n]", free.text.strip())  # not compact: the case the issue names
    assert held.text == free.text


def test_compact_is_an_option_and_cached_apart():
    default, compact = JsonSchema.of(WEATHER), JsonSchema.of(WEATHER, whitespace=COMPACT)
    assert default != compact and hash(compact) == hash(JsonSchema.of(WEATHER, COMPACT))
    tight = re.compile(schema_to_regex(WEATHER, COMPACT))
    loose = re.compile(schema_to_regex(WEATHER))
    for text in STYLES.values():
        assert loose.fullmatch(text)
        assert bool(tight.fullmatch(text)) == (text == STYLES["compact"])


def test_each_gap_is_bounded():
    loose = re.compile(schema_to_regex(WEATHER))
    assert loose.fullmatch('{"warm":' + " " * 20 + "true}")
    assert not loose.fullmatch('{"warm":' + " " * 21 + "true}")
    assert not loose.fullmatch('{"warm":true}' + "\n" * 21)


def test_separators_keep_their_meaning():
    """Exact separators (guidance's), and no other whitespace when compact."""
    exact = re.compile(schema_to_regex(WEATHER, COMPACT, separators=(", ", ": ")))
    assert exact.fullmatch('{"days": 3, "warm": true}')
    assert not exact.fullmatch('{"days":3, "warm": true}')
    assert not exact.fullmatch('{ "days": 3, "warm": true }')


# ---- values written with whitespace, and soundness -------------------------------------------

VALUES = {
    "const object": {"const": {"b": [1, {"c": None}], "a": "x y", "e": {}}},
    "enum of containers": {"enum": [[], {"k": [True, False]}, [1, [2, [3]]], "s"]},
    "unique objects": {
        "type": "array",
        "items": {"enum": [{"p": 1}, {"q": [2]}, None]},
        "uniqueItems": True,
    },
    "const beside a type": {"type": "object", "const": {"n": 1.5}},
}


@pytest.mark.parametrize("name", list(VALUES))
def test_values_of_containers_compile_with_whitespace(name):
    """Refused before ("with whitespace"): each value is written with the whitespace."""
    schema = VALUES[name]
    pattern = re.compile(schema_to_regex(schema))
    values = schema.get("enum") or [schema.get("const")]
    if name == "unique objects":
        values = [[{"q": [2]}, None, {"p": 1}], []]
    for value in values:
        assert pattern.fullmatch(json.dumps(value)), value
        assert pattern.fullmatch(json.dumps(value, indent=2) + "\n"), value


def test_const_members_keep_the_written_order():
    pattern = re.compile(schema_to_regex({"const": {"a": 1, "b": 2}}))
    assert pattern.fullmatch('{ "a": 1, "b": 2 }')
    assert not pattern.fullmatch('{"b": 2, "a": 1}')  # equal under the spec: stricter, safe


@pytest.mark.parametrize("name", list(VALUES))
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_text_drawn_from_the_regex_validates(name, data):
    schema = VALUES[name]
    text = data.draw(st.from_regex(schema_to_regex(schema), fullmatch=True))
    jsonschema.validate(json.loads(text), schema)


CORPUS = [c for c in load_corpus(CORPUS_DIR) if c.expect == "compiled"]


def test_pretty_printed_corpus_instances_are_accepted(tokenizer, vocab):
    """Every valid corpus instance, indented as json.dumps(indent=2) writes it (where its
    gaps fit the bound), is accepted token by token; every invalid one is still refused."""
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    checked = 0
    for case in CORPUS:
        grammar = grammars.compile(JsonSchema.of(case.schema), vocab)
        for valid, data in case.tests:
            text = json.dumps(
                json.loads(serialize(data, case.schema)), indent=2, ensure_ascii=False
            )
            text += "\n"
            if max(map(len, re.findall(r"\n *", text)), default=0) > 20:
                continue  # deeper than the whitespace bound holds
            ids = tokenizer.encode(text, add_special_tokens=False)
            refused_at, _ = feed(grammar.matcher(), ids, tokenizer.eos_token_id, row)
            assert (refused_at is None) == valid, (case.name, text, refused_at)
            checked += 1
    assert checked > 200


# ---- nested models ---------------------------------------------------------------------------


def nested_model(levels: int) -> type[pydantic.BaseModel]:
    """Level1 holding Level2 ... holding Level<levels>, each with a field of its own."""
    inner = pydantic.create_model(f"Level{levels}", value=(int, ...))
    for i in range(levels - 1, 0, -1):
        inner = pydantic.create_model(f"Level{i}", name=(str, ...), child=(inner, ...))
    return inner


def nested_instance(levels: int) -> dict:
    value: dict = {"value": levels}
    for i in range(levels - 1, 0, -1):
        value = {"name": f"level {i}", "child": value}
    return value


@pytest.mark.parametrize("levels", [6, 8, 10])
def test_nested_models_compile_and_validate(levels, vocab, feeds):
    model = nested_model(levels)
    schema = model.model_json_schema()
    assert len(schema["$defs"]) == levels - 1  # a chain of $refs, `levels` deep
    pattern = re.compile(schema_to_regex(schema))
    instance = nested_instance(levels)
    for text in (json.dumps(instance), json.dumps(instance, indent=1)):
        assert pattern.fullmatch(text)
        model.model_validate_json(text)
    assert not pattern.fullmatch(json.dumps({**instance, "child": {"value": 1}}))
    grammar = grammars.compile(JsonSchema.of(schema), vocab)
    assert feeds(grammar, json.dumps(instance))


class Tree(pydantic.BaseModel):
    label: str
    children: list[Tree]


def test_recursion_stays_bounded_and_hostile_chains_are_refused():
    tree = Tree.model_json_schema()
    pattern = re.compile(schema_to_regex(tree))
    leaf = {"label": "x", "children": []}
    assert pattern.fullmatch(json.dumps({"label": "r", "children": [leaf]}))
    deep = leaf
    for _ in range(8):
        deep = {"label": "n", "children": [deep]}
    assert not pattern.fullmatch(json.dumps(deep))  # recursion unrolls a few levels only
    chain = {f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/$defs/d{i + 1}"}}}
             for i in range(MAX_NESTING)}  # fmt: skip
    chain[f"d{MAX_NESTING}"] = {"type": "integer"}
    with pytest.raises(ValueError, match="nests subschemas more than"):
        schema_to_regex({"$ref": "#/$defs/d0", "$defs": chain})


@pytest.mark.parametrize(
    "extra, compact",
    [
        ({"structured_outputs": {"json": WEATHER, "disable_any_whitespace": True}}, True),
        ({"structured_outputs": {"json": WEATHER, "disable_any_whitespace": False}}, False),
        ({"guided_json": WEATHER}, False),
        ({"response_format": {"type": "json_object"}}, False),
        ({"json_schema": WEATHER, "json_compact": True}, True),
    ],
)
def test_the_wire_selects_compact(extra, compact):
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    _, params, _ = openai_request(body, ChatCompletionRequest, 512)
    assert params.constraint.whitespace == (COMPACT if compact else JSON_WHITESPACE)


def test_compact_reaches_tool_call_arguments_and_is_refused_elsewhere():
    calls = ToolCalls((ToolSchema.of("weather", WEATHER, "tools[0]"),))
    spaced = constraint_regex(SamplingParams(tool_calls=calls).constraint)
    compact = constraint_regex(SamplingParams(tool_calls=calls, json_compact=True).constraint)
    call = '<tool_call>\n{"name": "weather", "arguments": {"days":3,"warm":true}}\n</tool_call>'
    loose = call.replace('"days":3', '"days": 3')
    assert re.fullmatch(compact, call) and not re.fullmatch(compact, loose)
    assert re.fullmatch(spaced, call) and re.fullmatch(spaced, loose)
    with pytest.raises(ValueError, match="json_compact"):
        SamplingParams(regex="[0-9]+", json_compact=True)
