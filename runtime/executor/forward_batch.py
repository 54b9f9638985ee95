"""ForwardBatch: one ragged batch of new tokens, each sequence reading its KV through slots."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from braid.runtime.lora.adapter import LoraBatch


@dataclass
class ForwardBatch:
    """New tokens of B sequences, concatenated (T tokens in all).

    Sequence b owns rows qo_start[b]:qo_start[b] + extend_lens[b] of the T new tokens and its
    whole context (cached prefix followed by the new tokens) lives in KV slots
    kv_indices[kv_starts[b]:kv_starts[b] + seq_lens[b]]. A decode step is an extend of length
    1, so prefill chunks and decode tokens share one batch (hybrid prefill). A sequence with
    a tree mask is a tree extend (speculative verification): its new tokens are tree nodes,
    each seeing the prefix and its own ancestors.

    This is what every attention backend needs; each builds what else it needs from it, once
    per batch (`metadata`).
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64, where each new token's K/V is written
    kv_indices: torch.Tensor  # [sum(seq_lens)] int64
    extend_lens: list[int]  # [B] new tokens per sequence
    seq_lens: list[int]  # [B] context length per sequence after this step
    logits_indices: torch.Tensor  # [N] rows of T whose next-token logits are wanted
    tree_masks: list[torch.Tensor | None]  # [B]: bool [n, n] for tree extends, else None
    # Which rows run under which LoRA adapter (runtime/lora/adapter.py); None: the base alone.
    lora: LoraBatch | None = None
    # Built by attention backends on first use, by backend name (CUDA graphs seed it with
    # their static buffers).
    prepared: dict[str, Any] = field(default_factory=dict)

    @property
    def all_decodes(self) -> bool:
        """Every sequence has one new token and no draft tree."""
        return all(n == 1 for n in self.extend_lens) and all(m is None for m in self.tree_masks)

    @property
    def kv_starts(self) -> list[int]:
        """Where each sequence's slots start in kv_indices."""
        return [0, *itertools.accumulate(self.seq_lens)][:-1]

    def metadata(self, backend) -> Any:
        """What `backend` built from this batch (an attention backend's prepare), once."""
        meta = self.prepared.get(backend.name)
        if meta is None:
            meta = self.prepared[backend.name] = backend.prepare(self)
        return meta

    @classmethod
    def build(
        cls,
        new_tokens: list[list[int]],
        slot_tables: list[torch.Tensor],
        logits_rows: list[list[int]] | None = None,
        device: torch.device | str = "cpu",
        parents: list[list[int] | None] | None = None,
        lora: LoraBatch | None = None,
    ) -> ForwardBatch:
        """Batch sequence b's `new_tokens[b]` over its full `slot_tables[b]`.

        The new tokens are the last len(new_tokens[b]) entries of the slot table. By default
        logits are computed for each sequence's last new token; `logits_rows[b]` picks other
        rows (offsets within that sequence's new tokens), e.g. all of them for prompt logprobs.
        `parents[b]`, when given, makes sequence b a tree extend: new token i's parent is new
        token parents[b][i] (an earlier one), or -1 for the last token of the cached prefix.
        `lora`: the rows' adapters, grouped over the same new tokens.
        """
        extend_lens = [len(t) for t in new_tokens]
        seq_lens = [t.numel() for t in slot_tables]
        for b, (n, total) in enumerate(zip(extend_lens, seq_lens, strict=True)):
            if n < 1 or n > total:
                raise ValueError(f"sequence {b}: {n} new tokens over a context of {total}")
        parents = parents or [None] * len(new_tokens)
        if any(p is not None for p in parents):
            # One-token sequences join the tree extends as one-node trees: one padded
            # attention call per layer instead of two (a batch where one request verifies a
            # draft ran slower with both paths; all on the tree path cost no more than the
            # decode path, on the CPU).
            parents = [
                [-1] if p is None and n == 1 else p
                for p, n in zip(parents, extend_lens, strict=True)
            ]
        tree_masks = [None if p is None else ancestor_mask(p) for p in parents]
        # Python ints, one tensor: an arange per sequence cost more than the rest together.
        positions = torch.tensor(
            [
                p
                for n, total, m in zip(extend_lens, seq_lens, tree_masks, strict=True)
                for p in (
                    range(total - n, total) if m is None else (total - n + m.sum(1) - 1).tolist()
                )
            ],
            dtype=torch.int64,
        )
        kv_indices = torch.cat(slot_tables)
        ends = itertools.accumulate(seq_lens)  # of each sequence's slots in kv_indices
        # Each sequence's last n slots, taken from the flat table in one indexing.
        new_slots = [
            p for end, n in zip(ends, extend_lens, strict=True) for p in range(end - n, end)
        ]
        out_slots = kv_indices[torch.tensor(new_slots, dtype=torch.int64)]
        rows, start = [], 0
        for b, n in enumerate(extend_lens):
            wanted = [n - 1] if logits_rows is None else logits_rows[b]
            rows.extend(start + r for r in wanted)
            start += n
        flat_ids = [tok for seq in new_tokens for tok in seq]
        return cls(
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            kv_indices=kv_indices.to(device),
            extend_lens=extend_lens,
            seq_lens=seq_lens,
            logits_indices=torch.tensor(rows, dtype=torch.int64, device=device),
            tree_masks=tree_masks,
            lora=lora,
        )


@dataclass
class HiddenCapture:
    """Hidden states a forward copies out besides its logits, for the draft heads that read
    the target's own states (runtime/spec/heads): asked for by `layers` and `final`, filled
    by the model's forward.

    `layers`: indices j in [0, num_layers] of the residual stream entering layer j (0: the
    embeddings; num_layers: the last layer's output before the final norm), as transformers'
    `hidden_states[j]`; `aux` then holds them for every new token, side by side in that
    order: [T, len(layers) * hidden]. `final`: `normed` holds the final normed hidden states
    of the logits rows [N, hidden] (what the head multiplies)."""

    layers: tuple[int, ...] = ()
    final: bool = False
    aux: torch.Tensor | None = None
    normed: torch.Tensor | None = None


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """bool [n, n]: row i marks token i and its ancestors (parents[i] < i, or -1 for none)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"tree token {i}: parent {p} must be -1 or an earlier token")
        if p >= 0:
            mask[i] |= mask[p]
    return mask
