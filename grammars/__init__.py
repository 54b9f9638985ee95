"""Constraints (regex, JSON schema, choices, EBNF) compiled into token bitmasks.

`compile(constraint, vocab)` gives a Grammar; `Grammar.matcher()` tracks one request.
"""

from importlib import import_module

# Exported names -> their module, imported on first use: the compile worker process imports
# grammars.index_builder, and importing this package must not pull in torch and transformers
# (seconds) before it can serve its first constraint.
_EXPORTS = {
    "GrammarCompiler": "grammars.compiler",
    "compile": "grammars.compiler",
    "CharPattern": "grammars.char_regex",
    "CharRegex": "grammars.char_regex",
    "Choices": "grammars.constraints",
    "Constraint": "grammars.constraints",
    "Ebnf": "grammars.constraints",
    "JsonSchema": "grammars.constraints",
    "Regex": "grammars.constraints",
    "dtype_constraint": "grammars.constraints",
    "Grammar": "grammars.matcher",
    "Matcher": "grammars.matcher",
    "MatcherError": "grammars.matcher",
    "allocate_bitmask": "grammars.matcher",
    "bitmask_words": "grammars.matcher",
    "TokenVocabulary": "grammars.vocabulary",
    "build_vocabulary": "grammars.vocabulary",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grammars' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
