"""ForwardBatch: one ragged batch of new tokens, each sequence reading its KV through slots."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class ForwardBatch:
    """New tokens of B sequences, concatenated (T tokens in all).

    Sequence b owns rows qo_start[b]:qo_start[b] + extend_lens[b] of the T new tokens and its
    whole context (cached prefix followed by the new tokens) lives in KV slots
    kv_indices[kv_start[b]:kv_start[b] + seq_lens[b]]. A decode step is an extend of length 1,
    so prefill chunks and decode tokens share one batch (hybrid prefill).
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64, where each new token's K/V is written
    kv_indices: torch.Tensor  # [sum(seq_lens)] int64
    extend_lens: list[int]  # [B] new tokens per sequence
    seq_lens: list[int]  # [B] context length per sequence after this step
    logits_indices: torch.Tensor  # [N] rows of T whose next-token logits are wanted
    # Sequences with one new token (decodes) are attended together on the CPU path: their
    # rows of T, their slot tables padded to the longest, and which padded entries are real.
    decode_rows: torch.Tensor  # [Bd]
    decode_kv_index: torch.Tensor  # [Bd, Lmax]
    decode_kv_valid: torch.Tensor  # [Bd, 1, 1, Lmax] bool
    # Leading slots every decode sequence shares (a common few-shot or system prompt): their
    # K/V are read once for all rows instead of once per row.
    decode_shared_len: int

    @cached_property
    def indptr(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(qo_indptr, kv_indptr), int32 [B + 1] on the batch's device: sequence b's new tokens
        are rows qo_indptr[b]:qo_indptr[b + 1] and its slots kv_indices[kv_indptr[b]:...], the
        layout of the Triton kernels. Built once per batch, on first use."""
        lens = torch.tensor([self.extend_lens, self.seq_lens], dtype=torch.int32)
        indptr = torch.nn.functional.pad(lens.cumsum(1, dtype=torch.int32), (1, 0))
        return tuple(indptr.to(self.input_ids.device).unbind(0))

    @classmethod
    def build(
        cls,
        new_tokens: list[list[int]],
        slot_tables: list[torch.Tensor],
        logits_rows: list[list[int]] | None = None,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        """Batch sequence b's `new_tokens[b]` over its full `slot_tables[b]`.

        The new tokens are the last len(new_tokens[b]) entries of the slot table. By default
        logits are computed for each sequence's last new token; `logits_rows[b]` picks other
        rows (offsets within that sequence's new tokens), e.g. all of them for prompt logprobs.
        """
        extend_lens = [len(t) for t in new_tokens]
        seq_lens = [t.numel() for t in slot_tables]
        for b, (n, total) in enumerate(zip(extend_lens, seq_lens, strict=True)):
            if n < 1 or n > total:
                raise ValueError(f"sequence {b}: {n} new tokens over a context of {total}")
        positions = torch.cat(
            [torch.arange(total - n, total) for n, total in zip(extend_lens, seq_lens, strict=True)]
        )
        out_slots = torch.cat([t[-n:] for t, n in zip(slot_tables, extend_lens, strict=True)])
        rows, start = [], 0
        for b, n in enumerate(extend_lens):
            wanted = [n - 1] if logits_rows is None else logits_rows[b]
            rows.extend(start + r for r in wanted)
            start += n
        flat_ids = [tok for seq in new_tokens for tok in seq]
        decodes = [b for b, n in enumerate(extend_lens) if n == 1]
        longest = max((seq_lens[b] for b in decodes), default=0)
        kv_index = torch.zeros(len(decodes), longest, dtype=torch.int64)
        for i, b in enumerate(decodes):
            kv_index[i, : seq_lens[b]] = slot_tables[b]
        lens = torch.tensor([seq_lens[b] for b in decodes], dtype=torch.int64)
        kv_valid = (torch.arange(longest)[None, :] < lens[:, None])[:, None, None, :]
        same = (kv_index == kv_index[:1]) & kv_valid[:, 0, 0]  # (Bd, Lmax)
        shared_len = int(same.all(0).int().cumprod(0).sum()) if len(decodes) > 1 else 0
        row_starts = torch.tensor([0, *extend_lens]).cumsum(0)
        return cls(
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            kv_indices=torch.cat(slot_tables).to(device),
            extend_lens=extend_lens,
            seq_lens=seq_lens,
            logits_indices=torch.tensor(rows, dtype=torch.int64, device=device),
            decode_rows=row_starts[decodes].to(device),
            decode_kv_index=kv_index.to(device),
            decode_kv_valid=kv_valid.to(device),
            decode_shared_len=shared_len,
        )
