"""Rank 0's side of tensor parallelism: start ranks 1..N-1, load its own shard meanwhile,
join the group, then tell the other ranks every forward it runs.

The ranks are plain `python -m braid.runtime.tp.worker` children talking over their stdin
and stdout, as the grammar compile workers are: multiprocessing's spawn would re-run the
user's main script in each of them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from braid.runtime.config import EngineConfig
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models import LlamaForCausalLM, ModelConfig
from braid.runtime.tp.group import (
    RENDEZVOUS_TIMEOUT,
    Communicator,
    RankFailure,
    open_store,
    remove_store,
)
from braid.runtime.tp.rank import RankReport, RankSpec, load_rank, rank_device
from braid.runtime.tp.sharding import parallelize, plan_shards

log = logging.getLogger(__name__)

# How long a failing rank gets to write why before it is counted as dead without a word.
LAST_WORDS_S = 1.0


class Ranks:
    """Ranks 1..N-1 as rank 0 sees them: their processes, a channel to each, and the
    reports of every rank (rank 0's first)."""

    def __init__(self, specs: list[RankSpec]) -> None:
        self.reports: list[RankReport] = []
        self.group: Communicator | None = None  # rank 0's end, once every rank has joined
        self.failure: str | None = None  # once set, no forward runs again
        self.threads_before: int | None = None  # torch's threads before rank 0 took its share
        self.store_path: str | None = None  # the rendezvous store's file, removed at close
        self._procs: list[subprocess.Popen] = []
        self._senders: list[Connection] = []
        self._receivers: list[Connection] = []
        for spec in specs:
            proc = subprocess.Popen(
                [sys.executable, "-m", "braid.runtime.tp.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            self._procs.append(proc)
            self._senders.append(Connection(os.dup(proc.stdin.fileno()), readable=False))
            self._receivers.append(Connection(os.dup(proc.stdout.fileno()), writable=False))
            proc.stdin.close()
            proc.stdout.close()
            self._senders[-1].send(spec)

    def wait_ready(self) -> list[RankReport]:
        """Each worker's report once it has loaded; raises RuntimeError for one that failed."""
        reports = []
        for rank, receiver in enumerate(self._receivers, start=1):
            if not receiver.poll(RENDEZVOUS_TIMEOUT.total_seconds()):
                raise RuntimeError(f"tensor-parallel rank {rank} did not load in time")
            try:
                kind, payload = receiver.recv()
            except EOFError:
                raise RuntimeError(f"tensor-parallel rank {rank} {self._exit(rank)}") from None
            if kind != "ready":
                raise RuntimeError(f"tensor-parallel rank {rank} failed to start: {payload}")
            reports.append(payload)
        return reports

    @contextmanager
    def step(
        self,
        new_tokens: list[list[int]],
        slot_tables: list[torch.Tensor],
        parents: list[list[int] | None],
    ) -> Iterator[None]:
        """Send this forward's inputs to every rank, then run rank 0's own forward (the
        body). Any failure from here to the end of the body ends the group: a rank stopped
        partway through a forward leaves the others' all-reduces without their partner."""
        if self.failure is not None:
            raise RankFailure(self.failure)
        message = (
            new_tokens,
            torch.cat(slot_tables).numpy(),  # numpy: pickled as bytes, never as shared memory
            [t.numel() for t in slot_tables],
            parents,
        )
        try:
            for sender in self._senders:
                sender.send(message)
            yield
        except Exception as e:
            self.failure = self._why(e)
            log.error("%s", self.failure)
            self.kill()
            raise RankFailure(self.failure) from e

    def close(self) -> None:
        """Stop every worker (at once if they do not stop when told)."""
        for sender in self._senders:
            try:
                sender.send(None)
            except OSError:
                pass  # already gone
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._senders + self._receivers:
            conn.close()
        if self.group is not None:
            self.group.close()
        if self.store_path is not None:
            remove_store(self.store_path)
        if self.threads_before is not None:
            # The count is process-wide (threads started later take it): give it back.
            torch.set_num_threads(self.threads_before)

    def kill(self) -> None:
        """End every worker now (a forward failed, or the engine failed to start)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()

    def _why(self, error: Exception) -> str:
        """The failure in words: the first rank that died (with its own last words, when it
        wrote any), else rank 0's own error."""
        for rank, proc in enumerate(self._procs, start=1):
            try:
                proc.wait(timeout=LAST_WORDS_S)
            except subprocess.TimeoutExpired:
                continue  # alive
            return f"tensor-parallel rank {rank} {self._exit(rank)}; the engine cannot run"
        return (
            f"tensor-parallel forward failed on rank 0 ({error!r}); the ranks are out of step, "
            "so the engine cannot run"
        )

    def _exit(self, rank: int) -> str:
        """How rank `rank` ended: its exit status and what it wrote before it exited."""
        code = self._procs[rank - 1].wait()
        words = ""
        receiver = self._receivers[rank - 1]
        try:
            while receiver.poll(0):
                kind, payload = receiver.recv()
                if kind == "error":
                    words = f": {payload}"
        except (EOFError, OSError):
            pass
        return f"exited with status {code}{words}"


def start_ranks(
    path: Path, model_config: ModelConfig, dtype: torch.dtype, config: EngineConfig
) -> tuple[LlamaForCausalLM, KVPool, Ranks]:
    """Rank 0's shard and KV pool, with ranks 1..tp-1 started, loaded and joined to it.
    Raises ValueError when config.tp cannot split the model or the machine."""
    mc, device, tp = model_config, config.torch_device, config.tp
    shards = plan_shards(mc, tp)
    if device.type == "cuda" and (device.index or 0) + tp > torch.cuda.device_count():
        raise ValueError(
            f"EngineConfig.tp={tp}: needs {tp} GPUs from {device}; "
            f"{torch.cuda.device_count()} are visible"
        )
    # Slot ids are shared, so every rank's pool has rank 0's number of slots. GPUs have
    # memory of their own: size by the largest shard (rank 0's). On the CPU the ranks share
    # the host's memory: size by the whole model's KV, as without tensor parallelism.
    heads = mc.num_kv_heads if device.type == "cpu" else shards[0].num_kv_heads
    num_slots = config.kv_pool_tokens(
        KVPool.bytes_per_token(mc.num_layers, heads, mc.head_dim, dtype)
    )
    # CPU ranks split the cores torch would use (more threads than cores in all would leave
    # OpenMP teams spinning on each other's cores).
    threads = max(1, torch.get_num_threads() // tp) if device.type == "cpu" else 1
    store, store_path = open_store(tp)
    specs = [
        RankSpec(
            path=path,
            shard=shard,
            dtype=dtype,
            device=rank_device(device, shard.rank),
            num_slots=num_slots,
            threads=threads,
            cpu_kernels=config.cpu_kernels,
            deterministic=config.deterministic,
            quantization=config.quantization,
            store_path=store_path,
        )
        for shard in shards
    ]
    ranks = Ranks(specs[1:])
    ranks.store_path = store_path
    try:
        if device.type == "cpu":
            ranks.threads_before = torch.get_num_threads()
            torch.set_num_threads(threads)
        else:
            torch.cuda.set_device(device)
        model, kv = load_rank(specs[0])  # while the other ranks load theirs
        reports = ranks.wait_ready()
        ranks.group = Communicator(store, 0, tp, specs[0].device)
        parallelize(model, ranks.group)
    except BaseException:
        ranks.kill()
        ranks.close()
        raise
    ranks.reports = [RankReport.of(0, model, kv), *reports]
    return model, kv, ranks
