"""Reference logits and greedy tokens from the real llama.cpp (llama-cpp-python) for seeded
random GGUF files of every block type and family braid reads, and for the default model:
the data tests/runtime/loading/test_llama_cpp_refs.py checks braid against on every run.

    .venv/bin/python scripts/llama_cpp_refs.py            # all cases
    .venv/bin/python scripts/llama_cpp_refs.py llama-Q4_K  # some

Run in braid's venv: it writes each file (scripts/random_gguf.py, scripts/hf_gguf.py), runs
llama.cpp on it in the peer venv (scripts/peer_venv.sh llama-cpp, made if absent), and
writes tests/data/llama_cpp/NAME.json: a digest of the file (so a file that is no longer
written the same fails the test with an instruction to rerun this), the prompt,
llama.cpp's logits at every position over the ids the test compares (llama.cpp's top ones
and a fixed random set), the argmax and its margin over the whole vocabulary, and the greedy
continuation with each step's margin. The test imports this file (tests/conftest.py's
`llama_cpp_refs`) to write the same files.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_gguf  # noqa: E402
import random_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "llama_cpp"
PROMPT_LEN = 16
# The random files' vocabulary: the default model's first 1,024 tokens and their merges
# (random_gguf.tokenizer_fields). The whole one (49,152) costs the test seconds per file to
# read and convert, and checks nothing the smaller one does not.
VOCAB = 1024
GREEDY = 8
TOP = 8  # llama.cpp's highest logits kept per position
SAMPLED = 32  # and these many fixed random ids

# Run in the peer venv: one JSON job on stdin, one JSON answer on stdout.
_PEER = """
import json, sys
import numpy as np, llama_cpp
job = json.load(sys.stdin)
llm = llama_cpp.Llama(job["path"], n_ctx=256, logits_all=True, verbose=False, n_threads=2)
llm.eval(job["prompt"])
prompt = np.array(llm.scores[: len(job["prompt"])], dtype=np.float32)
greedy, margins = [], []
for _ in range(job["greedy"]):
    last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    top2 = np.sort(last)[-2:]
    greedy.append(int(last.argmax()))
    margins.append(float(top2[1] - top2[0]))
    llm.eval([greedy[-1]])
