"""The regex of a StructuralTag (grammars/structural_tag.py): one regex for braid's regex path,
as XGrammar's grammar of the same tag would read it. Kept free of torch: the compile worker
runs it.

Free text is what XGrammar's matcher scans with its words' Aho-Corasick automaton
(grammars/regex/excluding.py): any_text is text containing none of its excludes; in
triggered_tags and dispatch the first trigger (pattern) that occurs in the text ends the free
text there and starts one of its tags (rules), and after the tag the scan starts afresh
(with `loop`, or unless stop_after_first). As in XGrammar, any_text and triggered_tags also
exclude the end strings of the tag they are nearest inside, so a thought `tag("<think>",
any_text, "</think>")` ends at its first "</think>".

JSON is written compact, properties in the schema's order (braid's JSON-schema regex,
grammars/json_schema/convert.py); errors name the path of the format they come from.
"""

from __future__ import annotations

import json
from typing import Any

from braid.grammars import dialects
from braid.grammars.compiling.constraint_regex import escape, json_schema_regex
from braid.grammars.constraints import JSON_WHITESPACE, JsonSchema
from braid.grammars.regex.excluding import excluding, scan
from braid.grammars.structural_tag import StructuralTag, trigger_of

ROOT = "structural_tag.format"  # how errors name the tag's format


def structural_tag_regex(tag: StructuralTag) -> str:
    """The regex of the outputs `tag` allows."""
    return _regex(json.loads(tag.format), ROOT, ())


def _regex(fmt: dict[str, Any], path: str, ends: tuple[str, ...]) -> str:
    """The regex of one format; `ends`: the end strings of the nearest tag around it."""
    kind = fmt["type"]
    if kind == "const_string":
        return escape(fmt["value"])
    if kind == "json_schema":
        count = fmt["max_whitespace_cnt"]
        whitespace = JSON_WHITESPACE if count is None else rf"[ \n\t]{{0,{count}}}"
        return _schema(fmt["json_schema"], f"{path}.json_schema", whitespace)
    if kind == "regex":
        return _group(fmt["pattern"])
    if kind == "grammar":
        return _grammar(fmt["grammar"], f"{path}.grammar")
    if kind == "any_text":
        words = [*fmt["excludes"], *ends]
        return excluding(words) if words else r"[\s\S]*"
    if kind in ("sequence", "or"):
        parts = [_regex(e, f"{path}.elements[{i}]", ends) for i, e in enumerate(fmt["elements"])]
        return "".join(map(_group, parts)) if kind == "sequence" else _alt(parts)
    if kind in ("optional", "plus", "star", "repeat"):
        return _repeated(fmt, _regex(fmt["content"], f"{path}.content", ends))
    if kind == "tag":
        return _tag(fmt, path)
    if kind == "triggered_tags":
        return _triggered_tags(fmt, path, ends)
    if kind == "tags_with_separator":
        return _tags_with_separator(fmt, path)
    return _dispatch(fmt, path, ends)


def _schema(schema: dict[str, Any] | bool, path: str, whitespace: str = JSON_WHITESPACE) -> str:
    try:
        return json_schema_regex(JsonSchema.of(schema, whitespace))
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to compile") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _grammar(text: str, path: str) -> str:
    """A GBNF grammar's regex, its rules inlined (grammars/dialects), JSON inside as braid's."""
    rules = dialects.read(text)
    for schema in rules.json_schemas():
        rules.json_regex[schema] = _schema(json.loads(schema), path)
    regex = rules.regex()
    if regex is None:
        raise ValueError(
            f"{path}: a rule recurses (or inlining passes its bound), which the one regex of a "
            "structural tag cannot hold"
        )
    return regex


def _repeated(fmt: dict[str, Any], content: str) -> str:
    if content == "":
        return ""
    if fmt["type"] == "repeat":
        high = "" if fmt["max"] == -1 else fmt["max"]
        times = f"{{{fmt['min']},{high}}}"
    else:
        times = {"optional": "?", "plus": "+", "star": "*"}[fmt["type"]]
    return f"({content}){times}"


def _tag(fmt: dict[str, Any], path: str, skip: int = 0) -> str:
    """begin (without its first `skip` characters: the trigger that began it), content, end;
    the content's free text stops at the end strings."""
    ends = tuple(e for e in fmt["end"] if e)
    content = _regex(fmt["content"], f"{path}.content", ends)
    return escape(fmt["begin"][skip:]) + _group(content) + _alt([escape(e) for e in fmt["end"]])


def _triggered_tags(fmt: dict[str, Any], path: str, ends: tuple[str, ...]) -> str:
    tags = fmt["tags"]
    whole = _alt([_tag(t, f"{path}.tags[{i}]") for i, t in enumerate(tags)])
    if fmt["at_least_one"] and fmt["stop_after_first"]:
        return whole
    rests: dict[str, list[str]] = {}
    for i, tag in enumerate(tags):
        trigger = trigger_of(tag["begin"], fmt["triggers"], f"{path}.tags[{i}].begin")
        rests.setdefault(trigger, []).append(_tag(tag, f"{path}.tags[{i}]", len(trigger)))
    free = _free_text(rests, [*fmt["excludes"], *ends], not fmt["stop_after_first"])
    return whole + _group(free) if fmt["at_least_one"] else free


def _dispatch(fmt: dict[str, Any], path: str, ends: tuple[str, ...]) -> str:
    """Free text where each pattern starts its rule's format (XGrammar's dispatch excludes
    only its own excludes, not the end strings around it)."""
    rests: dict[str, list[str]] = {}
    for i, (pattern, rule) in enumerate(fmt["rules"]):
        rests.setdefault(pattern, []).append(_regex(rule, f"{path}.rules[{i}][1]", ends))
    return _free_text(rests, fmt["excludes"], fmt["loop"])


def _free_text(rests: dict[str, list[str]], excludes: list[str], loop: bool) -> str:
    """Free text scanned for the triggers (rests' keys) and excludes, each trigger followed
    by one of its rests: again and again with `loop`, else at most once, ending the text."""
    scanned = scan(list(rests), excludes)
    dispatched = [
        _group(until) + _alt(rests[t]) for t, until in scanned.until.items() if rests.get(t)
    ]
    if not dispatched:
        return scanned.free
    if loop:
        return f"({_alt(dispatched)})*" + _group(scanned.free)
    return _alt([scanned.free, _alt(dispatched)])


def _tags_with_separator(fmt: dict[str, Any], path: str) -> str:
    tag = _alt([_tag(t, f"{path}.tags[{i}]") for i, t in enumerate(fmt["tags"])])
    if not fmt["stop_after_first"]:
        tag = f"{tag}({escape(fmt['separator'])}{tag})*"
    return tag if fmt["at_least_one"] else f"({tag})?"


def _group(regex: str) -> str:
    """`regex` safe to concatenate (the empty regex stays empty)."""
    return f"({regex})" if regex else ""


def _alt(options: list[str]) -> str:
    """The regex of any one of `options` (an empty one makes the whole optional)."""
    nonempty = list(dict.fromkeys(o for o in options if o))
    if not nonempty:
        return ""
    body = "(" + "|".join(map(_group, nonempty)) + ")"
    return body + "?" if "" in options else body
