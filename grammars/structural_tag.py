"""Structural tags: XGrammar's protocol for output that mixes free text with tagged, constrained
regions (tool calls, thoughts), which SGLang and vLLM take as `response_format: {"type":
"structural_tag", ...}`. This module is the constraint value and the check of its tree;
grammars/structural_tag_regex.py compiles it to one regex.

A tag is `{"type": "structural_tag", "format": FORMAT}`, FORMAT one of XGrammar's formats
nested to any depth, or the legacy form `{"structures": [{"begin", "schema", "end"}, ...],
"triggers": [...]}` (free text where each trigger starts one of the structures, as
`triggered_tags`). braid compiles every format whose language is regular:

    const_string   value                     json_schema  json_schema (style "json")
    regex          pattern (Python syntax)   any_text     excludes
    grammar        grammar (GBNF, as XGrammar's EBNF; no rule may recurse)
    sequence, or   elements                  optional, plus, star, repeat (min, max)  content
    tag            begin, content, end (a string or a list of them)
    triggered_tags triggers, tags, at_least_one, stop_after_first, excludes
    tags_with_separator  tags, separator, at_least_one, stop_after_first
    dispatch       rules ([pattern, format] pairs), loop, excludes

and refuses, naming the field, what it cannot honour: the token-level formats (token,
exclude_token, any_tokens, token_triggered_tags, token_dispatch, and a tag's begin or end
given as a token), a `grammar` whose rules recurse (not a regex), the XML styles of
json_schema and qwen_xml_parameter, any_order, and any_text's max_tokens and max_chars.
Every field is checked: an unknown one is an error, as is a format without its `type`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Formats XGrammar defines that braid cannot compile to a regex, and why.
_REFUSED = {
    "qwen_xml_parameter": "braid writes JSON arguments only (json_schema style 'json')",
    "token": "braid's structural tags are text, not token ids",
    "exclude_token": "braid's structural tags are text, not token ids",
    "any_tokens": "braid's structural tags are text, not token ids",
    "token_triggered_tags": "braid's structural tags are text, not token ids",
    "token_dispatch": "braid's structural tags are text, not token ids",
}
# A repeat's bounds: each repetition is a copy of its content in the automaton.
MAX_REPEAT = 1000

Check = Callable[[Any, str], Any]  # (value, path) -> its normalized form, or ValueError


@dataclass(frozen=True)
class StructuralTag:
    """Output must be in the language of this structural tag's format.

    `format` is the checked format tree as compact JSON text with every field explicit (the
    legacy form as the triggered_tags it means), so equal tags share one compiled grammar;
    build it with `StructuralTag.of(dict_or_text)`."""

    format: str

    @classmethod
    def of(cls, tag: dict[str, Any] | str) -> StructuralTag:
        """The tag checked whole; a ValueError names the path of what is wrong, e.g.
        "structural_tag.format.tags[1].content.type: unknown format 'foo'"."""
        # Imported here: constraints.py's Constraint union imports this module.
        from braid.grammars.constraints import MAX_SCHEMA_DEPTH, json_depth

        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except json.JSONDecodeError as e:
                raise ValueError(f"structural_tag is not valid JSON: {e}") from None
            except RecursionError:
                raise ValueError("structural_tag is nested too deeply") from None
        if not isinstance(tag, dict):
            raise ValueError(f"structural_tag must be an object, got {type(tag).__name__}")
        if json_depth(tag) > MAX_SCHEMA_DEPTH:
            raise ValueError(f"structural_tag is nested more than {MAX_SCHEMA_DEPTH} levels deep")
        return cls(json.dumps(_top(tag, "structural_tag"), separators=(",", ":")))


def _top(tag: dict[str, Any], path: str) -> dict[str, Any]:
    if tag.get("type", "structural_tag") != "structural_tag":
        raise ValueError(f"{path}.type: must be 'structural_tag', got {tag['type']!r}")
    rest = {k: v for k, v in tag.items() if k != "type"}
    if "format" in rest:
        return _fields(rest, path, {"format": (_format, None)})["format"]
    if "structures" in rest or "triggers" in rest:
        return _legacy(rest, path)
    raise ValueError(f"{path}: needs a format (or the legacy structures and triggers)")


def _legacy(tag: dict[str, Any], path: str) -> dict[str, Any]:
    """SGLang's and vLLM's older form, as the triggered_tags it means."""
    structure = {"begin": (_string, None), "schema": (_schema, None), "end": (_string, None)}
    fields = _fields(
        tag,
        path,
        {
            "structures": (_list_of(lambda v, p: _fields(v, p, structure), non_empty=True), None),
            "triggers": (_list_of(_word, non_empty=True), None),
        },
    )
    tags = []
    for i, s in enumerate(fields["structures"]):
        trigger_of(s["begin"], fields["triggers"], f"{path}.structures[{i}].begin")
        content = {"type": "json_schema", "json_schema": s["schema"]}
        where = f"{path}.structures[{i}]"  # normalized as the tag it means (checked above)
        tags.append(_tag({"begin": s["begin"], "content": content, "end": s["end"]}, where))
    return {
        "type": "triggered_tags",
        "triggers": fields["triggers"],
        "tags": tags,
        "at_least_one": False,
        "stop_after_first": False,
        "excludes": [],
    }


# ---- formats -----------------------------------------------------------------------------------


def _format(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: a format must be an object, got {type(value).__name__}")
    kind = value.get("type")
    if kind is None:
        raise ValueError(f"{path}.type: missing (braid needs every format's type)")
    if not isinstance(kind, str):
        raise ValueError(f"{path}.type: must be a string, got {kind!r}")
    if kind in _REFUSED:
        raise ValueError(
            f"{path}.type: format {kind!r} is not supported by braid: {_REFUSED[kind]}"
        )
    if kind not in _FORMATS:
        raise ValueError(f"{path}.type: unknown format {kind!r}")
    fields = _fields({k: v for k, v in value.items() if k != "type"}, path, _FORMATS[kind])
    normalized = {"type": kind, **fields}
    _CHECKS.get(kind, lambda f, p: None)(normalized, path)
    return normalized


def _tag(value: Any, path: str) -> dict[str, Any]:
    """A tag where only a tag may stand (triggered_tags' and tags_with_separator's), its type
    implied."""
    if isinstance(value, dict) and "type" not in value:
        value = {"type": "tag", **value}
    tag = _format(value, path)
    if tag["type"] != "tag":
        raise ValueError(f"{path}.type: must be 'tag', got {tag['type']!r}")
    return tag


def _check_json_schema(fmt: dict[str, Any], path: str) -> None:
    if fmt["style"] != "json":
        raise ValueError(
            f"{path}.style: {fmt['style']!r} is not supported by braid (only 'json': braid "
            "writes JSON arguments)"
        )
    if fmt["any_order"]:
        raise ValueError(
            f"{path}.any_order: true is not supported by braid (it writes properties in the "
            "schema's order)"
        )


def _check_any_text(fmt: dict[str, Any], path: str) -> None:
    for name in ("max_tokens", "max_chars"):
        if fmt[name] is not None:
            raise ValueError(
                f"{path}.{name}: not supported by braid (a length bound on free text that "
                "excludes words is not compiled); give null"
            )


def _check_repeat(fmt: dict[str, Any], path: str) -> None:
    low, high = fmt["min"], fmt["max"]
    if not 0 <= low <= MAX_REPEAT:
        raise ValueError(f"{path}.min: must be in [0, {MAX_REPEAT}], got {low}")
    if high != -1 and not low <= high <= MAX_REPEAT:
        raise ValueError(f"{path}.max: must be -1 (unbounded) or in [min, {MAX_REPEAT}]")


def _check_triggered_tags(fmt: dict[str, Any], path: str) -> None:
    for i, tag in enumerate(fmt["tags"]):
        trigger_of(tag["begin"], fmt["triggers"], f"{path}.tags[{i}].begin")


def trigger_of(begin: str, triggers: list[str], path: str) -> str:
    """The one trigger `begin` starts with."""
    matched = [t for t in triggers if begin.startswith(t)]
    if len(matched) != 1:
        which = "no trigger" if not matched else f"several triggers ({matched})"
        raise ValueError(f"{path}: {begin!r} starts with {which}; it must start with exactly one")
    return matched[0]


# ---- field checks -----------------------------------------------------------------------------


def _fields(value: Any, path: str, spec: dict[str, tuple[Check, Any]]) -> dict[str, Any]:
    """An object's fields checked by `spec` (name -> (check, default); default None:
    required), in the spec's order; an unknown field is an error."""
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must be an object, got {type(value).__name__}")
    for name in value:
        if name not in spec:
            raise ValueError(f"{path}.{name}: unknown field")
    out = {}
    for name, (check, default) in spec.items():
        if name in value:
            out[name] = check(value[name], f"{path}.{name}")
        elif default is None:
            raise ValueError(f"{path}.{name}: missing")
        else:
            out[name] = default()
    return out


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}: must be a string, got {type(value).__name__}")
    return value


