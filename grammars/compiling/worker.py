"""The compile worker's process: `python -m braid.grammars.compiling.worker MAX_MEMORY_MB`.

Reads a TokenVocabulary from stdin, then jobs, each (number, job, whether an outlines index
is wanted); runs the job's kind's `produce` (grammars/compiling/jobs.py) and writes each result to
stdout as it is made, as (number, True, the kind's `dump` of it), or (number, False, an error
message). Started and killed by braid.grammars.compiling.compiler._Worker.
"""

from __future__ import annotations

import os
import resource
import sys
from multiprocessing.connection import Connection

from braid.grammars.compiling.jobs import kind_of


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
    # What JSON-schema jobs run, imported now rather than inside the first one's time.
    import braid.grammars.json_schema.convert  # noqa: F401

    while True:
        try:
            number, job, index = receiver.recv()
        except EOFError:
            return
        kind = kind_of(job)
        try:
            for result in kind.produce(job, vocab, index):
                sender.send((number, True, kind.dump(result)))
        except MemoryError:
            sender.send((number, False, f"compiling {kind.what} exceeded {max_memory_mb} MB"))
        except RecursionError:
            sender.send((number, False, f"{kind.what} is nested too deeply to compile"))
        except Exception as e:
            sender.send((number, False, str(e)))


if __name__ == "__main__":
    main()
