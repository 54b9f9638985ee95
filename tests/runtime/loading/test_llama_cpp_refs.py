"""braid against the real llama.cpp on every run, without llama.cpp installed: the logits
and greedy tokens llama-cpp-python gave over seeded random GGUF files (every block type and
family braid reads) and the default model, kept in tests/data/llama_cpp/ by
scripts/llama_cpp_refs.py, which writes the same files these tests write again. Checked:
braid's GGUF blocks as the default path runs them (the CPU kernels), the reader's floats
(quantization="none", torch's ops), and the engine's greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import llama_cpp_refs
from family_models import prompt_logits

from braid.runtime import Engine, SamplingParams
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config, resolve_model_dir

DATA = Path(__file__).resolve().parents[2] / "data" / "llama_cpp"
CASES = sorted(p.stem for p in DATA.glob("*.json"))


def test_every_case_has_its_reference():
    assert CASES == sorted(llama_cpp_refs().CASES)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Per case, written once for the module's tests: (its reference, the GGUF file written
    again, its converted directory). The default model is the embedded one, converted where
    every test finds it."""
    out = tmp_path_factory.mktemp("llama-cpp-refs")
    refs, cases = llama_cpp_refs(), {}

    def get(name: str) -> tuple[dict, Path, Path]:
        if name not in cases:
            ref = json.loads((DATA / f"{name}.json").read_text())
            path = refs.CASES[name].write(out)
            assert refs.file_digest(path) == ref["file_digest"], (
                f"{path.name} is no longer written as when its reference was made: rerun "
                f"`.venv/bin/python scripts/llama_cpp_refs.py {name}`"
            )
            if name == "default":
                converted = resolve_model_dir("default")
            else:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("BRAID_MODEL_CACHE", str(out / "models"))
                    converted = resolve_model_dir(path)
            cases[name] = ref, path, converted
        return cases[name]

    return get


@pytest.fixture
def case(request, written):
    return written(request.param)


def assert_logits_match(got: torch.Tensor, ref: dict) -> None:
    """braid's logits over the prompt against llama.cpp's: at the kept ids within the
    case's tolerance of the largest, and the same argmax over the whole vocabulary wherever
    llama.cpp's top two are further apart than twice that."""
    bound = ref["tolerance"] * ref["max_abs_logit"]
    got = got.float().numpy()
    for pos, (ids, want) in enumerate(zip(ref["ids"], ref["logits"], strict=True)):
        diff = np.abs(got[pos, ids] - np.array(want)).max()
        assert diff < bound, f"position {pos}: off by {diff:.4f} (bound {bound:.4f})"
        if ref["margins"][pos] > 2 * bound:
            assert got[pos].argmax() == ref["argmax"][pos], f"position {pos}"


@pytest.mark.parametrize("case", CASES, indirect=True)
@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_logits_match_llama_cpp(case, quantization):
    ref, _, converted = case
    config = load_model_config(converted)
    model = load_model(
        converted, config, torch.float32, torch.device("cpu"), quantization=quantization
    )
    n = len(ref["prompt"])
    kv = KVPool(config.num_layers, n, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    assert_logits_match(prompt_logits(model, kv, ref["prompt"]), ref)


@pytest.mark.parametrize("case", CASES, indirect=True)
def test_greedy_tokens_match_llama_cpp(case):
    """The engine on its default path: llama.cpp's greedy tokens, up to the first step where
    llama.cpp's top two were too near for the paths' rounding to order them alike."""
    ref, _, converted = case
    engine = Engine(model=str(converted))
    try:
        params = SamplingParams(max_tokens=len(ref["greedy"]), temperature=0, ignore_eos=True)
        got = engine.generate(ref["prompt"], params).token_ids
    finally:
        engine.shutdown()
    bound = 2 * ref["tolerance"] * ref["max_abs_logit"]
    for step, (mine, theirs) in enumerate(zip(got, ref["greedy"], strict=False)):
        if ref["greedy_margins"][step] <= bound:
            break
        assert mine == theirs, f"step {step}: {got} against llama.cpp's {ref['greedy']}"
