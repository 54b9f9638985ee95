"""The compile worker's process: `python -m grammars.compile_worker MAX_MEMORY_MB`.

Reads a TokenVocabulary, then jobs (each with whether an outlines index is wanted), from
stdin, and writes replies, each (ok, payload or an error message), to stdout:
- a regex, JSON schema or choices: the pickled regex, then, where an index is wanted, the
  pickled index (or None: it could not be built);
- an EBNF grammar: the grammar (EbnfGrammar.dumps);
- a CharPattern (a stop regex): its pickled CharRegex.
Started and killed by grammars.compiler._Worker.
"""

from __future__ import annotations

import os
import pickle
import resource
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection


def main() -> None:
    max_memory_mb = int(sys.argv[1])
    receiver = Connection(os.dup(0), writable=False)
    sender = Connection(os.dup(1), readable=False)
    sys.stdout = sys.stderr  # stdout carries results only
    # RLIMIT_DATA counts heap and private anonymous mappings (what compiling grows), not the
    # shared libraries the interpreter maps.
    limit = max_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    vocab = receiver.recv()
    while True:
        try:
            job, index = receiver.recv()
        except EOFError:
            return
        try:
            for reply in _replies(job, vocab, index):
                sender.send((True, reply))
        except MemoryError:
            sender.send((False, f"compiling the constraint exceeded {max_memory_mb} MB"))
        except RecursionError:
            sender.send((False, "the constraint is nested too deeply to compile"))
        except Exception as e:
            sender.send((False, str(e)))


def _replies(job, vocab, index: bool) -> Iterator[bytes]:
    from braid.grammars.char_regex import CharPattern, CharRegex
    from braid.grammars.constraints import Ebnf

    if isinstance(job, CharPattern):
        yield pickle.dumps(CharRegex(job.pattern))
    elif isinstance(job, Ebnf):
        from braid.grammars.ebnf import EbnfGrammar

        yield EbnfGrammar(job.grammar, vocab).dumps()
    else:
        from braid.grammars.index_builder import constraint_regex

        # The regex first, then its index, so the parent keeps the regex when the index is
        # what runs out of time or memory.
        pattern = constraint_regex(job)
        yield pickle.dumps(pattern)
        if index:
            yield _index(pattern, vocab)


def _index(pattern: str, vocab) -> bytes:
    """The pickled index, or pickled None: the lazy automaton takes the regex when it is too
    large for an index, or when building or pickling the index runs out of memory or past
    outlines' limits."""
    from braid.grammars.index_builder import IndexUnbuildable, build_index, fits_index

    if not fits_index(pattern):
        return pickle.dumps(None)
    try:
        return pickle.dumps(build_index(pattern, vocab))
    except (MemoryError, IndexUnbuildable):
        return pickle.dumps(None)


if __name__ == "__main__":
    main()
