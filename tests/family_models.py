"""Helpers the model-family tests share: a tiny random HF model per variant, transformers'
logits for it, our forward over it, and llama.cpp's logits over a GGUF (when a
llama-cpp-python venv is at hand; it is never a dependency)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import made_peer_python

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config

OPS = pytest.mark.parametrize("cpu_kernels", [True, False], ids=["cpu-kernels", "torch"])

# Writes llama.cpp's logits of every position of a prompt to a .npy file.
_LLAMA_CPP_LOGITS = """
import sys, numpy as np, llama_cpp
path, ids, out = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
llm = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=2)
llm.eval(ids)
np.save(out, np.array(llm.scores[: len(ids)], dtype=np.float32))
"""


def tiny_model(
    directory: Path,
    tokenizer_path: Path,
    config_cls,
    fields: dict,
    randomize: Callable[[str, torch.nn.Parameter], None],
    chat_template: str | None = None,
) -> Path:
    """A tiny random model of `config_cls(**fields)` saved to `directory` with the tokenizer
    at `tokenizer_path` (and `chat_template`); `randomize(name, parameter)` redraws what the
    family's test needs random (norms, routers), and the head is scaled up so greedy picks
    are decisive."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    config = config_cls(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        **fields,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            randomize(name, p)
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(directory)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(directory)
    return directory


def reference(path, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager"
    ).eval()


def reference_logits(ref, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float()


def ours(path, cpu_kernels: bool, dtype=torch.float32, poison_unwritten: bool = False):
    """(config, model, a 512-slot KV pool) of our forward over the model at `path`; with
    `poison_unwritten`, every slot holds NaN until written, so no path may read one."""
    config = load_model_config(path)
    model = load_model(path, config, dtype, torch.device("cpu"), cpu_kernels)
    kv = KVPool(config.num_layers, 512, config.num_kv_heads, config.head_dim, dtype, "cpu")
    if poison_unwritten:
        for cache in kv.k + kv.v:
            cache[: kv.scratch_slot].fill_(float("nan"))
    return config, model, kv


def random_ids(config, n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (n,), generator=gen).tolist()


def prompt_logits(model, kv: KVPool, ids: list[int]) -> torch.Tensor:
    """Our logits of every position of `ids`, one prefill."""
    rows = [list(range(len(ids)))]
    return model(ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=rows), kv)


def assert_matches_llama_cpp(
    gguf: Path,
    ids: list[int],
    got: torch.Tensor,
    tmp: Path,
    tolerance: float = 1e-2,
    same_argmax: bool = True,
) -> None:
    """llama.cpp's logits over the same file and prompt agree with ours, `got` (within
    `tolerance` of the largest, and unless `same_argmax` is False, the same argmax everywhere:
    where a row's top two are nearer than the tolerance, they may swap); a skip without the
    llama-cpp-python venv."""
    out, python = tmp / "logits.npy", made_peer_python("llama-cpp")
    subprocess.run(
        [python, "-c", _LLAMA_CPP_LOGITS, str(gguf), ",".join(map(str, ids)), str(out)],
        check=True, timeout=240,
    )  # fmt: skip
    want = torch.from_numpy(np.load(out))
    assert (got - want).abs().max() < tolerance * want.abs().max()
    if same_argmax:
        assert (got.argmax(-1) == want.argmax(-1)).all()
