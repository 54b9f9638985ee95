"""The compile worker's process: `python -m grammars.compile_worker MAX_MEMORY_MB`.

Reads a TokenVocabulary, then constraints, from stdin; writes for each to stdout (ok, pickled
regex or an error message), then, when the regex came, (ok, pickled index or None, or an error
message). Started and killed by grammars.compiler._Worker.
"""

from __future__ import annotations

import os
import pickle
import resource
import sys
from multiprocessing.connection import Connection


def main() -> None:
    from grammars.index_builder import IndexUnbuildable, build_index, constraint_regex, fits_index

    max_memory_mb = int(sys.argv[1])
    receiver = Connection(os.dup(0), writable=False)
    sender = Connection(os.dup(1), readable=False)
    sys.stdout = sys.stderr  # stdout carries results only
    # RLIMIT_DATA counts heap and private anonymous mappings (what index building grows),
    # not the shared libraries the interpreter maps.
    limit = max_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    vocab = receiver.recv()

    def index_of(pattern: str) -> bytes:
        """The pickled index, or pickled None: the lazy automaton takes the regex when it is
        too large for an index, or when building or pickling the index runs out of memory
        or past outlines' limits."""
        if not fits_index(pattern):
            return pickle.dumps(None)
        try:
            return pickle.dumps(build_index(pattern, vocab))
        except (MemoryError, IndexUnbuildable):
            return pickle.dumps(None)

    while True:
        try:
            constraint = receiver.recv()
        except EOFError:
            return
        # Two replies: the regex, then its index (None: the lazy automaton takes it), so the
        # parent keeps the regex when the index is what runs out of time or memory.
        try:
            pattern = constraint_regex(constraint)
            sender.send((True, pickle.dumps(pattern)))
            sender.send((True, index_of(pattern)))
        except MemoryError:
            sender.send((False, f"compiling the constraint exceeded {max_memory_mb} MB"))
        except Exception as e:
            sender.send((False, str(e)))


if __name__ == "__main__":
    main()
