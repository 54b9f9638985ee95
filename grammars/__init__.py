"""Constraints (regex, JSON schema, choices, EBNF, tool calls) compiled into token bitmasks.

`compile(constraint, vocab)` gives a Grammar; `Grammar.matcher()` tracks one request.
"""

from braid._lazy import lazy_exports

# Exported names -> their module, imported on first use: the compile worker process imports
# grammars.jobs, and importing this package must not pull in torch and transformers
# (seconds) before it can serve its first constraint.
_EXPORTS = {
    "CompileQueueFull": "braid.grammars.compiling.compiler",
    "GrammarCompiler": "braid.grammars.compiling.compiler",
    "compile": "braid.grammars.compiling.compiler",
    "CharPattern": "braid.grammars.regex.char_regex",
    "CharRegex": "braid.grammars.regex.char_regex",
    "AnyText": "braid.grammars.constraints",
    "COMPACT": "braid.grammars.constraints",
    "JSON_WHITESPACE": "braid.grammars.constraints",
    "Choices": "braid.grammars.constraints",
    "Constraint": "braid.grammars.constraints",
    "Ebnf": "braid.grammars.constraints",
    "JsonSchema": "braid.grammars.constraints",
    "Regex": "braid.grammars.constraints",
    "ToolCalls": "braid.grammars.constraints",
    "ToolSchema": "braid.grammars.constraints",
    "dtype_constraint": "braid.grammars.constraints",
    "Grammar": "braid.grammars.matcher",
    "Matcher": "braid.grammars.matcher",
    "MatcherError": "braid.grammars.matcher",
    "allocate_bitmask": "braid.grammars.matcher",
    "bitmask_words": "braid.grammars.matcher",
    "TokenVocabulary": "braid.grammars.vocabulary",
    "build_vocabulary": "braid.grammars.vocabulary",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
