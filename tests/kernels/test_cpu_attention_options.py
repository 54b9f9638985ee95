"""The C++ decode attention's options (kernels/cpu/cpu_attention.cpp): soft-capped scores (Gemma 2)
and attention sinks (GPT-OSS), against the PyTorch twin, on every vector path and the head
sizes the families use; a window's hidden slots are never read; and CpuKernelAttention attends
Gemma 2's soft-capped layers with them, as TorchAttention does."""

from __future__ import annotations

import pytest
import torch
from conftest import kernels_built_with

from braid.kernels import cpu, reference

# As tests/kernels/test_cpu.py's: the kernels sum in another order, and round to bfloat16 where
# the twin does.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=8e-3)}
# Each vector path built and checked, whichever this CPU would pick (as tests/kernels/test_cpu.py).
PATHS = {
    "native": (),
    "avx512-no-bf16-dot": ("-mno-avx512bf16",),
    "avx2": ("-mno-avx512f",),
    "portable": ("-mno-avx512f", "-mno-avx2"),
}
OPTIONS = {"softcap": (1.5, False), "sinks": (None, True), "both": (2.0, True)}


@pytest.fixture(scope="module", params=list(PATHS))
def path_lib(request) -> cpu.CpuKernels:
    return kernels_built_with(PATHS[request.param])


@pytest.fixture(scope="module")
def lib() -> cpu.CpuKernels:
    kernels = cpu.load()
    assert kernels is not None, "the CPU kernels must build wherever a C++ compiler is found"
    return kernels


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def sink_logits(num_heads: int) -> torch.Tensor:
    """Around the scores' size, the first large enough to take most of its head's weight."""
    s = randn(num_heads, seed=9) * 2
    s[0] = 6.0
    return s


def decode_case(heads, kv_heads, head_dim, dtype, lengths, tokens=10, pool=1200):
    """(q, k_cache, v_cache, kv_indices, kv_starts) of decode rows over scattered slots."""
    qkv = randn(tokens, heads + 2 * kv_heads, head_dim, dtype=dtype)
    k_cache = randn(pool, kv_heads, head_dim, dtype=dtype, seed=1)
    v_cache = randn(pool, kv_heads, head_dim, dtype=dtype, seed=2)
    indices = torch.randperm(pool, generator=torch.Generator().manual_seed(3))[: sum(lengths)]
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    return qkv[:, :heads], k_cache, v_cache, indices, starts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim",
    [(8, 2, 64), (4, 1, 128), (4, 2, 256), (3, 3, 80)],
    ids=["gqa-d64", "mqa-d128", "gqa-d256", "mha-d80"],
)
def test_decode_attention_options_equal_the_twin(
    path_lib, dtype, option, heads, kv_heads, head_dim
):
    """Rows of a hybrid batch (others untouched), one of a single slot, two past 256 slots
    (the portable path's chunks, whose sink joins once where they merge)."""
    softcap, with_sinks = OPTIONS[option]
    sinks = sink_logits(heads) if with_sinks else None
    lengths, rows = [1, 257, 700, 33], torch.tensor([0, 3, 4, 9])
    q, k_cache, v_cache, indices, starts = decode_case(heads, kv_heads, head_dim, dtype, lengths)
    scale = 0.9 / head_dim**0.5  # scores of a few units: the cap bends them
    out = torch.full((10, heads, head_dim), 7.0, dtype=dtype)
    path_lib.decode_attention(
        q, k_cache, v_cache, out, rows, starts, torch.tensor(lengths), indices, scale,
        softcap=softcap, sinks=sinks,
    )  # fmt: skip
    indptr = torch.tensor([0, *lengths]).cumsum(0)
    args = (q[rows], k_cache, v_cache, indptr, indices, scale)
    want = reference.decode_attention(*args, softcap=softcap, sinks=sinks)
    torch.testing.assert_close(out[rows], want, **TOL[dtype])
    others = torch.ones(10, dtype=torch.bool)
    others[rows] = False
    assert bool((out[others] == 7.0).all())
    # The option changed the result well past the tolerance: the check can fail.
    plain = reference.decode_attention(*args)
    assert (want.float() - plain.float()).abs().max() > 0.05


@pytest.mark.parametrize("head_dim", [64, 256, 80])
def test_a_windows_hidden_slots_are_not_read(path_lib, head_dim):
    """The metadata moves each row's first slot to its window's left edge: the slots before it
    hold NaN here, and the result is the twin's over the window of the clean pool."""
    heads, kv_heads, window = 4, 2, 40
    lengths, rows = [1, 300, 41, 90], torch.tensor([0, 1, 2, 3])
    q, k_cache, v_cache, indices, starts = decode_case(
        heads, kv_heads, head_dim, torch.float32, lengths, tokens=4
    )
    indptr = torch.tensor([0, *lengths]).cumsum(0)
    sinks = sink_logits(heads)
    want = reference.decode_attention(
        q, k_cache, v_cache, indptr, indices, 0.1, window=window, softcap=3.0, sinks=sinks
    )
    lens = torch.tensor(lengths)
    hidden = (lens - window).clamp_min(0)
    for start, n in zip(starts.tolist(), hidden.tolist(), strict=True):
        k_cache[indices[start : start + n]] = float("nan")
        v_cache[indices[start : start + n]] = float("nan")
    out = torch.empty_like(q)
    path_lib.decode_attention(
        q, k_cache, v_cache, out, rows, starts + hidden, lens - hidden, indices, 0.1,
        softcap=3.0, sinks=sinks,
    )  # fmt: skip
    torch.testing.assert_close(out, want, **TOL[torch.float32])


