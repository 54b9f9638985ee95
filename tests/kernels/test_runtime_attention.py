"""runtime.attention's kernel path (taken on CUDA) against its torch path on one ForwardBatch."""

from __future__ import annotations

import pytest
import torch

from runtime.attention import _kernel_attention, paged_attention
from runtime.forward_batch import ForwardBatch
from runtime.kv_cache import KVPool


def pool(device: str) -> KVPool:
    kv = KVPool(1, 128, 2, 16, torch.float32, device)
    g = torch.Generator().manual_seed(0)
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=g))
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=g))
    return kv


# A speculative batch: a draft tree (root, two children of it, a grandchild of the second),
# a one-token decode and a plain 5-token prefill chunk.
_TREE_PARENTS = [[-1, 0, 0, 2], None, None]


@pytest.mark.parametrize(
    ("shapes", "parents"),
    [
        ([(20, 1), (30, 7), (12, 1)], None),
        ([(20, 1), (70, 1)], None),
        ([(24, 4), (17, 1), (30, 5)], _TREE_PARENTS),
    ],
    ids=["hybrid", "decode", "tree"],
)
def test_kernel_path_equals_torch_path(device, shapes, parents):
    """shapes: (context length, new tokens) per sequence; parents: draft-tree parents."""
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(1))
    bounds = torch.tensor([0] + [total for total, _ in shapes]).cumsum(0).tolist()
    tables = [perm[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    batch = ForwardBatch.build([[0] * n for _, n in shapes], tables, device=device, parents=parents)
    qo_indptr, kv_indptr = batch.indptr
    assert qo_indptr.tolist() == [0, *torch.tensor([n for _, n in shapes]).cumsum(0).tolist()]
    assert kv_indptr.tolist() == bounds
    g = torch.Generator().manual_seed(2)
    num_tokens = sum(n for _, n in shapes)
    q = torch.randn(num_tokens, 4, 16, generator=g).to(device)
    k = torch.randn(num_tokens, 2, 16, generator=g).to(device)
    v = torch.randn(num_tokens, 2, 16, generator=g).to(device)
    torch_kv, kernel_kv = pool("cpu"), pool(device)
    expected = paged_attention(
        q.cpu(), k.cpu(), v.cpu(), torch_kv, 0, batch_on_cpu(shapes, tables, parents), 0.25
    )
    out = _kernel_attention(q, k, v, kernel_kv, 0, batch, 0.25)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-3, rtol=1e-3)
    assert torch.equal(kernel_kv.k[0].cpu(), torch_kv.k[0])
    assert torch.equal(kernel_kv.v[0].cpu(), torch_kv.v[0])


def batch_on_cpu(shapes, tables, parents) -> ForwardBatch:
    return ForwardBatch.build([[0] * n for _, n in shapes], tables, parents=parents)
