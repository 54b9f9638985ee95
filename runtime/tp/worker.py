"""A tensor-parallel rank's process: `python -m braid.runtime.tp.worker`, started by rank 0
(runtime/tp/launch.py) and talking to it over its stdin and stdout.

Reads its RankSpec, loads its shard and its share of the KV pool, writes ("ready",
RankReport) (or ("error", message)), joins the process group, then runs every forward rank 0
sends, (new_tokens, flat slot ids, slot table lengths, parents), on its shard until it
reads None or rank 0 is gone. A forward that fails here is written back as ("error",
message) before the process exits: its peers' all-reduces then fail at once (its sockets
close) instead of pairing with a later forward's.
"""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from braid.runtime.tp.rank import RankSpec


def main() -> None:
    receiver = Connection(os.dup(0), writable=False)
    sender = Connection(os.dup(1), readable=False)
    # Anything else that writes to fd 1 (a library, a subprocess it starts) goes to stderr,
    # not into the channel to rank 0.
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        spec = receiver.recv()
    except EOFError:
        return
    code = 0
    try:
        serve(spec, receiver, sender)
    except (EOFError, BrokenPipeError):
        pass  # rank 0 is gone
    except BaseException as e:
        traceback.print_exc()
        try:
            sender.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        code = 1
    sys.stderr.flush()
    # Nothing here needs tearing down, and the interpreter's own teardown (of torch and
    # transformers) is slow, and engine.shutdown() would wait for it.
    os._exit(code)


def serve(spec: RankSpec, receiver: Connection, sender: Connection) -> None:
    # Imported here, after main() has moved fd 1 away from the channel to rank 0.
    import torch

    from braid.runtime.executor.forward_batch import ForwardBatch
    from braid.runtime.tp.group import Communicator, join_store
    from braid.runtime.tp.rank import RankReport, load_rank
    from braid.runtime.tp.sharding import parallelize

    torch.set_num_threads(spec.threads)
    if spec.device.type == "cuda":
        torch.cuda.set_device(spec.device)
    model, kv = load_rank(spec)
    sender.send(("ready", RankReport.of(spec.shard.rank, model, kv)))
    store = join_store(spec.store_path, spec.shard.world)
    group = Communicator(store, spec.shard.rank, spec.shard.world, spec.device)
    parallelize(model, group)
    while (message := receiver.recv()) is not None:
        new_tokens, slots, lens, parents = message
        tables = list(torch.from_numpy(slots).split(lens))
        # No logits wanted: only rank 0 samples, so the head runs there alone.
        no_rows = [[] for _ in new_tokens]
        batch = ForwardBatch.build(new_tokens, tables, no_rows, spec.device, parents)
        model(batch, kv)
    group.close()


if __name__ == "__main__":
    main()
