"""The segmented LoRA kernel against its twin in kernels.reference, and the twin against
one adapter's update written out row by row."""

from __future__ import annotations

import pytest
import torch

from braid.kernels import reference
from braid.kernels.cpu import LORA_LINEARS
from braid.kernels.triton.lora import lora_segmented
from braid.runtime.lora.adapter import LoraAdapter, LoraBatch

# 4 adapters of ranks 4, 8, 2 and 8 (the stack is padded to 8); 30 rows.
RANKS = [4, 8, 2, 8]
# Several segments of one adapter, an empty one, a decode row, and rows 6-8 and 26-29 in no
# segment (the base model's rows, or those of an adapter that leaves the linear alone).
SEGMENTS = [(0, 5, 1), (5, 0, 2), (5, 1, 0), (9, 12, 3), (21, 1, 1), (22, 4, 2)]


def stacks(in_features: int, out_features: int, dtype, seed: int = 0):
    """A [N, R, in] and B [N, out, R], each adapter's columns past its rank zero."""
    g = torch.Generator().manual_seed(seed)
    r_max = max(RANKS)
    a = torch.zeros(len(RANKS), r_max, in_features)
    b = torch.zeros(len(RANKS), out_features, r_max)
    for i, r in enumerate(RANKS):
        a[i, :r] = torch.randn(r, in_features, generator=g)
        b[i, :, :r] = torch.randn(out_features, r, generator=g) * 0.1
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize(
    "in_features, out_features, dtype, tol",
    [(64, 96, torch.float32, 1e-4), (100, 72, torch.float32, 1e-4), (64, 96, torch.bfloat16, 3e-2)],
    ids=["f32", "f32-ragged-widths", "bf16"],
)
def test_lora_segmented_matches_twin(device, in_features, out_features, dtype, tol):
    a, b = stacks(in_features, out_features, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, in_features, generator=g).to(dtype)
    y = torch.randn(30, out_features, generator=g).to(dtype)
    segments = torch.tensor(SEGMENTS, dtype=torch.int32)
    expected = y.float().clone()
    reference.lora_segmented(x.float(), expected, a.float(), b.float(), segments)

    got = y.to(device)
    lora_segmented(x.to(device), got, a.to(device), b.to(device), segments.to(device), max_len=12)
    torch.testing.assert_close(got.cpu().float(), expected, atol=tol, rtol=tol)
    # rows in no segment are untouched, bit for bit
    for rows in (slice(26, 30), slice(6, 9)):
        assert torch.equal(got[rows].cpu(), y[rows])


def test_no_segments_change_nothing(device):
    a, b = stacks(64, 32, torch.float32)
    x, y = torch.randn(3, 64, device=device), torch.randn(3, 32, device=device)
    before = y.clone()
    lora_segmented(x, y, a.to(device), b.to(device), torch.zeros(0, 3, dtype=torch.int32))
    lora_segmented(x, y, a.to(device), b.to(device), torch.tensor([[0, 0, 1]], device=device))
    assert torch.equal(y, before)


def test_twin_is_each_adapters_update_on_its_rows():
    a, b = stacks(16, 24, torch.float64)
    x, y = torch.randn(30, 16, dtype=torch.float64), torch.randn(30, 24, dtype=torch.float64)
    expected = y.clone()
    for start, length, i in SEGMENTS:
        r = RANKS[i]  # the padding adds nothing
        for t in range(start, start + length):
            expected[t] += b[i, :, :r] @ (a[i, :r] @ x[t])
    reference.lora_segmented(x, y, a, b, torch.tensor(SEGMENTS))
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("cpu_kernel", [False, True], ids=["torch", "cpu-kernel"])
def test_lora_batch_segmented_equals_grouped(device, cpu_kernel):
    """LoraBatch's paths on one batch: the Triton kernel against torch's index_add_, or (on
    the CPU) the C++ kernel."""
    g = torch.Generator().manual_seed(2)

    def adapter(name: str, rank: int, linears: list[str]) -> LoraAdapter:
        weights = {
            (0, linear): (
                torch.randn(rank, 32, generator=g).to(device),
                torch.randn(48, rank, generator=g).to(device),
            )
            for linear in linears
        }
        return LoraAdapter(name, name, rank, 1.0, (), weights)

    qkv, o, gate_up, down = LORA_LINEARS
    p = adapter("p", 2, [qkv, down])
    q = adapter("q", 8, [qkv, gate_up])
    r = adapter("r", 4, [qkv, down])
    # Runs of one adapter across sequences, base rows between, an empty sequence; q leaves
    # down alone and is alone on gate_up (its weights unstacked).
    seqs = [(p, 3), (p, 1), (None, 2), (q, 4), (r, 1), (None, 0), (p, 2), (q, 0), (r, 5)]
    adapters, lens = [a for a, _ in seqs], [n for _, n in seqs]
    x = torch.randn(sum(lens), 32, generator=g).to(device)
    y = torch.randn(sum(lens), 48, generator=g).to(device)
    of = LoraBatch.of(adapters, lens, torch.device(device))
    assert of.segments == [(0, 4, 0), (6, 4, 1), (10, 1, 2), (11, 2, 0), (13, 5, 2)]
    grouped = LoraBatch(
        of.adapters, of.segments, x.device, segmented=False, cpu_kernel=cpu_kernel,
        num_rows=x.shape[0],
    )  # fmt: skip
    assert (grouped.cpu_kernels is not None) == (cpu_kernel and device == "cpu")
    segmented = LoraBatch(of.adapters, of.segments, x.device, segmented=True)
    for linear in LORA_LINEARS:
        want, got = y.clone(), y.clone()
        grouped.add(want, x, 0, linear)
        segmented.add(got, x, 0, linear)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert LoraBatch.of([None, None], [3, 1], torch.device(device)) is None
