"""EBNF (lark) grammars as token-level matchers, with byte automata for their terminals."""
