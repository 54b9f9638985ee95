"""The ranks' process group: a file store for the rendezvous, then gloo (CPU) or NCCL (CUDA)
for the all-reduces inside each forward.

The group is a process group object of its own, not torch.distributed's global default
group, so engines in one process (and anything else there using torch.distributed) do not
share or clash over it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

# Backstop for an all-reduce whose peer neither answers nor dies: the ranks run the same
# layer at the same time, so a healthy peer answers within one layer's compute. A dead peer
# is noticed at once (its sockets close), not after this.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# Ranks start (import torch, load their shard) before they join: give them that long.
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)
HOST = "127.0.0.1"  # gloo's sockets between the ranks


class RankFailure(RuntimeError):
    """The ranks cannot go on together: one died, or a forward failed partway through (the
    ranks' collectives would then pair the wrong layers). The engine fails its requests."""


def open_store(world: int) -> tuple[dist.FileStore, str]:
    """Rank 0's rendezvous store and its path: a file in a new directory only this user may
    read. The ranks are processes of one machine; a TCP store's server listens on every
    interface whatever host it is given, and anyone reaching it reads and writes its keys.
    The directory is removed by remove_store."""
    path = os.path.join(tempfile.mkdtemp(prefix="braid-tp-"), "store")
    return join_store(path, world), path


def join_store(path: str, world: int) -> dist.FileStore:
    store = dist.FileStore(path, world)
    store.set_timeout(RENDEZVOUS_TIMEOUT)
    return store


def remove_store(path: str) -> None:
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


class Communicator:
    """Rank `rank`'s end of the group: the all-reduce the row-parallel layers call."""

    def __init__(self, store: dist.Store, rank: int, world: int, device: torch.device) -> None:
        """Blocks until every rank has joined."""
        self.rank, self.world = rank, world
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = COLLECTIVE_TIMEOUT
            self.group = dist.ProcessGroupNCCL(store, rank, world, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = COLLECTIVE_TIMEOUT
            # Loopback: the ranks are processes of one machine, and resolving the hostname to
            # an interface can pick one that is down or firewalled.
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=HOST)]
            self.group = dist.ProcessGroupGloo(store, rank, world, options)

    def close(self) -> None:
        """Leave the group (NCCL warns at exit about a group left open)."""
        self.group.shutdown()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        try:
            self.group.allreduce([tensor]).wait()
        except RuntimeError as e:  # gloo: a peer's socket closed; NCCL: the timeout
            raise RankFailure(f"tensor-parallel all-reduce failed on rank {self.rank}: {e}") from e
