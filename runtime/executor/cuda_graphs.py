"""CUDA graphs for decode steps: one captured forward per batch size bucket.

A decode step of a small model on a GPU is mostly kernel launches: several per layer, each
costing about as much CPU work to launch as GPU work to run. Replaying a captured graph
launches them all at once. A graph fixes its tensors' addresses and shapes, so each bucket
reads its inputs from static buffers: a step of n sequences is padded to the next bucket, its
padding rows decode token 0 at position 0 into the pool's scratch slot and attend to that slot
alone, and their logits are dropped. Batches that are not plain decodes (prefill chunks,
draft trees, prompt logprobs), or larger than the largest bucket, run eagerly.

On the CPU nothing is captured and `forward` runs the model eagerly over the same static
buffers, which lets tests check the padding and the buffers against an eager batch.
"""

from __future__ import annotations

import torch

from braid.runtime.attention.triton import TritonAttention, TritonMetadata
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models import LlamaForCausalLM

# Small steps of 8 above 16 keep the padding waste under ~30%.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)
# Slot table entries the static batch holds (8 bytes each); a step past it runs eagerly.
MAX_KV_INDICES = 1 << 22


class DecodeGraphs:
    def __init__(
        self, model: LlamaForCausalLM, kv: KVPool, max_batch: int, max_context: int
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"decode graphs need max_batch >= 1, got {max_batch}")
        self.model, self.kv = model, kv
        self.sizes = [s for s in BUCKETS if s < max_batch] + [max_batch]
        largest = self.sizes[-1]
        device = kv.k[0].device
        self.capacity = min(largest * min(max_context, kv.num_slots), MAX_KV_INDICES)
        # Rows: input ids, positions, output slots. Until a step fills them every row is a
        # padding row, which makes warm-up and capture valid forwards.
        self.tokens = torch.zeros(3, largest, dtype=torch.int64, device=device)
        self.tokens[2] = kv.scratch_slot
        self.kv_indptr = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.full(
            (self.capacity + largest,), kv.scratch_slot, dtype=torch.int64, device=device
        )
        self.batches = {size: self._static_batch(size) for size in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        if device.type == "cuda":
            self._capture()

    def fits(
        self,
        new_tokens: list[list[int]],
        slot_tables: list[torch.Tensor],
        logits_rows: list[list[int]],
    ) -> bool:
        """Whether a step can replay a graph: one new token per sequence and its logits."""
        return (
            len(new_tokens) <= self.sizes[-1]
            and all(len(t) == 1 for t in new_tokens)
            and all(r == [0] for r in logits_rows)
            and sum(t.numel() for t in slot_tables) <= self.capacity
        )

    def forward(self, new_tokens: list[list[int]], slot_tables: list[torch.Tensor]) -> torch.Tensor:
        """Next-token logits [n, V] of n decoding sequences (`fits` holds). The result is a
        view of the graph's output: read it before the next step."""
        n = len(new_tokens)
        size = next(s for s in self.sizes if s >= n)
        lens = torch.tensor([t.numel() for t in slot_tables], dtype=torch.int64)
        host = torch.zeros(3, size, dtype=torch.int64)
        host[0, :n] = torch.tensor([t[0] for t in new_tokens])
        host[1, :n] = lens - 1
        host[2, :n] = torch.stack([t[-1] for t in slot_tables])
        host[2, n:] = self.kv.scratch_slot
        total = int(lens.sum())
        # Padding row j reads entry total + j, the scratch slot.
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
        indptr = torch.cat([indptr, total + torch.arange(1, size - n + 1)]).to(torch.int32)
        indices = torch.cat([*slot_tables, torch.full((size - n,), self.kv.scratch_slot)])
        self.tokens[:, :size].copy_(host, non_blocking=True)
        self.kv_indptr[: size + 1].copy_(indptr, non_blocking=True)
        self.kv_indices[: indices.numel()].copy_(indices, non_blocking=True)
        if size in self.graphs:
            self.graphs[size].replay()
            return self.logits[size][:n]
        return self.model(self.batches[size], self.kv)[:n]

    def _static_batch(self, size: int) -> ForwardBatch:
        """A decode batch of `size` sequences over views of the static buffers, with the
        Triton backend's metadata made of them (seq_lens stay unknown until a step: the
        kernels read kv_indptr)."""
        device = self.tokens.device
        batch = ForwardBatch(
            input_ids=self.tokens[0, :size],
            positions=self.tokens[1, :size],
            out_slots=self.tokens[2, :size],
            kv_indices=self.kv_indices,
            extend_lens=[1] * size,
            seq_lens=[0] * size,
            logits_indices=torch.arange(size, device=device),
            tree_masks=[None] * size,
        )
        qo_indptr = torch.arange(size + 1, dtype=torch.int32, device=device)
        meta = TritonMetadata(qo_indptr, self.kv_indptr[: size + 1], None, 1)
        batch.prepared[TritonAttention.name] = meta
        return batch

    def _capture(self) -> None:
        # Largest first: the smaller graphs reuse its memory through the shared pool.
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            batch = self.batches[size]
            # Warm-up off the capture: Triton compiles, cuBLAS picks its kernels and workspace.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.model(batch, self.kv)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self.model(batch, self.kv)
            self.graphs[size] = graph
        torch.cuda.synchronize()