def test_rope_store_attend_passes_the_options(path_lib):
    """The fused call attends with the options as decode_attention does after the store."""
    heads, kv_heads, head_dim, tokens = 4, 2, 64, 3
    lengths, rows = [5, 300, 1], torch.tensor([0, 1, 2])
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim)
    angles = torch.arange(512)[:, None] * 0.37 ** torch.arange(head_dim // 2)[None, :]
    cos, sin = angles.cos(), angles.sin()
    positions = torch.tensor(lengths) - 1
    caches = [randn(400, kv_heads, head_dim, seed=s) for s in (5, 6)]
    perm = torch.randperm(400, generator=torch.Generator().manual_seed(4))
    tables = torch.split(perm[: sum(lengths)], lengths)
    slots = torch.stack([t[-1] for t in tables])  # each row's token is stored in its last slot
    indices, starts = torch.cat(tables), torch.tensor([0, *lengths[:-1]]).cumsum(0)
    sinks = sink_logits(heads)
    ref_qkv, ref_caches = qkv.clone(), [c.clone() for c in caches]
    out = torch.empty(tokens, heads, head_dim)
    path_lib.rope_store_attend(
        qkv, heads, kv_heads, positions, cos, sin, *caches, slots, out, rows, starts,
        torch.tensor(lengths), indices, 0.2, softcap=1.0, sinks=sinks,
    )  # fmt: skip
    reference.rope_store_kv(ref_qkv, heads, kv_heads, positions, cos, sin, *ref_caches, slots)
    q = ref_qkv.view(tokens, -1, head_dim)[:, :heads]
    indptr = torch.tensor([0, *lengths]).cumsum(0)
    want = reference.decode_attention(
        q, *ref_caches, indptr, indices, 0.2, softcap=1.0, sinks=sinks
    )
    torch.testing.assert_close(out, want, **TOL[torch.float32])


def test_bad_options_are_refused(lib):
    q, k_cache, v_cache, indices, starts = decode_case(4, 2, 64, torch.float32, [3], tokens=1)
    args = (q, k_cache, v_cache, torch.empty_like(q), torch.tensor([0]), starts,
            torch.tensor([3]), indices, 0.1)  # fmt: skip
    with pytest.raises(ValueError, match="softcap must be positive"):
        lib.decode_attention(*args, softcap=0.0)
    with pytest.raises(ValueError, match="one a head"):
        lib.decode_attention(*args, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="float32"):
        lib.decode_attention(*args, sinks=torch.zeros(4, dtype=torch.bfloat16))


# ---- end to end: Gemma 2's soft-capped layers through CpuKernelAttention --------------------

GEMMA2 = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,  # a sliding-window layer, then a global one
    sliding_window=8,
    query_pre_attn_scalar=20,
    attn_logit_softcapping=2.0,  # small enough to bend random scores
    final_logit_softcapping=5.0,
    max_position_embeddings=512,
)


@pytest.fixture(scope="module", params=[16, 256], ids=["d16", "d256"])
def gemma2_path(request, tmp_path_factory):
    import transformers

    config = transformers.Gemma2Config(head_dim=request.param, **GEMMA2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = tmp_path_factory.mktemp(f"gemma2-d{request.param}")
    model.save_pretrained(path)
    return path


def test_gemma2_logits_through_the_kernels_equal_torchs(gemma2_path, lib, monkeypatch):
    """Every kind of batch the kernels take with soft-capped scores (one long prefill, short
    extends, a lone decode, decodes sharing a prefix longer than the window beside a chunk)
    gives TorchAttention's logits; and the kernels did attend with the cap."""
    from braid.runtime.executor.forward_batch import ForwardBatch
    from braid.runtime.kvcache.pool import KVPool
    from braid.runtime.loading.model_loader import load_model, load_model_config

    capped = []
    for name in ("decode_attention", "rope_store_attend"):
        original = getattr(cpu.CpuKernels, name)

        def spy(self, *args, _original=original, **kwargs):
            capped.append(kwargs.get("softcap", args[-2] if len(args) > 10 else None))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cpu.CpuKernels, name, spy)

    config = load_model_config(gemma2_path)
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(0, 128, (n,), generator=gen).tolist()

    prompt, tails, chunk = ids(100), [ids(1) for _ in range(3)], ids(5)
    runs = []
    for cpu_kernels in (True, False):
        model = load_model(gemma2_path, config, torch.float32, torch.device("cpu"), cpu_kernels)
        kv = KVPool(config.num_layers, 512, config.num_kv_heads, config.head_dim,
                    torch.float32, "cpu")  # fmt: skip
        for cache in kv.k + kv.v:  # no path may read a slot before it is written
            cache[: kv.scratch_slot].fill_(float("nan"))
        prefix = kv.allocate(len(prompt))
        tables = [torch.cat([prefix, kv.allocate(1)]) for _ in tails]
        chunk_table = torch.cat([prefix, kv.allocate(len(chunk))])
        steps = [
            ([prompt[:95]], [prefix[:95]]),  # long: one matmul on the torch path
            ([prompt[95:]], [prefix]),  # short extend: rows
            ([tails[0]], [tables[0]]),  # a lone decode: the fused call
            # decodes sharing 100 slots, and a chunk over them: rows, hybrid
            ([*tails[1:], chunk], [*tables[1:], chunk_table]),
        ]
        logits = []
        for new, slots in steps:
            rows = [list(range(len(n))) for n in new]
            batch = ForwardBatch.build(new, slots, logits_rows=rows)
            logits.append(model(batch, kv))
        runs.append(logits)
    for got, want in zip(*runs, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert capped and all(c == GEMMA2["attn_logit_softcapping"] for c in capped)
