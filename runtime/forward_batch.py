"""ForwardBatch: one ragged batch of new tokens, each sequence reading its KV through slots."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

# Largest plain extend (new tokens x context) the CPU kernels attend row by row; past it one
# matmul per sequence costs less.
SHORT_EXTEND_WORK = 8192


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
    decode_kv_starts: torch.Tensor  # [Bd] where each one's slots start in kv_indices
    decode_kv_lens: torch.Tensor  # [Bd] and how many there are
    decode_kv_index: torch.Tensor  # [Bd, Lmax]
    decode_kv_valid: torch.Tensor  # [Bd, 1, 1, Lmax] bool
    # Short plain extends (a short prompt, a small chunk over a cached prefix): with the CPU
    # kernels their new tokens are attended row by row like decodes, row i of a sequence
    # seeing its prefix and the new tokens up to itself; cheaper there than a matmul each.
    short_rows: torch.Tensor  # [Ns] rows of T
    short_kv_starts: torch.Tensor  # [Ns] where each row's slots start in kv_indices
    short_kv_lens: torch.Tensor  # [Ns] how many of them it sees
    short: list[bool]  # [B] whether sequence b is such an extend
    # Leading slots every decode sequence shares (a common few-shot or system prompt): their
    # K/V are read once for all rows instead of once per row.
    decode_shared_len: int
    tree_masks: list[torch.Tensor | None]  # [B]: bool [n, n] for tree extends, else None
    # Tree extends are attended together on the CPU path (they are short): their rows of T
    # padded to the largest tree, which padded rows are real, their slot tables padded to the
    # longest, and each row's visibility over its padded slot table (prefix and ancestors).
    tree_rows: torch.Tensor  # [Bt, Nmax]
    tree_row_valid: torch.Tensor  # [Bt, Nmax] bool
    tree_kv_index: torch.Tensor  # [Bt, Lmax]
    tree_kv_mask: torch.Tensor  # [Bt, 1, 1, Nmax, Lmax] bool

    @cached_property
    def indptr(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(qo_indptr, kv_indptr), int32 [B + 1] on the batch's device: sequence b's new tokens
        are rows qo_indptr[b]:qo_indptr[b + 1] and its slots kv_indices[kv_indptr[b]:...], the
        layout of the Triton kernels. Built once per batch, on first use."""
        lens = torch.tensor([self.extend_lens, self.seq_lens], dtype=torch.int32)
        indptr = torch.nn.functional.pad(lens.cumsum(1, dtype=torch.int32), (1, 0))
        return tuple(indptr.to(self.input_ids.device).unbind(0))

    @cached_property
    def kernel_tree_mask(self) -> torch.Tensor | None:
        """The tree masks in the extend kernel's layout: sequence b's [n_b, n_b] block
        (ancestors, or causal for a plain extend) flattened after those before it; None
        when the batch holds no tree. Built once per batch, on first use."""
        if all(m is None for m in self.tree_masks):
            return None
        blocks = [
            torch.ones(n, n, dtype=torch.bool).tril() if m is None else m
            for n, m in zip(self.extend_lens, self.tree_masks, strict=True)
        ]
        return torch.cat([b.flatten() for b in blocks]).to(self.input_ids.device)

    @property
    def all_decodes(self) -> bool:
        """Every sequence has one new token and no draft tree."""
        return self.decode_rows.numel() == len(self.extend_lens)

    @cached_property
    def plain_extends(self) -> list[tuple[int, int, int, int, bool]]:
        """(first row, new tokens, first slot in kv_indices, context, short) of each sequence
        with more than one new token and no tree: those the CPU path attends one by one. Built
        once per batch, on first use (each layer's attention reads it)."""
        out, row, slot = [], 0, 0
        for n, total, m, short in zip(
            self.extend_lens, self.seq_lens, self.tree_masks, self.short, strict=True
        ):
            if n > 1 and m is None:
                out.append((row, n, slot, total, short))
            row += n
            slot += total
        return out

    @classmethod
    def build(
        cls,
        new_tokens: list[list[int]],
        slot_tables: list[torch.Tensor],
        logits_rows: list[list[int]] | None = None,
        device: torch.device | str = "cpu",
        parents: list[list[int] | None] | None = None,
    ) -> ForwardBatch:
        """Batch sequence b's `new_tokens[b]` over its full `slot_tables[b]`.

        The new tokens are the last len(new_tokens[b]) entries of the slot table. By default
        logits are computed for each sequence's last new token; `logits_rows[b]` picks other
        rows (offsets within that sequence's new tokens), e.g. all of them for prompt logprobs.
        `parents[b]`, when given, makes sequence b a tree extend: new token i's parent is new
        token parents[b][i] (an earlier one), or -1 for the last token of the cached prefix.
        """
        extend_lens = [len(t) for t in new_tokens]
        seq_lens = [t.numel() for t in slot_tables]
        for b, (n, total) in enumerate(zip(extend_lens, seq_lens, strict=True)):
            if n < 1 or n > total:
                raise ValueError(f"sequence {b}: {n} new tokens over a context of {total}")
        parents = parents or [None] * len(new_tokens)
        if any(p is not None for p in parents):
            # One-token sequences join the tree extends as one-node trees: one padded
            # attention call per layer instead of two (a batch of 8 where one request verifies
            # a draft ran ~10% slower with both paths; all 8 on the tree path cost no more
            # than the decode path, default model on the CPU).
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
        ends = list(itertools.accumulate(seq_lens))  # of each sequence's slots in kv_indices
        kv_starts = torch.tensor([0, *ends[:-1]], dtype=torch.int64)
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
        decodes = [b for b, n in enumerate(extend_lens) if n == 1 and tree_masks[b] is None]
        longest = max((seq_lens[b] for b in decodes), default=0)
        lens = torch.tensor([seq_lens[b] for b in decodes], dtype=torch.int64)
        kv_index = _padded_tables(kv_indices, kv_starts[decodes], lens, longest)
        kv_valid = (torch.arange(longest)[None, :] < lens[:, None])[:, None, None, :]
        same = (kv_index == kv_index[:1]) & kv_valid[:, 0, 0]  # (Bd, Lmax)
        shared_len = int(same.all(0).int().cumprod(0).sum()) if len(decodes) > 1 else 0
        row_starts = torch.tensor([0, *extend_lens]).cumsum(0)
        short = [
            1 < n and n * total <= SHORT_EXTEND_WORK and m is None
            for n, total, m in zip(extend_lens, seq_lens, tree_masks, strict=True)
        ]
        short_seqs = [b for b, is_short in enumerate(short) if is_short]
        short_rows = [
            torch.arange(row_starts[b], row_starts[b] + extend_lens[b]) for b in short_seqs
        ]
        short_lens = [
            torch.arange(seq_lens[b] - extend_lens[b] + 1, seq_lens[b] + 1) for b in short_seqs
        ]
        short_starts = [kv_starts[b].expand(extend_lens[b]) for b in short_seqs]
        trees = [b for b, m in enumerate(tree_masks) if m is not None]
        most = max((extend_lens[b] for b in trees), default=0)
        longest = max((seq_lens[b] for b in trees), default=0)
        tree_rows = torch.zeros(len(trees), most, dtype=torch.int64)
        tree_row_valid = torch.zeros(len(trees), most, dtype=torch.bool)
        tree_kv_index = torch.zeros(len(trees), longest, dtype=torch.int64)
        tree_kv_mask = torch.zeros(len(trees), most, longest, dtype=torch.bool)
        for i, b in enumerate(trees):
            n, total = extend_lens[b], seq_lens[b]
            tree_rows[i, :n] = torch.arange(row_starts[b], row_starts[b] + n)
            tree_row_valid[i, :n] = True
            tree_kv_index[i, :total] = slot_tables[b]
            tree_kv_mask[i, :n, : total - n] = True
            tree_kv_mask[i, :n, total - n : total] = tree_masks[b]
        return cls(
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            kv_indices=kv_indices.to(device),
            extend_lens=extend_lens,
            seq_lens=seq_lens,
            logits_indices=torch.tensor(rows, dtype=torch.int64, device=device),
            decode_rows=row_starts[decodes].to(device),
            decode_kv_starts=kv_starts[decodes].to(device),
            decode_kv_lens=lens.to(device),
            short_rows=_cat_int64(short_rows).to(device),
            short_kv_starts=_cat_int64(short_starts).to(device),
            short_kv_lens=_cat_int64(short_lens).to(device),
            short=short,
            decode_kv_index=kv_index.to(device),
            decode_kv_valid=kv_valid.to(device),
            decode_shared_len=shared_len,
            tree_masks=tree_masks,
            tree_rows=tree_rows.to(device),
            tree_row_valid=tree_row_valid.to(device),
            tree_kv_index=tree_kv_index.to(device),
            tree_kv_mask=tree_kv_mask[:, None, None].to(device),
        )


def _padded_tables(
    kv_indices: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, width: int
) -> torch.Tensor:
    """[len(starts), width] int64: row i is kv_indices[starts[i] : starts[i] + lens[i]], then
    zeros. A gather, where copying each row in costs a tensor op per sequence."""
    offsets = torch.arange(width)
    index = (starts[:, None] + offsets[None, :]).clamp_max(max(kv_indices.numel() - 1, 0))
    return torch.where(offsets[None, :] < lens[:, None], kv_indices[index], 0)


def _cat_int64(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts).to(torch.int64) if parts else torch.empty(0, dtype=torch.int64)


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
