"""The compile worker's process: `python -m grammars.compile_worker MAX_MEMORY_MB`.

Reads a TokenVocabulary, then constraints, from stdin; writes (ok, pickled (regex, index) or
an error message) for each to stdout. Started and killed by grammars.compile._Worker.
"""

from __future__ import annotations

import os
import pickle
import resource
import sys
from multiprocessing.connection import Connection


def main() -> None:
    from grammars.compile import _regex_and_index

    max_memory_mb = int(sys.argv[1])
    receiver = Connection(os.dup(0), writable=False)
    sender = Connection(os.dup(1), readable=False)
    sys.stdout = sys.stderr  # stdout carries results only
    # RLIMIT_DATA counts heap and private anonymous mappings (what index building grows),
    # not the shared libraries the interpreter maps.
    limit = max_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    vocab = receiver.recv()
    while True:
        try:
            constraint = receiver.recv()
        except EOFError:
            return
        try:
            sender.send((True, pickle.dumps(_regex_and_index(constraint, vocab))))
        except MemoryError:
            sender.send((False, f"compiling the constraint exceeded {max_memory_mb} MB"))
        except Exception as e:
            sender.send((False, str(e)))


if __name__ == "__main__":
    main()
