"""What a program appends to its state: gen, select and chat roles."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from braid.grammars.constraints import dtype_constraint
from braid.interpreter.choices import METHODS
from braid.interpreter.ir import Gen, Role, Select
from braid.runtime.sampling_params import SamplingParams

_SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
_DTYPE_DECODERS: dict[type, Callable[[str], Any]] = {
    int: int,
    float: float,
    bool: lambda text: text == "True",
    str: json.loads,  # the dtype's regex is a JSON string literal
}


def gen(
    name: str | None = None,
    *,
    dtype: type | None = None,
    json_schema: Any = None,
    return_logprobs: bool = False,
    **sampling: Any,
) -> Gen:
    """Generate text into `state[name]`.

    `sampling` takes any SamplingParams field (max_tokens, stop, temperature, top_p, top_k,
    min_p, penalties, seed, regex, choices, grammar, ...); what it leaves out comes from the
    program's defaults, then SamplingParams' own. `dtype` (int, float, bool, str) constrains
    the text to a literal of that type and stores the value; `json_schema` takes a dict,
    JSON text, or a type msgspec can describe (msgspec.Struct, dataclass, TypedDict, ...),
    whose value is then decoded into that type. `return_logprobs` puts each token's logprob
    in `state.meta(name)["logprobs"]`.
    """
    unknown = sorted(set(sampling) - _SAMPLING_FIELDS)
    if unknown:
        raise TypeError(
            f"gen({name!r}): unknown parameter {unknown[0]!r}; it takes dtype, json_schema, "
            f"return_logprobs and the SamplingParams fields: {', '.join(sorted(_SAMPLING_FIELDS))}"
        )
    if sampling.get("n", 1) != 1:
        raise ValueError(f"gen({name!r}): n must be 1; fork the state for several samples")
    decode = None
    if json_schema is not None:
        json_schema, decode = _schema(name, json_schema)
        sampling["json_schema"] = json_schema
    if dtype is not None:
        if any(k in sampling for k in ("regex", "json_schema", "choices", "grammar")):
            raise ValueError(f"gen({name!r}): dtype cannot be combined with another constraint")
        sampling["regex"] = dtype_constraint(dtype).pattern
        decode = _DTYPE_DECODERS[dtype]
    if return_logprobs:
        sampling["logprobs"] = True
    check_sampling(sampling, f"gen({name!r})")
    return Gen(name, sampling, decode)


def select(name: str | None, choices: list[str], method: str = "token_length_normalized") -> Select:
    """Append the choice the model scores best and store it in `state[name]`.

    All choices are scored in one request tree (logprobs of their tokens, no sampling).
    `method`: "token_length_normalized" (mean token logprob), "greedy" (the choice a greedy
    decoder follows furthest) or "unconditional_likelihood_normalized" (mean gain over the
    choice's logprobs without the context).
    """
    choices = list(choices) if not isinstance(choices, str) else None
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"select({name!r}): choices must be a non-empty list of non-empty strings")
    if len(set(choices)) != len(choices):
        raise ValueError(f"select({name!r}): choices must be distinct")
    if method not in METHODS:
        raise ValueError(f"select({name!r}): unknown method {method!r}; one of {list(METHODS)}")
    return Select(name, tuple(choices), method)


def system(*parts: Any) -> Role:
    """A system message made of text, gen and select parts."""
    return _role("system", parts)


def user(*parts: Any) -> Role:
    """A user message made of text, gen and select parts."""
    return _role("user", parts)


def assistant(*parts: Any) -> Role:
    """An assistant message made of text, gen and select parts."""
    return _role("assistant", parts)


def check_sampling(sampling: dict[str, Any], where: str) -> SamplingParams:
    """Validate SamplingParams fields (types and values), naming `where` in the error."""
    try:
        return msgspec.convert(sampling, SamplingParams)
    except msgspec.ValidationError as e:
        raise ValueError(f"{where}: {e}") from None


def _role(role: str, parts: tuple[Any, ...]) -> Role:
    for p in parts:
        if not isinstance(p, str | Gen | Select):
            raise TypeError(f"{role}(): parts must be text, gen or select, got {p!r}")
    return Role(role, parts)


def _schema(name: str | None, schema: Any) -> tuple[Any, Callable[[str], Any] | None]:
    """The schema to constrain with, and a decoder when it was given as a type."""
    if isinstance(schema, dict | str):
        return schema, None
    try:
        described = msgspec.json.schema(schema)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"gen({name!r}): json_schema must be a dict, JSON text, or a type msgspec can "
            f"describe (msgspec.Struct, dataclass, TypedDict, ...): {e}"
        ) from None
    decoder = msgspec.json.Decoder(schema)
    return described, decoder.decode
