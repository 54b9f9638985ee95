"""Regexes as token matchers: outlines-core indexes, the lazy automaton for large ones,
character automata for stop regexes and EBNF terminals.
"""