def _word(value: Any, path: str) -> str:
    if _string(value, path) == "":
        raise ValueError(f"{path}: must not be empty")
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: must be true or false, got {value!r}")
    return value


def _int(value: Any, path: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{path}: must be an integer, got {value!r}")
    return value


def _optional_count(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if _int(value, path) < 0:
        raise ValueError(f"{path}: must be >= 0 or null")
    return value


def _schema(value: Any, path: str) -> dict[str, Any] | bool:
    from braid.grammars.constraints import JsonSchema

    if not isinstance(value, (dict, bool)):
        raise ValueError(f"{path}: must be an object or a boolean, got {type(value).__name__}")
    try:
        return json.loads(JsonSchema.of(value).schema)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _pattern(value: Any, path: str) -> str:
    try:
        re.compile(_word(value, path))
    except re.error as e:
        raise ValueError(f"{path}: invalid regex: {e}") from None
    return value


def _gbnf(value: Any, path: str) -> str:
    """XGrammar's EBNF (GBNF, grammars/dialects): read now, so a bad one is named here; its
    regex is made when the tag compiles, where a rule that recurses is refused."""
    from braid.grammars import dialects

    if dialects.dialect(_word(value, path)) != "gbnf":
        raise ValueError(f"{path}: must be an EBNF grammar of `name ::= ...` rules (GBNF)")
    try:
        dialects.read(value).check()
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return value


def _ends(value: Any, path: str) -> list[str]:
    if isinstance(value, dict):
        raise ValueError(f"{path}: a token end is not supported by braid (its tags are text)")
    if isinstance(value, str):
        return [value]
    return _list_of(_string, non_empty=True)(value, path)


def _begin(value: Any, path: str) -> str:
    if isinstance(value, dict):
        raise ValueError(f"{path}: a token begin is not supported by braid (its tags are text)")
    return _string(value, path)


def _rule(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"{path}: must be a [pattern, format] pair")
    return [_word(value[0], f"{path}[0]"), _format(value[1], f"{path}[1]")]


def _list_of(check: Check, non_empty: bool = False) -> Check:
    def checked(value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise ValueError(f"{path}: must be a list, got {type(value).__name__}")
        if non_empty and not value:
            raise ValueError(f"{path}: must not be empty")
        return [check(v, f"{path}[{i}]") for i, v in enumerate(value)]

    return checked


def _false() -> bool:
    return False


# Each format's fields: name -> (check, default maker; None: required).
_FORMATS: dict[str, dict[str, tuple[Check, Any]]] = {
    "const_string": {"value": (_string, None)},
    "json_schema": {
        "json_schema": (_schema, None),
        "style": (_string, lambda: "json"),
        "any_order": (_bool, _false),
        # The whitespace in each gap between JSON tokens: at most this many characters (by
        # default JsonSchema's, grammars/constraints.py).
        "max_whitespace_cnt": (_optional_count, lambda: None),
    },
    "regex": {"pattern": (_pattern, None)},
    "grammar": {"grammar": (_gbnf, None)},
    "any_text": {
        "excludes": (_list_of(_word), list),
        "max_tokens": (_optional_count, lambda: None),
        "max_chars": (_optional_count, lambda: None),
    },
    "sequence": {"elements": (_list_of(_format, non_empty=True), None)},
    "or": {"elements": (_list_of(_format, non_empty=True), None)},
    "optional": {"content": (_format, None)},
    "plus": {"content": (_format, None)},
    "star": {"content": (_format, None)},
    "repeat": {"min": (_int, None), "max": (_int, None), "content": (_format, None)},
    "tag": {"begin": (_begin, None), "content": (_format, None), "end": (_ends, None)},
    "triggered_tags": {
        "triggers": (_list_of(_word, non_empty=True), None),
        "tags": (_list_of(_tag, non_empty=True), None),
        "at_least_one": (_bool, _false),
        "stop_after_first": (_bool, _false),
        "excludes": (_list_of(_word), list),
    },
    "tags_with_separator": {
        "tags": (_list_of(_tag, non_empty=True), None),
        "separator": (_string, None),
        "at_least_one": (_bool, _false),
        "stop_after_first": (_bool, _false),
    },
    "dispatch": {
        "rules": (_list_of(_rule, non_empty=True), None),
        "loop": (_bool, lambda: True),
        "excludes": (_list_of(_word), list),
    },
}
_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "json_schema": _check_json_schema,
    "any_text": _check_any_text,
    "repeat": _check_repeat,
    "triggered_tags": _check_triggered_tags,
}
