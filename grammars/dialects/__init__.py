"""The grammar dialects clients send, read into braid's grammars.

One `grammar` text, three dialects told apart by their syntax:
- GBNF (llama.cpp's `grammar`, XGrammar's EBNF behind SGLang's `ebnf` and vLLM's
  `grammar`): rules written `name ::= ...`.
- llguidance's lark (guidance's SglangModel and VLLMModel): lark with `%llguidance`,
  `%json`, `%regex` or rule attributes `name[capture, ...]:`.
- lark itself (braid's own `grammar`, outlines' CFG): read by lark (grammars/ebnf).

The first two are read into grammar nodes (tree.py) and compile to one regex where no rule
recurses (the lazy automaton's masks), else to lark text for grammars/ebnf.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from braid.grammars.constraints import COMPACT, JsonSchema
from braid.grammars.dialects import gbnf, llguidance
from braid.grammars.dialects.llguidance import Attributes
from braid.grammars.dialects.tree import Rules

_GBNF = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_\-.]*\s*::=", re.M)


def dialect(text: str) -> str:
    """'gbnf', 'llguidance' or 'lark'."""
    if _GBNF.search(text):
        return "gbnf"
    return "llguidance" if llguidance.is_llguidance(text) else "lark"


def read(text: str) -> Rules | None:
    """The grammar's rules, or None for lark text (grammars/ebnf reads it as it is)."""
    kind = dialect(text)
    if kind == "gbnf":
        return gbnf.read(text)
    if kind == "llguidance":
        return llguidance.read(text)[0]
    return None


@lru_cache(maxsize=256)  # SamplingParams reads it at each construction and copy
def reply_attributes(text: str) -> Attributes:
    """What the grammar sets on the whole reply (llguidance's max_tokens, temperature and
    stop on the rule that is the reply); nothing for the other dialects."""
    if dialect(text) != "llguidance":
        return Attributes()
    return llguidance.reply_attributes(text)


# llguidance's JSON options (guidance writes them into every %json schema, under
# "x-guidance"), and how braid's JsonSchema writes each.
_JSON_OPTIONS = {
    "whitespace_flexible",
    "whitespace_pattern",
    "item_separator",
    "key_separator",
    "coerce_one_of",
    "lenient",
}


def json_constraint(schema_text: str) -> JsonSchema:
    """An embedded schema's constraint, with llguidance's "x-guidance" options: the
    separators it writes (guidance's ", " and ": ") and no other whitespace, or flexible
    whitespace; without options, JsonSchema's default whitespace."""
    schema = json.loads(schema_text)
    options = schema.pop("x-guidance", None) if isinstance(schema, dict) else None
    if options is None:
        return JsonSchema.of(schema)
    if not isinstance(options, dict) or not set(options) <= _JSON_OPTIONS:
        unknown = sorted(set(options) - _JSON_OPTIONS) if isinstance(options, dict) else options
        raise ValueError(
            f"llguidance grammar: %json x-guidance options {unknown} are not supported"
        )
    if options.get("lenient"):
        raise ValueError("llguidance grammar: %json lenient mode is not supported")
    if options.get("whitespace_flexible"):
        pattern = options.get("whitespace_pattern") or r"[ \t\n\r]*"
        return JsonSchema.of(schema, whitespace=pattern)
    separators = (options.get("item_separator", ","), options.get("key_separator", ":"))
    return JsonSchema.of(schema, whitespace=COMPACT, separators=separators)