np.save(job["out"], prompt)
json.dump({"greedy": greedy, "margins": margins, "version": llama_cpp.__version__}, sys.stdout)
"""


@dataclass(frozen=True)
class Case:
    name: str
    write: Callable[[Path], Path]  # writes the GGUF under a directory, returns its path
    prompt: Callable[[], list[int]]
    tolerance: float  # of the largest logit: how far braid's may be from llama.cpp's


def _random_prompt(seed: int) -> Callable[[], list[int]]:
    return lambda: np.random.default_rng(seed).integers(0, VOCAB, PROMPT_LEN).tolist()


def _default_prompt() -> list[int]:
    import transformers

    from braid.runtime.loading.model_loader import resolve_model_dir

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_dir("default"))
    return tokenizer.encode("The capital of France is Paris. The capital of Italy is")


def _llama(type: str) -> Case:
    def write(directory: Path) -> Path:
        path = directory / f"llama-{type}.gguf"
        return random_gguf.write_random_gguf(path, "tiny", type, vocab=VOCAB)

    # Floats: llama.cpp and braid differ by summation order alone. Blocks: each rounds the
    # activations to 8 bits its own way before the integer dots (they came out within 1.6%
    # of the largest logit, 2026-12-03, on an EPYC 2-core AVX-512 machine).
    tolerance = 2e-3 if type in ("F32", "F16") else 3e-2
    return Case(f"llama-{type}", write, _random_prompt(11), tolerance)


# Families braid reads from llama.cpp's layouts, as tiny transformers models: (config class
# name, its fields, the file's type). Where llama.cpp reads no key for a setting, the model
# holds llama.cpp's fixed value (scripts/hf_gguf.py): Gemma 3's every sixth layer global, its
# local rope base 10000 and queries scaled by the head size, SmolLM3's every fourth layer
# NoPE; Phi-3's original context is its
# whole one, since llama.cpp picks longrope's factors by the context it is given and
# transformers by the prompt's length.
_TINY = dict(
    hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-6,
)  # fmt: skip
_FAMILIES: dict[str, tuple[str, dict, str]] = {
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2), "Q8_0"),
    "olmoe": (
        "OlmoeConfig",
        dict(num_key_value_heads=4, num_experts=8, num_experts_per_tok=2),
        "Q8_0",
    ),  # fmt: skip
    "smollm3": (
        "SmolLM3Config",
        dict(num_hidden_layers=4, no_rope_layer_interval=4, rope_theta=1e3),
        "Q8_0",
    ),  # fmt: skip
    "phi3": (
        "Phi3Config",
        dict(
            original_max_position_embeddings=512,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
            },
        ),
        "Q8_0",
    ),  # fmt: skip
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            head_dim=256,
            num_hidden_layers=6,
            sliding_window=8,
            query_pre_attn_scalar=256,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            architectures=["Gemma3ForCausalLM"],
        ),
        "Q8_0",
    ),  # fmt: skip
    "qwen3moe": (
        "Qwen3MoeConfig",
        dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            head_dim=16,
            norm_topk_prob=True,
        ),
        "Q8_0",
    ),  # fmt: skip
    "qwen2moe": (
        "Qwen2MoeConfig",
        dict(
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
        "Q8_0",
    ),  # fmt: skip
    "gpt-oss": (
        "GptOssConfig",
        dict(
            intermediate_size=32,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": True,
                "original_max_position_embeddings": 64,
            },
            architectures=["GptOssForCausalLM"],
        ),
        "MXFP4",
    ),  # fmt: skip
}


def _spread(family: str, name: str) -> tuple[float, float]:
    """The (mean, std) a tiny model's parameter is drawn with: norms near 1 and routers,
    sinks and biases wide, so each changes the logits; GPT-OSS's gate/up wide enough to pass
    its SwiGLU limit (other families' experts stay narrow: wide ones make the logits hang on
    which expert the 8-bit rounding of the activations tips a token to); the head scaled up
    so the top logits stand apart."""
    if "norm" in name:  # Gemma's scale by 1 + w
        return (0.0 if family == "gemma3" else 1.0), 0.3
    if name.endswith(("gate.weight", "router.weight", "sinks", "bias")):
        return 0.0, 0.5
    if family == "gpt-oss" and name.endswith("experts.gate_up_proj"):
        return 0.0, 0.8
    if family == "gpt-oss" and name.endswith("experts.down_proj"):
        return 0.0, 0.1
    if name == "lm_head.weight":
        return 0.0, 0.16
    return 0.0, 0.02


def write_family_model(directory: Path, family: str, seed: int = 0) -> Path:
    """The family's tiny transformers model (weights and config only: scripts/hf_gguf.py
    writes the tokenizer, VOCAB tokens of the default model's), its weights drawn by numpy
    from `seed` (not by transformers' initialisation, which may change between its
    versions)."""
    import torch
    import transformers

    config_name, fields, _ = _FAMILIES[family]
    ids = {key: value for key, value, *_ in random_gguf.tokenizer_fields(VOCAB)}
    bos, eos = ids["tokenizer.ggml.bos_token_id"], ids["tokenizer.ggml.eos_token_id"]
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB, eos_token_id=eos, bos_token_id=bos, pad_token_id=eos,
        **(_TINY | fields),
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied head is the embedding's
            mean, std = _spread(family, name)
            p.copy_(torch.from_numpy(rng.normal(mean, std, tuple(p.shape)).astype(np.float32)))
    model.save_pretrained(directory)
    return directory


def _family(family: str) -> Case:
    type = _FAMILIES[family][2]
    name = f"{family}-{type}"

    def write(directory: Path) -> Path:
        hf = directory / f"{family}-hf"
        if not (hf / "config.json").is_file():
            write_family_model(hf, family)
        return hf_gguf.write_hf_gguf(directory / f"{name}.gguf", hf, type)

    return Case(name, write, _random_prompt(13), 5e-2)


def _default_model() -> Case:
    return Case("default", lambda _: random_gguf._default_gguf(), _default_prompt, 5e-2)


CASES: dict[str, Case] = {
    case.name: case
    for case in [
        *(_llama(t) for t in random_gguf.TYPES),
        *(_family(f) for f in _FAMILIES),
        _default_model(),
    ]
}


def file_digest(path: Path) -> str:
    """A digest of the whole file: written again, it must be the same file."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def compared_ids(prompt_logits: np.ndarray, seed: int = 0) -> list[list[int]]:
    """Per position, the ids whose logits the reference keeps: llama.cpp's TOP highest and
    SAMPLED fixed random ones."""
    vocab = prompt_logits.shape[-1]
    sampled = np.random.default_rng(seed).choice(vocab, SAMPLED, replace=False)
    out = []
    for row in prompt_logits:
        top = np.argsort(row)[-TOP:][::-1]
        out.append(sorted(set(top.tolist()) | set(sampled.tolist())))
    return out


def reference(case: Case, directory: Path, llama_cpp_python: str) -> dict:
    path = case.write(directory)
    prompt = case.prompt()
    out = directory / f"{case.name}.npy"
    job = {"path": str(path), "prompt": prompt, "greedy": GREEDY, "out": str(out)}
    done = subprocess.run(
        [llama_cpp_python, "-c", _PEER], input=json.dumps(job), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"llama.cpp failed on {case.name}:\n{done.stderr[-3000:]}")
    answer = json.loads(done.stdout)
    logits = np.load(out)
    ids = compared_ids(logits)
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return {
        "llama_cpp_python": answer["version"],
        "file_digest": file_digest(path),
        "prompt": prompt,
        "tolerance": case.tolerance,
        "max_abs_logit": float(np.abs(logits).max()),
        "ids": ids,
        "logits": [
            [round(float(row[i]), 4) for i in row_ids]
            for row, row_ids in zip(logits, ids, strict=True)
        ],
        "argmax": logits.argmax(-1).tolist(),
        "margins": [round(float(m), 4) for m in top2[:, 1] - top2[:, 0]],
        "greedy": answer["greedy"],
        "greedy_margins": [round(m, 4) for m in answer["margins"]],
    }


def transformers_logits(path: Path, prompt: list[int], ids: list[list[int]]) -> list[list[float]]:
    """transformers' own GGUF reader's logits at the kept ids: the default model's second
    reference (its dequantization is independent of braid's; too slow to run every time)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].numpy()
    return [
        [round(float(row[i]), 5) for i in row_ids] for row, row_ids in zip(logits, ids, strict=True)
    ]


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    peer = subprocess.run(
        ["bash", str(ROOT / "scripts" / "peer_venv.sh"), "llama-cpp"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    DATA.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            ref = reference(CASES[name], Path(tmp), peer)
            if name == "default":
                path = random_gguf._default_gguf()
                ref["transformers"] = transformers_logits(path, ref["prompt"], ref["ids"])
        (DATA / f"{name}.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(f"{name}: greedy {ref['greedy']}, max |logit| {ref['max_abs_logit']:.2f}")


if __name__ == "__main__":
    main()
