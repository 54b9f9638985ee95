"""pydantic types wherever braid takes a type for a JSON schema: the schema is pydantic's
own (TypeAdapter.json_schema, checked with jsonschema on what the tiny model wrote), the
value pydantic's validation of the text; msgspec Structs, dataclasses and TypedDicts keep
msgspec's schema, unless they hold pydantic's constraints; `import braid` leaves pydantic
unimported."""

from __future__ import annotations

import dataclasses
import json as stdjson
import subprocess
import sys
from typing import Annotated, TypedDict

import jsonschema
import msgspec
import pydantic
import pytest
from backend_doubles import ScriptedBase

from braid import capture, gen, json, program
from braid.interpreter import ChatTemplate, LocalBackend
from braid.runtime.protocol import GenerateOutput


class Item(pydantic.BaseModel):
    name: Annotated[str, pydantic.Field(max_length=8)]
    qty: Annotated[int, pydantic.Field(ge=1, le=9)]


class Order(pydantic.BaseModel):
    items: Annotated[list[Item], pydantic.Field(min_length=1, max_length=3)]
    rush: bool


class Even(pydantic.BaseModel):
    """A constraint no JSON schema states: only pydantic's validation enforces it."""

    n: int

    @pydantic.field_validator("n")
    @classmethod
    def even(cls, n: int) -> int:
        if n % 2:
            raise ValueError("n must be even")
        return n


@pydantic.dataclasses.dataclass
class Span:
    start: Annotated[int, pydantic.Field(ge=0)]


@dataclasses.dataclass
class Plain:
    start: int


@dataclasses.dataclass
class HoldsPydantic:  # a standard dataclass whose field carries pydantic's constraint
    start: Annotated[int, pydantic.Field(ge=5)]


class Struct(msgspec.Struct):
    a: int
    b: list[str]


class Typed(TypedDict):
    a: int


class Scripted(ScriptedBase):
    """Each gen answers the next of `replies`; records the params."""

    def __init__(self, tokenizer, replies) -> None:
        self.chat_template = ChatTemplate.from_tokenizer(tokenizer)
        self.replies, self.params = list(replies), []

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.params.append(params)
        text = self.replies.pop(0)
        on_text(text)
        return GenerateOutput(text, [1], "stop", {"completion_tokens": 1})

    async def score(self, prefix, continuations, lora=None):
        raise AssertionError("no select here")


def _run(tokenizer, schema, reply):
    """(the value a gen with json_schema=schema stores for `reply`, the schema it sent)."""
    backend = Scripted(tokenizer, [reply])

    @program
    def p(s):
        s += gen("x", json_schema=schema)

    return p.run(backend=backend)["x"], backend.params[0].json_schema


def test_a_model_comes_back_validated_by_pydantic(tokenizer):
    reply = '{"items":[{"name":"tea","qty":2}],"rush":true}'
    value, schema = _run(tokenizer, Order, reply)
    assert schema == pydantic.TypeAdapter(Order).json_schema()  # $defs and $ref included
    assert isinstance(value, Order) and isinstance(value.items[0], Item)
    assert value == Order.model_validate_json(reply)


def test_pydantics_own_validation_decodes(tokenizer):
    assert _run(tokenizer, Even, '{"n":4}')[0] == Even(n=4)
    with pytest.raises(ValueError, match="(?s)cannot decode.*n must be even"):
        _run(tokenizer, Even, '{"n":3}')


@pytest.mark.parametrize(
    ("schema", "reply", "expected"),
    [
        (
            list[Item],
            '[{"name":"a","qty":1},{"name":"b","qty":9}]',
            [Item(name="a", qty=1), Item(name="b", qty=9)],
        ),
        (Annotated[int, pydantic.Field(ge=1, le=5)], "3", 3),
        (Span, '{"start":4}', Span(start=4)),
        (HoldsPydantic, '{"start":7}', HoldsPydantic(start=7)),
        (Item | None, "null", None),
    ],
)
def test_what_type_adapter_takes_goes_through_pydantic(tokenizer, schema, reply, expected):
    value, sent = _run(tokenizer, schema, reply)
    assert value == expected and type(value) is type(expected)
    adapter = pydantic.TypeAdapter(schema)
    assert sent == adapter.json_schema()
    jsonschema.validate(stdjson.loads(reply), sent)


def test_pydantics_constraints_are_never_dropped(tokenizer):
    # msgspec reads these as plain integers; pydantic's schema keeps the bounds.
    assert _run(tokenizer, Annotated[int, pydantic.Field(ge=1, le=5)], "3")[1]["maximum"] == 5
    assert _run(tokenizer, HoldsPydantic, '{"start":7}')[1]["properties"]["start"]["minimum"] == 5
    with pytest.raises(ValueError, match="cannot decode"):
        _run(tokenizer, HoldsPydantic, '{"start":2}')


@pytest.mark.parametrize(
    ("schema", "reply"),
    [(Struct, '{"a":1,"b":["x"]}'), (Plain, '{"start":3}'), (Typed, '{"a":2}')],
)
def test_msgspec_types_still_go_through_msgspec(tokenizer, schema, reply):
    value, sent = _run(tokenizer, schema, reply)
    assert sent == msgspec.json.schema(schema)
    assert value == msgspec.json.decode(reply, type=schema)


def test_a_type_neither_describes_is_refused_naming_both():
    class Opaque:
        pass

    with pytest.raises(
        ValueError, match=r"(?s)gen\(.x.\): json_schema must be .*msgspec: .*pydantic: "
    ):
        gen("x", json_schema=Opaque)


def test_json_pieces_take_pydantic_types_and_captures_decode_into_them():
    grammar = "order: " + capture(json(Order), "order")
    text = 'order: {"items":[{"name":"jam","qty":3}],"rush":false}'
    assert grammar.captures(text) == {"order": Order(items=[Item(name="jam", qty=3)], rush=False)}
    listed = capture(json(list[Item]), "items")
    assert listed.captures('[{"name":"a","qty":1}]') == {"items": [Item(name="a", qty=1)]}


def test_a_model_constrains_the_tiny_model(engine):
    @program
    def p(s):
        s += "Order as JSON: " + gen("order", json_schema=Order, max_tokens=200)

    schema = pydantic.TypeAdapter(Order).json_schema()
    for seed in range(3):
        state = p.run(backend=LocalBackend(engine), sampling={"temperature": 1.0, "seed": seed})
        text = state.meta("order")["text"]
        jsonschema.validate(stdjson.loads(text), schema)  # the model's text, by the reference
        assert state["order"] == Order.model_validate_json(text)


def _python(code: str, *, without_pydantic: bool = False) -> subprocess.CompletedProcess:
    block = "import sys; sys.modules['pydantic'] = None\n" if without_pydantic else ""
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True)


def test_import_braid_does_not_import_pydantic():
    code = """
import sys, msgspec
import braid
from braid import capture, gen, json, one_of

class S(msgspec.Struct):
    a: int

gen("x", json_schema=S)
gen("y", grammar=one_of("a", "b") + capture(json(S), "s"))
assert "pydantic" not in sys.modules, "pydantic was imported"
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr


def test_without_pydantic_a_type_msgspec_cannot_describe_says_so():
    code = """
import msgspec
from braid import gen

class Opaque:
    pass

class S(msgspec.Struct):
    a: int

gen("ok", json_schema=S)  # msgspec's types need no pydantic
try:
    gen("x", json_schema=Opaque)
except ValueError as e:
    print(e)
"""
    done = _python(code, without_pydantic=True)
    assert done.returncode == 0, done.stderr
    assert "msgspec: " in done.stdout and "pydantic is not installed" in done.stdout
