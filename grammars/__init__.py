"""Constraints (regex, JSON schema, choices, EBNF) compiled into token bitmasks.

`compile(constraint, vocab)` gives a Grammar; `Grammar.matcher()` tracks one request.
"""

from grammars.compile import GrammarCompiler, compile
from grammars.constraints import Choices, Constraint, Ebnf, JsonSchema, Regex, dtype_constraint
from grammars.matcher import Grammar, Matcher, allocate_bitmask, bitmask_words
from grammars.vocabulary import TokenVocabulary, build_vocabulary

__all__ = [
    "Choices",
    "Constraint",
    "Ebnf",
    "Grammar",
    "GrammarCompiler",
    "JsonSchema",
    "Matcher",
    "Regex",
    "TokenVocabulary",
    "allocate_bitmask",
    "bitmask_words",
    "build_vocabulary",
    "compile",
    "dtype_constraint",
]
