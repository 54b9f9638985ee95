"""Tensor parallelism on the CPU (gloo, two rank processes): the same greedy tokens as one
process, each rank holding its share of the KV pool; prefix-cache hits and concurrent
requests; a rank that dies fails requests with an error instead of hanging; bad tp refused;
quantized shards."""

from __future__ import annotations

import os
import signal
import socket
from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import assert_no_kv_leak

from braid.kernels.cpu.quant import FORMATS
from braid.runtime import Engine, SamplingParams
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.models import ModelConfig
from braid.runtime.tp import plan_shards
from braid.runtime.tp.sharding import parallelize

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def run(engine: Engine, prompts: list[str]) -> list[list[int]]:
    return [out.token_ids for out in engine.generate(prompts, GREEDY)]


def test_plan_splits_uneven_heads_by_whole_kv_heads():
    # The default model's shape: 9 query heads, 3 KV heads, 1536 MLP features.
    hf = transformers.LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        architectures=["LlamaForCausalLM"],
    )
    mc = ModelConfig.from_hf(hf)
    first, second = plan_shards(mc, 2)
    assert (first.kv_heads, first.heads, first.features) == ((0, 2), (0, 6), (0, 768))
    assert (second.kv_heads, second.heads, second.features) == ((2, 3), (6, 9), (768, 1536))
    with pytest.raises(ValueError, match="3 KV heads .* use tp <= 3"):
        plan_shards(mc, 4)


def test_bad_tp_is_refused(tiny_model_path):
    with pytest.raises(ValueError, match="tp must be >= 1"):
        Engine(model=str(tiny_model_path), tp=0)
    with pytest.raises(ValueError, match="tp=3: the model has 2 KV heads"):
        Engine(model=str(tiny_model_path), device="cpu", tp=3)
    with pytest.raises(ValueError, match="self-draft"):
        Engine(model=str(tiny_model_path), tp=2, spec_method="draft", draft_model="self")


@pytest.mark.model
@pytest.mark.slow  # suite time: the tiny model's tp2 tests run by default
def test_default_model_tp2_matches_tp1():
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small"]
    config = dict(device="cpu", dtype="float32", max_kv_tokens=1024, quantization="none")
    one = Engine(**config)
    try:
        expected, [whole] = run(one, prompts), one.tp_ranks
    finally:
        one.shutdown()
    two = Engine(tp=2, **config)
    try:
        assert run(two, prompts) == expected
        rank0, rank1 = two.tp_ranks
    finally:
        two.shutdown()
    # 3 KV heads over 2 ranks: 2 + 1 whole heads (query heads 6 + 3); each rank's pool holds
    # its heads of every slot, and together they hold what one process holds.
    assert rank1.pid != os.getpid() and rank0.pid == os.getpid()
    assert (rank0.num_heads, rank0.num_kv_heads) == (6, 2)
    assert (rank1.num_heads, rank1.num_kv_heads) == (3, 1)
    assert rank0.intermediate_size == rank1.intermediate_size == whole.intermediate_size // 2
    assert rank0.kv_shape == (1025, 2, 64) and rank1.kv_shape == (1025, 1, 64)
    assert rank0.kv_bytes == 2 * rank1.kv_bytes
    assert rank0.kv_bytes + rank1.kv_bytes == whole.kv_bytes
    assert exited(rank1.pid)


def test_tiny_tp2_prefix_cache_and_concurrent_requests(tiny_model_path):
    # Four requests sharing a prefix, run together, then two again (cache hits); small chunks
    # make the prompts prefill over several steps beside the others' decodes. The tp=2 engine
    # also drafts n-grams (greedy output is the same with them), whose verification sends
    # draft trees to the other rank.
    shared = " ".join(f"word{i}" for i in range(16))
    prompts = [f"{shared} {tail}" for tail in ("alpha", "beta", "gamma", "delta")]
    config = dict(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=512)
    one = Engine(chunk_size=16, **config)
    try:
        expected = run(one, prompts) + run(one, prompts[:2])
    finally:
        one.shutdown()
    two = Engine(tp=2, chunk_size=16, spec_method="ngram", **config)
    try:
        assert run(two, prompts) == expected[:4]
        cached = two.stats()["cached_tokens"]
        assert run(two, prompts[:2]) == expected[4:]
        assert two.stats()["cached_tokens"] - cached >= 2 * 30  # the whole prompts, nearly
        assert two.stats()["spec_accepted_tokens"] > 0
        assert_no_kv_leak(two)
        rank0, rank1 = two.tp_ranks
        # 2 KV heads, 4 query heads: one KV head each, exactly half of the pool.
        assert rank0.kv_shape == rank1.kv_shape == (513, 1, 16)
        assert rank0.kv_bytes == rank1.kv_bytes
        # A rank that dies: the step that finds it fails with an error naming it, and so
        # does every request after it, instead of waiting on the dead rank.
        os.kill(rank1.pid, signal.SIGKILL)
        for _ in range(2):
            with pytest.raises(RuntimeError, match="tensor-parallel rank 1 exited"):
                two.generate(prompts[0], GREEDY)
    finally:
        two.shutdown()
    assert exited(rank1.pid)


