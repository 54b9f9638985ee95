"""Our forward against transformers' on tiny random models of every supported architecture,
with the CPU kernels (kernels/cpu/cpu.cpp) and with their torch twins."""

from __future__ import annotations

import pytest
import torch
import transformers

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config

VARIANTS = ["llama", "llama-bias", "llama3-rope", "mistral", "qwen2", "qwen3"]
TOL = 1e-4
OPS = pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "torch"])


def load_both(path, cpu_kernels: bool):
    config = load_model_config(path)
    ours = load_model(path, config, torch.float32, torch.device("cpu"), cpu_kernels)
    assert (ours.ops.name == "cpu-kernels") == cpu_kernels  # the kernels build on CI machines
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    kv = KVPool(config.num_layers, 1024, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    for cache in kv.k + kv.v:  # the pool is uninitialised memory: no path may read unwritten slots
        cache[: kv.scratch_slot].fill_(float("nan"))
    return config, ours, ref, kv


def reference_logits(ref, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float()


def random_slots(kv: KVPool, n: int) -> torch.Tensor:
    """Non-contiguous slots, so a forward that ignored the slot table would fail."""
    slots = kv.allocate(2 * n)
    keep, give_back = slots[torch.randperm(2 * n)].split(n)
    kv.free(give_back)
    return keep


@OPS
@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_logits_match_transformers(make_tiny_model, variant, cpu_kernels):
    config, ours, ref, kv = load_both(make_tiny_model(variant), cpu_kernels)
    ids = torch.randint(0, config.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    ids = ids.tolist()
    slots = random_slots(kv, len(ids))
    batch = ForwardBatch.build([ids], [slots], logits_rows=[list(range(len(ids)))])
    got = ours(batch, kv)
    torch.testing.assert_close(got, reference_logits(ref, ids), atol=TOL, rtol=0)


@OPS
@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_prefill_and_decode_match_transformers(make_tiny_model, variant, cpu_kernels):
    """Prefill in two chunks over a cached prefix, then decode token by token."""
    config, ours, ref, kv = load_both(make_tiny_model(variant), cpu_kernels)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, config.vocab_size, (30,), generator=gen).tolist()
    expected = reference_logits(ref, ids)
    slots = random_slots(kv, len(ids))
    pieces = [(0, 17), (17, 26), (26, 27), (27, 28), (28, 29), (29, 30)]
    for start, end in pieces:
        batch = ForwardBatch.build(
            [ids[start:end]], [slots[:end]], logits_rows=[list(range(end - start))]
        )
        got = ours(batch, kv)
        torch.testing.assert_close(got, expected[start:end], atol=TOL, rtol=0)


@OPS
@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_ragged_batch_matches_sequences_alone(make_tiny_model, variant, cpu_kernels):
    """One forward over a prefill, a chunk over a cached prefix and a decode token."""
    config, ours, ref, kv = load_both(make_tiny_model(variant), cpu_kernels)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in (9, 21, 14)]
    new_counts = [9, 6, 1]  # fresh prefill; extend over a 15-token prefix; one decode token
    slot_tables = [random_slots(kv, len(s)) for s in seqs]
    for seq, n, slots in zip(seqs, new_counts, slot_tables, strict=True):
        if n < len(seq):  # fill the cached prefix first
            ours(ForwardBatch.build([seq[: len(seq) - n]], [slots[: len(seq) - n]]), kv)
    batch = ForwardBatch.build(
        [s[len(s) - n :] for s, n in zip(seqs, new_counts, strict=True)],
        slot_tables,
        logits_rows=[list(range(n)) for n in new_counts],
    )
    got = ours(batch, kv).split(new_counts)
    for seq, n, rows in zip(seqs, new_counts, got, strict=True):
        torch.testing.assert_close(rows, reference_logits(ref, seq)[-n:], atol=TOL, rtol=0)


def test_kv_pool_allocate_and_free():
    kv = KVPool(1, 8, 1, 4, torch.float32, "cpu")
    a = kv.allocate(5)
    assert len(set(a.tolist())) == 5 and kv.num_free_slots == 3
    assert not kv.can_allocate(4)
    with pytest.raises(MemoryError, match="3 free slots, 4 requested"):
        kv.allocate(4)
    kv.free(a[:2])
    b = kv.allocate(5)
    assert set(b.tolist()).isdisjoint(a[2:].tolist())
    kv.free(b)
    kv.free(a[2:])
    assert kv.num_free_slots == 8
    assert sorted(kv.allocate(8).tolist()) == list(range(8))


@OPS
@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_decode_rows_sharing_a_prefix_match_transformers(make_tiny_model, variant, cpu_kernels):
    """Several decode rows over one shared prefix (read once for all rows) and own tails."""
    config, ours, ref, kv = load_both(make_tiny_model(variant), cpu_kernels)
    gen = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, config.vocab_size, (40,), generator=gen).tolist()
    tails = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in (1, 5, 9)]
    prefix_slots = random_slots(kv, len(prefix))
    ours(ForwardBatch.build([prefix], [prefix_slots]), kv)
    tables = []
    for tail in tails:  # each tail's tokens but the last are prefilled over the shared prefix
        slots = torch.cat([prefix_slots, random_slots(kv, len(tail))])
        if len(tail) > 1:
            ours(ForwardBatch.build([tail[:-1]], [slots[:-1]]), kv)
        tables.append(slots)
    batch = ForwardBatch.build([[t[-1]] for t in tails], tables)
    if not cpu_kernels:  # (the C++ kernels read every row's slots alone)
        assert batch.metadata(ours.ops.attention).decode_shared_len == len(prefix)
    got = ours(batch, kv)
    for row, tail in zip(got, tails, strict=True):
        torch.testing.assert_close(row, reference_logits(ref, prefix + tail)[-1], atol=TOL, rtol=0)
