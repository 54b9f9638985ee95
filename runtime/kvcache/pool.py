"""The paged KV pool: per-layer K/V tensors allocated once, addressed by token slots.

Pages are one token long (as in SGLang's token-to-KV pool). The radix cache shares prefixes
at token granularity, so a fork or a cached prefix that ends mid-page needs no copy-on-write;
the attention kernels gather through a slot table, which costs the same for any page size.
"""

from __future__ import annotations

import torch


class KVPool:
    """K/V storage for `num_slots` tokens of every layer, plus a free list of slots.

    `k[layer]` and `v[layer]` are [num_slots + 1, num_kv_heads, head_dim]. Slots are handed
    out by `allocate` and returned by `free`; nothing is allocated per step. The last row,
    `scratch_slot`, is never handed out: the padding rows of a CUDA-graph decode batch write
    their K/V there and read it back, so a graph's fixed batch size never touches a live slot.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"KV pool needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self.dtype = dtype
        self.num_bytes = num_slots * self.bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        self.scratch_slot = num_slots
        shape = (num_slots + 1, num_kv_heads, head_dim)
        # torch.empty: on the CPU untouched pages are not resident until a slot is written.
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        for cache in self.k + self.v:
            cache[self.scratch_slot].zero_()  # finite: padding rows attend to it
        # A stack of free slot ids; low ids are handed out first.
        self._free = torch.arange(num_slots - 1, -1, -1, dtype=torch.int64)
        self._num_free = num_slots

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * dtype.itemsize

    @property
    def num_free_slots(self) -> int:
        return self._num_free

    def can_allocate(self, n: int) -> bool:
        return n <= self._num_free

    def allocate(self, n: int) -> torch.Tensor:
        """Take `n` free slots; raises MemoryError when fewer are free (callers check first)."""
        if n > self._num_free:
            raise MemoryError(f"KV pool has {self._num_free} free slots, {n} requested")
        start = self._num_free - n
        slots = self._free[start : self._num_free].flip(0).clone()
        self._num_free = start
        return slots

    def free(self, slots: torch.Tensor) -> None:
        n = slots.numel()
        self._free[self._num_free : self._num_free + n] = slots.flip(0)
        self._num_free += n
