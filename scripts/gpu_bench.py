"""Engine throughput on a GPU for random-weight Llama shapes: prefill tok/s, and decode tok/s
at batch 1 and 64, in bfloat16. Random weights decode as fast as trained ones (the work is
the same); nothing is downloaded: the shapes are Llama 3.2 1B's and Llama 3.1 8B's, with the
default model's tokenizer (prompts are random token ids below its size).

    python scripts/gpu_bench.py --sizes 1b,8b --json out.json

Each size writes an HF directory of random bfloat16 safetensors under --workdir, runs the
engine over it and appends its figures to the JSON file as soon as they are measured (a size
that runs out of time leaves those before it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

from braid.runtime import Engine, SamplingParams
from braid.runtime.loading.default_model import default_model_dir

# Llama 3.2 1B (tied embeddings) and Llama 3.1 8B.
SHAPES = {
    "1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
    ),
}  # fmt: skip
VOCAB = 128256
PREFILL_PROMPTS, PREFILL_LEN = 16, 1024
DECODE_PROMPT_LEN, DECODE_STEPS = 128, 128


def write_random_model(size: str, out: Path) -> None:
    """An HF Llama directory of `size`'s shape with random bfloat16 weights, made on the GPU."""
    tokenizer_dir = default_model_dir()
    config = transformers.LlamaConfig(
        architectures=["LlamaForCausalLM"], vocab_size=VOCAB, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_parameters=dict(rope_type="default", rope_theta=500000.0),
        **SHAPES[size],
    )  # fmt: skip
    config.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    with torch.device("meta"):
        shapes = transformers.LlamaForCausalLM(config).state_dict()
    weights = {}
    for name, meta in shapes.items():
        if name.endswith("norm.weight"):
            w = torch.ones(meta.shape, dtype=torch.bfloat16, device="cuda")
        else:
            w = torch.randn(meta.shape, dtype=torch.bfloat16, device="cuda").mul_(0.02)
        weights[name] = w.cpu()
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, out / "model.safetensors")


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Ids from 1000 up: past the tokenizer's special tokens.
    return torch.randint(1000, vocab, (n, length), generator=g).tolist()


def seconds(engine: Engine, prompts: list[list[int]], max_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.generate(prompts, params)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def decode_tok_s(engine: Engine, batch: int, vocab: int) -> float:
    """Decode tokens a second at `batch`: a run of DECODE_STEPS more tokens than a prefill-only
    run of the same prompts, the difference in time divided into the difference in tokens."""
    prompts = random_prompts(batch, DECODE_PROMPT_LEN, vocab, seed=batch)
    seconds(engine, prompts, 2)  # warm: compiles the kernels for this batch's shapes
    prefill = seconds(engine, prompts, 1)
    full = seconds(engine, prompts, 1 + DECODE_STEPS)
    return batch * DECODE_STEPS / (full - prefill)


def bench(size: str, workdir: Path) -> dict:
    model_dir = workdir / f"llama-{size}-random"
    start = time.perf_counter()
    write_random_model(size, model_dir)
    written = time.perf_counter() - start
    # No prefix cache: every timed run computes its prompts itself.
    engine = Engine(
        model=str(model_dir), device="cuda", dtype="bfloat16", max_kv_tokens=65536,
        prefix_cache=False,
    )  # fmt: skip
    try:
        vocab = len(engine.tokenizer)
        prompts = random_prompts(PREFILL_PROMPTS, PREFILL_LEN, vocab, seed=0)
        seconds(engine, prompts[:2], 1)  # warm
        prefill = PREFILL_PROMPTS * PREFILL_LEN / seconds(engine, prompts, 1)
        result = {
            "model": f"random Llama {size} shape, bfloat16",
            "prefill_tok_s": round(prefill, 1),
            "prefill_prompts": f"{PREFILL_PROMPTS} x {PREFILL_LEN} tokens",
            "decode_prompt_tokens": DECODE_PROMPT_LEN,
            "decode_steps": DECODE_STEPS,
        }
        for batch in (1, 64):
            result[f"decode_tok_s_batch_{batch}"] = round(decode_tok_s(engine, batch, vocab), 1)
        result["setup_s"] = round(written, 1)
        return result
    finally:
        engine.shutdown()
        shutil.rmtree(model_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1b", help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--json", type=Path, required=True, help="results, appended per size")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    results = {"gpu": torch.cuda.get_device_name(), "sizes": {}}
    for size in args.sizes.split(","):
        if size not in SHAPES:
            parser.error(f"unknown size {size!r}; known: {', '.join(SHAPES)}")
        results["sizes"][size] = bench(size, args.workdir)
        print(json.dumps({size: results["sizes"][size]}), flush=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
