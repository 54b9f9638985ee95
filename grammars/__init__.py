"""Constraints (regex, JSON schema, choices, EBNF) -> token bitmasks (the grammars issue)."""
