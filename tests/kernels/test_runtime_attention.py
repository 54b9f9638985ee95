"""The attention backends (braid.runtime.attention) on one ForwardBatch against the twin of
the extend kernel: torch ops and the C++ kernels (CPU), and the Triton kernels (CUDA, or
triton's interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from braid.kernels import reference
from braid.runtime.attention.triton import TritonAttention
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.layers.ops import TORCH_OPS, layer_ops

NUM_SLOTS = 160


def pool(device: str) -> KVPool:
    kv = KVPool(1, NUM_SLOTS, 2, 16, torch.float32, device)
    g = torch.Generator().manual_seed(0)
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=g))
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=g))
    return kv


# A speculative batch: a draft tree (root, two children of it, a grandchild of the second),
# a one-token decode and a plain 5-token prefill chunk.
_TREE_PARENTS = [[-1, 0, 0, 2], None, None]
CASES = {
    "hybrid": ([(20, 1), (30, 7), (12, 1)], None, 0),
    "decode": ([(20, 1), (70, 1)], None, 0),
    "tree": ([(24, 4), (17, 1), (30, 5)], _TREE_PARENTS, 0),
    # A long chunk (one matmul on the torch path) beside a short one.
    "long-extend": ([(110, 80), (25, 3)], None, 0),
    # Decodes whose first 20 slots are the same (a shared few-shot prompt).
    "shared-prefix": ([(26, 1), (31, 1), (22, 1)], None, 20),
}


def batch_and_inputs(name: str, device: str):
    shapes, parents, shared = CASES[name]
    perm = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(1)).tolist()
    prefix, rest = perm[:shared], perm[shared:]
    tables = []
    for total, _ in shapes:
        own, rest = rest[: total - shared], rest[total - shared :]
        tables.append(torch.tensor(prefix + own))
    new = [[0] * n for _, n in shapes]
    batch = ForwardBatch.build(new, tables, device=device, parents=parents)
    g = torch.Generator().manual_seed(2)
    num_tokens = sum(n for _, n in shapes)
    qkv = torch.randn(num_tokens, 8, 16, generator=g)  # 4 query heads, then k, v (2 each)
    return batch, qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]


def expected_output(batch: ForwardBatch, q, k, v) -> tuple[torch.Tensor, KVPool]:
    kv = pool("cpu")
    reference.store_kv(k, v, kv.k[0], kv.v[0], batch.out_slots)
    meta = TritonAttention().prepare(batch)
    out = reference.extend_attention(
        q, kv.k[0], kv.v[0], meta.qo_indptr, meta.kv_indptr, batch.kv_indices, 0.25,
        meta.tree_mask,
    )  # fmt: skip
    return out.flatten(1), kv


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch", "cpu-kernels"])
def test_cpu_paths_equal_the_twin(name, cpu_kernels):
    ops = layer_ops(torch.device("cpu"), torch.float32, cpu_kernels)
    if cpu_kernels and ops is TORCH_OPS:
        pytest.skip("the CPU kernels cannot be built here")
    batch, q, k, v = batch_and_inputs(name, "cpu")
    expected, kv = expected_output(batch, q, k, v)
    out = ops.attention.attend(q, kv, 0, batch, 0.25)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_kernel_rows_do_not_depend_on_the_batch(name):
    """Every row of the C++ kernels' attention, bit for bit, is the decode row over the same
    slots alone: prefill rows over their run so far, tree nodes over their ancestors."""
    ops = layer_ops(torch.device("cpu"), torch.float32)
    if ops is TORCH_OPS:
        pytest.skip("the CPU kernels cannot be built here")
    batch, q, k, v = batch_and_inputs(name, "cpu")
    _, kv = expected_output(batch, q, k, v)
    out = ops.attention.attend(q, kv, 0, batch, 0.25)
    shapes, parents, _ = CASES[name]
    row = 0
    for b, (total, n) in enumerate(shapes):
        table = batch.kv_indices[batch.kv_starts[b] : batch.kv_starts[b] + total]
        prefix, own = table[: total - n].tolist(), table[total - n :].tolist()
        for i in range(n):
            seen, node = [], i  # the row's own slots: the run up to it, or its ancestors
            while node >= 0:
                seen.insert(0, own[node])
                node = parents[b][node] if parents and parents[b] else node - 1
            alone = ForwardBatch.build([[0]], [torch.tensor(prefix + seen)])
            got = ops.attention.attend(q[row : row + 1], kv, 0, alone, 0.25)
            assert torch.equal(got[0], out[row]), (name, b, i)
            row += 1


@pytest.mark.parametrize("name", ["hybrid", "decode", "tree"])
def test_kernel_path_equals_the_twin(device, name):
    batch, q, k, v = batch_and_inputs(name, device)
    expected, _ = expected_output(batch_and_inputs(name, "cpu")[0], q, k, v)
    kv = pool(device)
    reference.store_kv(k.to(device), v.to(device), kv.k[0], kv.v[0], batch.out_slots)
    out = TritonAttention().attend(q.to(device), kv, 0, batch, 0.25)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-3, rtol=1e-3)
