"""Decode CUDA graphs: padded static batches give the logits and KV writes of an eager batch.

On the CPU the graphs are not captured; `DecodeGraphs.forward` runs the Triton path (in
triton's interpreter) over the same static buffers, which checks the padding rows, the scratch
slot and stale buffer contents from an earlier, larger step. With a GPU the engine's greedy
output with graphs equals its output without them.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from braid.runtime import Engine, SamplingParams
from braid.runtime.executor.cuda_graphs import DecodeGraphs
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.models.layers.ops import TORCH_OPS, TRITON_OPS

NUM_SLOTS = 64


@pytest.fixture
def model_and_pool(tiny_model_path, device):
    mc = load_model_config(tiny_model_path)
    model = load_model(tiny_model_path, mc, torch.float32, torch.device(device), False)
    kv = KVPool(mc.num_layers, NUM_SLOTS, mc.num_kv_heads, mc.head_dim, torch.float32, device)
    g = torch.Generator().manual_seed(0)
    for cache in kv.k + kv.v:  # a context already computed, except the scratch row
        cache[:NUM_SLOTS].copy_(torch.randn(cache[:NUM_SLOTS].shape, generator=g))
    return model, kv


def tables(lengths: list[int], seed: int) -> list[torch.Tensor]:
    perm = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(seed))
    starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
    return [perm[a:b] for a, b in zip(starts, starts[1:], strict=False)]


def eager(model, kv: KVPool, new_tokens, slot_tables):
    """The reference: a ForwardBatch through the torch path, on a copy of the pool."""
    ref = KVPool(len(kv.k), kv.num_slots, kv.k[0].shape[1], kv.k[0].shape[2], torch.float32, "cpu")
    for dst, src in zip(ref.k + ref.v, kv.k + kv.v, strict=True):
        dst.copy_(src.cpu())
    model_cpu = copy.deepcopy(model).cpu()
    model_cpu.ops = TORCH_OPS
    logits = model_cpu(ForwardBatch.build(new_tokens, slot_tables), ref)
    return logits, ref


def test_padded_decode_steps_equal_eager_batches(model_and_pool, device):
    model, kv = model_and_pool
    graphs = DecodeGraphs(model, kv, max_batch=4, max_context=512)
    assert graphs.sizes == [1, 2, 4]
    # A step of 3 (padded to 4), then a step of 2 whose buffers still hold the first's tail.
    for lengths, tokens, seed in [([9, 17, 3], [[5], [77], [1]], 1), ([4, 6], [[8], [2]], 2)]:
        slot_tables = tables(lengths, seed)
        expected, ref = eager(model, kv, tokens, slot_tables)
        before = [c.clone() for c in kv.k + kv.v]
        model.ops = TRITON_OPS
        logits = graphs.forward(tokens, slot_tables)
        torch.testing.assert_close(logits.cpu(), expected, atol=1e-4, rtol=1e-4)
        written = torch.stack([t[-1] for t in slot_tables])
        untouched = torch.ones(NUM_SLOTS + 1, dtype=torch.bool)
        untouched[written] = False
        untouched[kv.scratch_slot] = False  # padding rows write there
        for got, want, old in zip(kv.k + kv.v, ref.k + ref.v, before, strict=True):
            torch.testing.assert_close(got[written].cpu(), want[written], atol=1e-5, rtol=1e-5)
            assert torch.equal(got[untouched], old[untouched])


def test_only_plain_decode_steps_fit(model_and_pool):
    model, kv = model_and_pool
    graphs = DecodeGraphs(model, kv, max_batch=4, max_context=8)  # 32 slot table entries
    decode = tables([5, 9], 3)
    assert graphs.fits([[1], [2]], decode, [[0], [0]])
    assert not graphs.fits([[1, 2], [2]], decode, [[1], [0]])  # a prefill chunk
    assert not graphs.fits([[1], [2]], decode, [[], [0]])  # a request that samples nothing
    assert not graphs.fits([[1], [2]], decode, [[0, 0], [0]])  # prompt logprobs too
    assert not graphs.fits([[1]] * 5, tables([2] * 5, 4), [[0]] * 5)  # past the largest
    assert not graphs.fits([[1]] * 3, tables([11, 11, 11], 5), [[0]] * 3)  # past the capacity


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_greedy_output_is_the_same_with_graphs(tiny_model_path, dtype):
    # 6 ragged prompts decode together: the graph of 8 with two padding rows.
    prompts = [list(range(1, 2 + 3 * i)) + [i + 7] for i in range(6)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outputs = []
    for max_batch in (0, 8):
        engine = Engine(
            str(tiny_model_path), device="cuda", dtype=dtype, cuda_graph_max_batch=max_batch
        )
        try:
            assert (engine.runner.graphs is None) == (max_batch == 0)
            outputs.append([o.token_ids for o in engine.generate(prompts, params)])
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the Triton kernels on CPU tensors, in triton's interpreter (set without a GPU); "
    "with one, test_engine_greedy_output_is_the_same_with_graphs takes the runner's path",
)
def test_engine_decode_steps_through_graphs_on_the_cpu(tiny_model_path):
    """The model runner's path into the graphs (which steps fit, logits rows, padding), run on
    the CPU: an engine on the Triton path gives the same greedy tokens with and without them."""
    prompts = [list(range(1, 2 + 3 * i)) + [i + 7] for i in range(3)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs, replays = [], []

    def counted(forward):
        def run(new_tokens, slot_tables):
            replays.append(len(new_tokens))
            return forward(new_tokens, slot_tables)

        return run

    for with_graphs in (False, True):
        engine = Engine(str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=256)
        try:
            engine.model.ops = TRITON_OPS
            if with_graphs:
                graphs = DecodeGraphs(engine.model, engine.kv, 4, 512)
                graphs.forward = counted(graphs.forward)
                engine.runner.graphs = graphs
            outputs.append([o.token_ids for o in engine.generate(prompts, params)])
        finally:
            engine.shutdown()
    # Decode steps went through the graphs (those of all three padded to 4; when the engine
    # thread woke between submissions, the first steps were hybrid and ran eagerly).
    assert replays and set(replays) <= {1, 2, 3}
    assert outputs[0] == outputs[1]
