"""What a program appends to its state: gen, select and chat roles.

gen, select and `program.run` also take SGLang's keywords (max_new_tokens, return_logprob,
choices_method, ...); they are mapped onto braid's here, in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from braid.compose import Grammar, gen_grammar
from braid.grammars.constraints import dtype_constraint
from braid.interpreter.choices import METHODS
from braid.interpreter.ir import Gen, Parts, Role, Select
from braid.json_types import schema_and_decoder
from braid.runtime.protocol import SamplingParams

_SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
_DTYPE_DECODERS: dict[type, Callable[[str], Any]] = {
    int: int,
    float: float,
    bool: lambda text: text == "True",
    str: json.loads,  # the dtype's regex is a JSON string literal
}

# SGLang's names for SamplingParams fields.
_SGLANG_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "return_logprob": "logprobs",
    "top_logprobs_num": "top_logprobs",
}
# SGLang's detokenizer switches: braid implements them at SGLang's defaults only.
_SGLANG_FIXED = {"skip_special_tokens": True, "spaces_between_special_tokens": True}
# Accepted, no effect: get_meta_info gives each token's text wherever the backend knows it.
_SGLANG_IGNORED = frozenset({"return_text_in_logprobs"})
_SGLANG_DTYPES = {"int": int, "float": float, "bool": bool, "str": str, "string": str}
# Every keyword that sets sampling: braid's fields and SGLang's names (logprob_start_len
# becomes prompt_logprobs_from, shifted: see sampling_fields).
SAMPLING_KEYWORDS = _SAMPLING_FIELDS.union(
    _SGLANG_NAMES, _SGLANG_FIXED, _SGLANG_IGNORED, {"logprob_start_len"}
)


def sampling_fields(given: dict[str, Any], where: str) -> dict[str, Any]:
    """SamplingParams fields from keywords in braid's or SGLang's names; a None value is not
    given (SGLang passes None for what it leaves to the defaults)."""
    fields: dict[str, Any] = {}
    for key, value in given.items():
        if value is None or key in _SGLANG_IGNORED:
            continue
        if key in _SGLANG_FIXED:
            if value != _SGLANG_FIXED[key]:
                raise ValueError(f"{where}: {key} must be {_SGLANG_FIXED[key]} on braid")
            continue
        if key == "logprob_start_len":
            if value < 0:  # SGLang's "no prompt logprobs"
                continue
            # Counted from the prompt's first token, which has no logprob.
            key, value = "prompt_logprobs_from", max(1, value)
        if key == "top_k" and value == -1:  # SGLang's "off"
            value = 0
        if key == "reasoning" and type(value) is int:  # reasoning=N: think N tokens at most
            if given.get("thinking_budget") is not None:
                raise TypeError(
                    f"{where}: reasoning={value} is a thinking budget; so is "
                    "thinking_budget: give one"
                )
            fields["thinking_budget"], value = value, True
        field = _SGLANG_NAMES.get(key, key)
        if field not in _SAMPLING_FIELDS:
            raise TypeError(
                f"{where}: unknown parameter {key!r}; sampling takes the SamplingParams fields "
                f"({', '.join(sorted(_SAMPLING_FIELDS))}) and SGLang's names for them "
                f"({', '.join(sorted(SAMPLING_KEYWORDS - _SAMPLING_FIELDS))})"
            )
        if field in fields:
            raise TypeError(f"{where}: {field} is given twice (in braid's and SGLang's names)")
        fields[field] = value
    return fields


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    *,
    dtype: type | str | None = None,
    json_schema: Any = None,
    return_logprobs: bool = False,
    choices_method: str | Callable | None = None,
    lora: str | None = None,
    reasoning: bool | int | None = None,
    **sampling: Any,
) -> Gen | Select:
    """Generate text into `state[name]`.

    `sampling` takes any SamplingParams field (max_tokens, stop, temperature, top_p, top_k,
    min_p, penalties, seed, regex, grammar, ...) or SGLang's name for it (max_new_tokens,
    min_new_tokens, return_logprob, top_logprobs_num, logprob_start_len); what it leaves out
    comes from the program's defaults, then SamplingParams' own. `dtype` (int, float, bool,
    str, or their names) constrains the text to a literal of that type and stores the value;
    `json_schema` takes a dict, JSON text, or a type msgspec can describe (msgspec.Struct,
    dataclass, TypedDict, ...) or pydantic's TypeAdapter takes (BaseModel, list[Model], ...),
    whose value is then decoded into that type; the document may hold the whitespace models
    write (bounded), none with `json_compact=True`. `grammar` also takes a grammar composed with
    braid.compose (`"Name: " + capture(regex("[A-Z][a-z]+"), "who")`): its one regex
    constrains the text, which stays the value, and each capture sets its own variable.
    `return_logprobs` puts each token's logprob in `state.meta(name)["logprobs"]`.
    With `choices` it is `select(name, choices, choices_method)`, as in SGLang: the choices
    are scored, not sampled. `lora`: the name of a LoRA adapter the backend serves, for this
    gen (default: the program's, `run(lora=...)`).

    `reasoning=True` lets a model that thinks write its thought first, in the same request:
    the gen's constraint (regex, json_schema, dtype, choices, ...) then holds the answer
    after the thought. `state[name]` gets the answer (decoded as without a thought),
    `state[name + "_reasoning_content"]` and `state.meta(name)["reasoning_content"]` the
    thought, `meta(name)["reasoning_tokens"]` its length in tokens (markers included); the
    program's text keeps the output as the model wrote it, thought and all (and
    `state.text_iter(name)` streams it so). `reasoning=N` bounds the thought to N tokens
    (thinking_budget=N; `thinking_budget_mode` "soft" or "hard"); 0 answers at once. A model
    without a reasoning format raises ValueError; a backend that cannot tell the format
    (RemoteBackend, OpenAIBackend) raises NotImplementedError.
    """
    where = f"gen({name!r})"
    given = {"max_tokens": max_tokens, "reasoning": reasoning, **sampling}
    sampling = sampling_fields(given, where)
    if "choices" in sampling:
        if lora is not None:
            raise ValueError(f"{where}: a select runs under the program's adapter (run(lora=))")
        return _gen_choices(name, sampling, dtype, json_schema, choices_method)
    if choices_method is not None:
        raise ValueError(f"{where}: choices_method needs choices")
    if sampling.get("n", 1) != 1:
        raise ValueError(f"{where}: n must be 1; fork the state for several samples")
    decode = None
    if isinstance(sampling.get("regex"), Grammar):
        raise ValueError(f"{where}: regex takes a pattern; a composed grammar goes in grammar=")
    if isinstance(sampling.get("grammar"), Grammar):
        if "regex" in sampling or json_schema is not None:
            raise ValueError(f"{where}: a composed grammar cannot join regex or json_schema")
        sampling["regex"], decode = gen_grammar(name, sampling.pop("grammar"))
    if json_schema is not None:
        json_schema, decode = schema_and_decoder(json_schema, where)
        sampling["json_schema"] = json_schema
    if dtype is not None:
        dtype = _SGLANG_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if any(k in sampling for k in ("regex", "json_schema", "grammar")):
            raise ValueError(f"{where}: dtype cannot be combined with another constraint")
        sampling["regex"] = dtype_constraint(dtype).pattern
        decode = _DTYPE_DECODERS[dtype]
    if return_logprobs:
        sampling["logprobs"] = True
    check_sampling(sampling, where)
    return Gen(name, sampling, decode, lora)


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    method: str | Callable | float = "token_length_normalized",
    choices_method: str | Callable | None = None,
    *,
    temperature: float | None = None,
    reasoning: bool | int | None = None,
) -> Select | Gen:
    """Append the choice the model scores best and store it in `state[name]`.

    All choices are scored in one request tree (logprobs of their tokens, no sampling).
    `method`: "token_length_normalized" (mean token logprob), "greedy" (the choice a greedy
    decoder follows furthest) or "unconditional_likelihood_normalized" (mean gain over the
    choice's logprobs without the context), or the method itself (`braid.greedy_token_selection`
    and the others SGLang names). `choices_method` is SGLang's keyword for it; `temperature`
    is SGLang's too and must be 0, since nothing is scored at another. SGLang's positional
    order works as well, `select(name, choices, temperature, choices_method)`: a number where
    the method goes is SGLang's temperature (no method is a number).

    `reasoning=True` (or N, a thinking budget) lets the model think first: scoring cannot
    follow a thought it has not written, so the thought is generated (sampled as the
    program's gens are) and the choice written after it under a choices constraint, in the
    same request; the thought goes where a reasoning gen's does (see `gen`).
    """
    where = f"select({name!r})"
    choices = _checked_choices(choices, where)
    if isinstance(method, int | float) and not isinstance(method, bool):
        if temperature is not None:
            raise TypeError(f"{where}: temperature is given twice (third positional and keyword)")
        temperature, method = method, "token_length_normalized"
    if temperature is not None and temperature != 0:
        raise ValueError(f"{where}: temperature must be 0: the choices are scored, not sampled")
    method = choices_method if choices_method is not None else method
    if callable(method):  # SGLang's method objects are braid's methods
        method = next((key for key, m in METHODS.items() if m is method), method)
    if method not in METHODS:
        raise ValueError(f"{where}: unknown method {method!r}; one of {list(METHODS)}")
    if reasoning is not None and reasoning is not False:
        if method != "token_length_normalized":
            raise ValueError(
                f"{where}: a choice made after a thought is written, not scored by a method"
            )
        return _choice_after_thought(name, choices, {"reasoning": reasoning}, where)
    return Select(name, choices, method)


def _checked_choices(choices: Sequence[str] | None, where: str) -> tuple[str, ...]:
    listed = list(choices) if choices is not None and not isinstance(choices, str) else None
    if not listed or not all(isinstance(c, str) and c for c in listed):
        raise ValueError(f"{where}: choices must be a non-empty list of non-empty strings")
    if len(set(listed)) != len(listed):
        raise ValueError(f"{where}: choices must be distinct")
    return tuple(listed)


def system(*parts: Any) -> Role:
    """A system message made of text, gen and select parts."""
    return role_message("system", parts)


def user(*parts: Any) -> Role:
    """A user message made of text, gen and select parts."""
    return role_message("user", parts)


def assistant(*parts: Any, thinking: bool | None = None) -> Role:
    """An assistant message made of text, gen and select parts.

    It opens as the chat template's generation prompt does where a gen writes its first text
    (on a model that thinks, free to think where the template's default is: Qwen3, SmolLM3,
    DeepSeek-R1), and as a turn of a rendered history where the program does (a few-shot
    answer). `thinking=False` renders that generation prompt with enable_thinking=False (the
    template's own switch: ValueError where it has none), `thinking=True` with it True.
    """
    return role_message("assistant", parts, thinking)


def role_message(role: str, parts: tuple[Any, ...], thinking: bool | None = None) -> Role:
    """A `role` message of text, gen and select parts; parts joined with `+` count as theirs.
    `thinking`: an assistant message's (see `assistant`)."""
    flat = [item for p in parts for item in (p.items if isinstance(p, Parts) else (p,))]
    for p in flat:
        if not isinstance(p, str | Gen | Select):
            raise TypeError(f"{role}(): parts must be text, gen or select, got {p!r}")
    return Role(role, tuple(flat), thinking)


def check_sampling(sampling: dict[str, Any], where: str) -> SamplingParams:
    """Validate SamplingParams fields (types and values), naming `where` in the error."""
    try:
        return msgspec.convert(sampling, SamplingParams)
    except msgspec.ValidationError as e:
        raise ValueError(f"{where}: {e}") from None


def _gen_choices(
    name: str | None,
    sampling: dict[str, Any],
    dtype: Any,
    json_schema: Any,
    choices_method: str | Callable | None,
) -> Select | Gen:
    """SGLang's gen(name, choices=...): a select. The sampling fields are checked, then left
    unused but for temperature, which select checks. With reasoning: the choice written after
    a thought, under the gen's sampling fields."""
    where = f"gen({name!r})"
    if dtype is not None or json_schema is not None:
        raise ValueError(f"{where}: choices cannot be combined with dtype or json_schema")
    check_sampling(sampling, where)
    if sampling.get("reasoning"):
        if choices_method is not None:
            raise ValueError(
                f"{where}: a choice made after a thought is written, not scored by a method"
            )
        choices = _checked_choices(sampling["choices"], where)
        return _choice_after_thought(name, choices, sampling, where)
    method = choices_method or "token_length_normalized"
    temperature = sampling.get("temperature", 0.0)
    return select(name, sampling["choices"], method, temperature=temperature)


def _choice_after_thought(
    name: str | None, choices: Sequence[str], given: dict[str, Any], where: str
) -> Gen:
    """A gen that thinks, then writes one of `choices` under a choices constraint."""
    sampling = sampling_fields({**given, "choices": list(choices)}, where)
    check_sampling(sampling, where)

    def one_of(text: str) -> str:
        if text not in choices:  # cut short by max_tokens
            raise ValueError(f"{text!r} is not one of the choices")
        return text

    return Gen(name, sampling, one_of)
