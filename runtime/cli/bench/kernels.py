"""`braid bench kernels`: the Triton kernels on a CUDA GPU, against torch on equal shapes.

Four tables: decode attention vs scaled_dot_product_attention; the fused sampling kernel vs
its PyTorch twin and vs mask-then-sample in plain torch; the fused RoPE + KV store vs its
twin; batch-1 decode of a 1B-class Llama (random weights, one step replayed from a CUDA
graph, as the engine runs it, and eagerly) as a fraction of the GPU's memory bandwidth,
measured with a device copy.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from braid.runtime.cli.bench.common import add_workload, machine, write_result

# Llama-3.2-1B's shape: 16 layers, hidden 2048, GQA 32/8 heads of 64, vocab 128,256.
LLAMA_1B = dict(
    vocab_size=128_256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads,
        "kernels",
        "Triton kernels (attention, sampling, 1B decode) on a CUDA GPU",
        bench_kernels,
        model=False,
    )
    p.add_argument("--context", type=int, nargs="+", default=[1024, 4096, 16384])


def _us(fn) -> float:
    """Median microseconds of fn on the GPU (CUDA events, L2 flushed between runs)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200) * 1e3


def _decode_attention_rows(contexts: list[int]) -> list[dict]:
    import torch.nn.functional as F

    from braid import kernels

    num_heads, num_kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
    rows = []
    for batch in (1, 16, 64):
        for ctx in contexts:
            q = torch.randn(batch, num_heads, head_dim, device="cuda", dtype=dtype)
            k = torch.randn(batch * ctx, num_kv_heads, head_dim, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            # Each sequence's slots are contiguous, as the pool hands out fresh slots.
            kv_indices = torch.arange(batch * ctx, device="cuda", dtype=torch.int64)
            kv_indptr = torch.arange(0, batch * ctx + 1, ctx, device="cuda", dtype=torch.int32)
            scale = head_dim**-0.5
            ours = _us(partial(kernels.decode_attention, q, k, v, kv_indptr, kv_indices, scale))
            # SDPA on the same K/V laid out dense: (B, Hkv, L, D).
            k_d = k.view(batch, ctx, num_kv_heads, head_dim).transpose(1, 2).contiguous()
            v_d = v.view(batch, ctx, num_kv_heads, head_dim).transpose(1, 2).contiguous()
            q_d = q.unsqueeze(2)  # (B, H, 1, D)
            sdpa = _us(partial(F.scaled_dot_product_attention, q_d, k_d, v_d, enable_gqa=True))
            kv_bytes = 2 * k.numel() * k.element_size()
            rows.append(
                dict(
                    batch=batch,
                    context=ctx,
                    triton_us=round(ours, 2),
                    sdpa_us=round(sdpa, 2),
                    speed_vs_sdpa=round(sdpa / ours, 3),
                    triton_gb_s=round(kv_bytes / ours / 1e3, 1),
                )
            )
            del k, v, k_d, v_d
    return rows


def _sample_rows() -> list[dict]:
    from braid import kernels
    from braid.kernels import reference

    vocab = 128_256
    rows = []
    for batch in (1, 64, 512):
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(batch, vocab, device="cuda", generator=g) * 3
        words = (vocab + 31) // 32
        bitmask = torch.randint(-(2**31), 2**31, (batch, words), device="cuda", generator=g)
        bitmask = bitmask.to(torch.int32)
        seeds = torch.arange(batch, device="cuda", dtype=torch.int64)
        for name, top_k, top_p, min_p in (
            ("temperature", 0, 1.0, 0.0),
            ("top-k/p, min-p", 50, 0.9, 0.05),
        ):
            args = (
                logits,
                bitmask,
                torch.full((batch,), 0.8, device="cuda"),
                torch.full((batch,), top_k, device="cuda", dtype=torch.int64),
                torch.full((batch,), top_p, device="cuda"),
                torch.full((batch,), min_p, device="cuda"),
                seeds,
            )

            rows.append(
                dict(
                    batch=batch,
                    vocab=vocab,
                    filters=name,
                    triton_us=round(_us(partial(kernels.sample, *args)), 2),
                    twin_us=round(_us(partial(reference.sample, *args)), 2),
                    mask_then_multinomial_us=round(_us(partial(_plain_torch, logits, bitmask)), 2),
                )
            )
    return rows


def _rope_rows() -> list[dict]:
    """The fused RoPE + KV store against its twin (torch RoPE, then an indexed copy), on the
    1B shape's heads, for a decode batch and prefill chunks."""
    from braid import kernels
    from braid.kernels import reference

    num_heads, num_kv_heads, head_dim, dtype = 32, 8, 64, torch.bfloat16
    angles = torch.outer(torch.arange(8192.0), 0.9 ** torch.arange(head_dim // 2.0))
    cos, sin = angles.cos().cuda(), angles.sin().cuda()
    rows = []
    for tokens in (1, 64, 2048):
        width = (num_heads + 2 * num_kv_heads) * head_dim
        qkv = torch.randn(tokens, width, device="cuda", dtype=dtype)
        k_cache = torch.zeros(8192, num_kv_heads, head_dim, device="cuda", dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        positions = torch.arange(tokens, device="cuda")
        args = (qkv, num_heads, num_kv_heads, positions, cos, sin, k_cache, v_cache, positions)
        rows.append(
            dict(
                tokens=tokens,
                triton_us=round(_us(partial(kernels.rope_store_kv, *args)), 2),
                twin_us=round(_us(partial(reference.rope_store_kv, *args)), 2),
            )
        )
    return rows


def _plain_torch(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Mask, then temperature 0.8 and a multinomial draw (no filters): the unfused baseline."""
    from braid.kernels.reference.sampling import apply_bitmask

    masked = apply_bitmask(logits, bitmask)
    return torch.multinomial(torch.softmax(masked / 0.8, dim=-1), 1)


def _copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write): the bandwidth reachable."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (_us(lambda: dst.copy_(src)) * 1e-6)


def _llama_1b_decode(context: int) -> dict:
    import transformers

    from braid.runtime.executor.cuda_graphs import DecodeGraphs
    from braid.runtime.executor.forward_batch import ForwardBatch
    from braid.runtime.kvcache.pool import KVPool
    from braid.runtime.models import LlamaForCausalLM
    from braid.runtime.models.config.model_config import ModelConfig
    from braid.runtime.models.layers.ops import TRITON_OPS

    config = ModelConfig.from_hf(transformers.LlamaConfig(**LLAMA_1B))
    dtype = torch.bfloat16
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.materialize("cuda").to(dtype)
    model.rotary.float().reset()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.eval().requires_grad_(False)
    model.ops = TRITON_OPS
    kv = KVPool(config.num_layers, context, config.num_kv_heads, config.head_dim, dtype, "cuda")
    slots = torch.arange(context)
    batch = ForwardBatch.build([[1]], [slots], device="cuda")
    eager_us = _us(lambda: model(batch, kv))
    # What the engine runs: the step's inputs copied into the graph's buffers, then a replay.
    graphs = DecodeGraphs(model, kv, max_batch=1, max_context=context)
    us = _us(lambda: graphs.forward([[1]], [slots]))
    # A decode step reads every weight once (the tied embedding once, as lm_head) and the KV
    # of the whole context.
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = KVPool.bytes_per_token(
        config.num_layers, config.num_kv_heads, config.head_dim, dtype
    )
    moved = weight_bytes + kv_bytes * context
    copy = _copy_bandwidth()
    return dict(
        context=context,
        step_us=round(us, 1),
        eager_step_us=round(eager_us, 1),
        bytes_read=moved,
        achieved_gb_s=round(moved / us / 1e3, 1),
        copy_gb_s=round(copy / 1e9, 1),
        fraction_of_copy_bandwidth=round(moved / (us * 1e-6) / copy, 3),
    )


def bench_kernels(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print(
            "braid bench kernels: needs a CUDA GPU, and torch sees none; nothing was measured",
            file=sys.stderr,
        )
        return 1
    result = {
        "workload": "kernels",
        "machine": machine(),
        "decode_attention": _decode_attention_rows(args.context),
        "sample": _sample_rows(),
        "rope_store_kv": _rope_rows(),
        "llama_1b_decode": _llama_1b_decode(context=1024),
    }
    print(f"kernels, {result['machine']}")
    print("decode attention, 32 query / 8 KV heads of 128, bf16 (us; SDPA on dense K/V)")
    print(f"{'batch':>6}{'context':>9}{'triton':>10}{'sdpa':>10}{'sdpa/triton':>13}{'GB/s':>8}")
    for r in result["decode_attention"]:
        print(
            f"{r['batch']:>6}{r['context']:>9}{r['triton_us']:>10.1f}{r['sdpa_us']:>10.1f}"
            f"{r['speed_vs_sdpa']:>13.2f}{r['triton_gb_s']:>8.0f}"
        )
    print("sampling, V = 128,256, random bitmask (us)")
    print(f"{'batch':>6}  {'filters':<16}{'triton':>10}{'twin':>10}{'mask+multinomial':>18}")
    for r in result["sample"]:
        print(
            f"{r['batch']:>6}  {r['filters']:<16}{r['triton_us']:>10.1f}{r['twin_us']:>10.1f}"
            f"{r['mask_then_multinomial_us']:>18.1f}"
        )
    print("RoPE + KV store, 32 query / 8 KV heads of 64, bf16 (us)")
    print(f"{'tokens':>7}{'triton':>10}{'twin':>10}")
    for r in result["rope_store_kv"]:
        print(f"{r['tokens']:>7}{r['triton_us']:>10.1f}{r['twin_us']:>10.1f}")
    d = result["llama_1b_decode"]
    print(
        f"1B Llama, batch-1 decode step at context {d['context']}: {d['step_us']:.0f} us "
        f"with a CUDA graph ({d['eager_step_us']:.0f} us eager), {d['achieved_gb_s']:.0f} GB/s "
        f"= {d['fraction_of_copy_bandwidth']:.0%} of a device copy's {d['copy_gb_s']:.0f} GB/s"
    )
    write_result(result, args.json)
    return 0