def listening_addresses(pid: int) -> dict[int, str]:
    """The TCP sockets process `pid` listens on: each one's port and local address, in hex
    as /proc writes it (0100007F: 127.0.0.1)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed since listed
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    addresses = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                    address, port = fields[1].rsplit(":", 1)
                    addresses[int(port, 16)] = address
    return addresses


def is_loopback(address: str) -> bool:
    """127.0.0.1 in tcp; ::1 or ::ffff:127.0.0.1 in tcp6."""
    return address in ("0100007F", "00000000000000000000000001000000") or (
        address.endswith("0100007F")
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_the_ranks_listen_on_loopback_only(tiny_model_path):
    """Nothing the ranks open may be reached from another machine: the rendezvous is a file
    (a TCP store listened on every interface, and anyone could read and write its keys), and
    gloo's sockets are bound to 127.0.0.1."""
    # The check sees what a process listens on, and tells every interface from loopback.
    with socket.create_server(("0.0.0.0", 0)) as wide, socket.create_server(("127.0.0.1", 0)) as lo:
        seen = listening_addresses(os.getpid())
        wide_at, lo_at = seen.get(wide.getsockname()[1]), seen.get(lo.getsockname()[1])
    assert wide_at is not None and not is_loopback(wide_at), seen
    assert lo_at is not None and is_loopback(lo_at), seen
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", tp=2)
    try:
        rank1 = engine.tp_ranks[1]
        # gloo's listening sockets, in both processes: a check that saw none would prove nothing.
        for pid in (os.getpid(), rank1.pid):
            listening = listening_addresses(pid)
            assert listening, f"process {pid} listens on nothing"
            assert [a for a in listening.values() if not is_loopback(a)] == [], (pid, listening)
        assert engine.generate("hi", GREEDY).text is not None
    finally:
        engine.shutdown()


def test_a_parallelized_quantized_shard_decodes_through_its_all_reduces(tiny_model_path):
    """A quantized shard has the one-call decode stack (quant_decoder.py) until its o and
    down projections sum over the ranks: then every step must take the layers with them."""
    mc = load_model_config(tiny_model_path)
    shard = plan_shards(mc, 2)[0]
    model = load_model(
        tiny_model_path, mc, torch.float32, torch.device("cpu"), quantization="int8", shard=shard
    )
    assert model.decoder is not None
    summed = []
    parallelize(model, SimpleNamespace(all_reduce=summed.append))
    assert model.decoder is None
    smc = shard.model_config(mc)
    kv = KVPool(smc.num_layers, 16, smc.num_kv_heads, smc.head_dim, torch.float32, "cpu")
    slots = kv.allocate(3)
    model(ForwardBatch.build([[1, 2]], [slots[:2]]), kv)
    summed.clear()
    model(ForwardBatch.build([[3]], [slots]), kv)  # a decode step
    assert len(summed) == 2 * mc.num_layers


def test_quantized_shards_are_slices_of_the_quantized_model(tiny_model_path):
    """int8 with tp: each rank quantizes its own shard, and its blocks are exactly the whole
    model's blocks for its rows (q/k/v, gate/up) or its whole blocks of inputs (o, down)."""
    mc = load_model_config(tiny_model_path)
    cpu = torch.device("cpu")

    def load(shard=None):  # without the kernels, which would interleave the rows
        model = load_model(
            tiny_model_path, mc, torch.float32, cpu, False, quantization="int8", shard=shard
        )
        return {name: t for name, t in model.state_dict().items() if name.endswith(".blocks")}

    whole = load()
    q8 = FORMATS["q8"]
    for shard in plan_shards(mc, 2):
        part = load(shard)
        assert part.keys() == whole.keys()
        heads, kv_heads = (tuple(h * mc.head_dim for h in r) for r in (shard.heads, shard.kv_heads))
        q, k = slice(*heads), slice(*kv_heads)
        for name, blocks in part.items():
            full = whole[name]
            if "qkv_proj" in name:
                q_size, kv_size = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
                rows = torch.cat([full[q], full[q_size:][k], full[q_size + kv_size :][k]])
                assert torch.equal(blocks, rows), name
            elif "gate_up_proj" in name:
                gate, up = full.chunk(2)
                f = slice(*shard.features)
                assert torch.equal(blocks, torch.cat([gate[f], up[f]])), name
            elif "o_proj" in name or "down_proj" in name:
                first, end = heads if "o_proj" in name else shard.features
                width = q8.block_bytes
                columns = slice(first // q8.block * width, end // q8.block * width)
                assert torch.equal(blocks, full[:, columns]), name
            else:
                assert torch.equal(blocks, full), name
