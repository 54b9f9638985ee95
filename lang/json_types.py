"""A JSON schema given as a type: the schema to constrain with and the decoder of its text.

msgspec describes its own Structs, dataclasses, TypedDicts and the like; pydantic describes
BaseModels and whatever its TypeAdapter takes (list[Model], Annotated[int, Field(gt=0)],
pydantic dataclasses, ...). pydantic stays optional: it is imported only for a type msgspec
cannot describe, or one that carries pydantic's constraints, which msgspec would drop
without a word (it reads Annotated[int, Field(gt=0)] as a plain integer).
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable
from typing import Any

import msgspec

# Modules whose objects in a type are constraints only pydantic reads.
_PYDANTIC_MODULES = ("pydantic", "annotated_types")


def schema_and_decoder(schema: Any, where: str) -> tuple[Any, Callable[[str], Any] | None]:
    """The schema to constrain with, and a decoder into the type when `schema` is one (None
    for a dict or JSON text, whose value stays text). ValueError naming `where` for a type
    neither msgspec nor pydantic can describe."""
    if isinstance(schema, dict | str):
        return schema, None
    if _needs_pydantic(schema):
        return _pydantic_schema(schema, where, None)
    try:
        described = msgspec.json.schema(schema)
    except (TypeError, ValueError) as e:
        return _pydantic_schema(schema, where, e)
    return described, msgspec.json.Decoder(schema).decode


def _pydantic_schema(
    schema: Any, where: str, msgspec_error: Exception | None
) -> tuple[dict, Callable[[str], Any]]:
    """pydantic's schema and validator of `schema`; `msgspec_error`: why msgspec could not
    describe it (None when pydantic was chosen first)."""
    kinds = (
        "a dict, JSON text, a type msgspec can describe (msgspec.Struct, dataclass, "
        "TypedDict, ...) or one pydantic's TypeAdapter takes (BaseModel, list[Model], ...)"
    )
    said = f"msgspec: {msgspec_error}; " if msgspec_error is not None else ""
    try:
        import pydantic
    except ImportError:
        raise ValueError(
            f"{where}: json_schema must be {kinds}; {said}pydantic is not installed"
        ) from None
    try:
        adapter = pydantic.TypeAdapter(schema)
        return adapter.json_schema(), adapter.validate_json
    except (TypeError, ValueError, pydantic.PydanticUserError) as e:
        raise ValueError(f"{where}: json_schema must be {kinds}; {said}pydantic: {e}") from None


def _needs_pydantic(schema: Any) -> bool:
    """Whether `schema` holds anything of pydantic's: a model, a pydantic dataclass, a type
    or constraint from its modules, in its arguments, metadata or field annotations. Without
    those modules imported it cannot, and nothing is walked."""
    if not any(m in sys.modules for m in _PYDANTIC_MODULES):
        return False
    seen: set[int] = set()
    stack = [schema]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:  # recursive types refer back to themselves
            continue
        seen.add(id(obj))
        kind = obj if isinstance(obj, type) else type(obj)
        if kind.__module__.split(".")[0] in _PYDANTIC_MODULES:
            return True
        if isinstance(obj, type) and hasattr(obj, "__pydantic_validator__"):
            return True  # a BaseModel or pydantic dataclass, defined in the user's module
        stack.extend(typing.get_args(obj))  # list[M], M | None, Annotated[int, Field()]
        stack.extend(_field_types(obj))
    return False


def _field_types(obj: Any) -> list[Any]:
    """The annotated field types of a class msgspec reads field by field (a dataclass,
    TypedDict, Struct or NamedTuple); none for anything else."""
    if not isinstance(obj, type) or not (
        dataclasses.is_dataclass(obj)
        or typing.is_typeddict(obj)
        or issubclass(obj, msgspec.Struct | tuple)
    ):
        return []
    try:
        return list(typing.get_type_hints(obj, include_extras=True).values())
    except Exception:  # an unresolvable forward reference: msgspec reports it itself
        return []
