"""The `braid` console script."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def braid(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "braid.runtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_help_lists_commands():
    out = braid("--help")
    assert out.returncode == 0 and "generate" in out.stdout


def test_generate_streams_the_engines_greedy_text(tiny_model_path, tiny_engine):
    from braid.runtime import SamplingParams

    expected = tiny_engine.generate("Once upon", SamplingParams(temperature=0, max_tokens=12))
    out = braid(
        "generate",
        "Once upon",
        "--model",
        str(tiny_model_path),
        "--max-tokens",
        "12",
        "--device",
        "cpu",
        "--dtype",
        "float32",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected.text + "\n"


def test_generate_with_quantized_weights_is_the_engines_text(tiny_model_path):
    from braid.runtime import Engine, SamplingParams

    engine = Engine(model=str(tiny_model_path), device="cpu", quantization="int8")
    try:
        expected = engine.generate("Once upon", SamplingParams(temperature=0, max_tokens=8))
    finally:
        engine.shutdown()
    out = braid(
        "generate", "Once upon", "--model", str(tiny_model_path), "--max-tokens", "8",
        "--device", "cpu", "--quantization", "int8",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected.text + "\n"


def test_generate_chat(tiny_model_path):
    out = braid(
        "generate",
        "Hi",
        "--chat",
        "--model",
        str(tiny_model_path),
        "--max-tokens",
        "3",
        "--device",
        "cpu",
        "--stats",
    )
    assert out.returncode == 0, out.stderr
    assert "tok/s" in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/nonexistent/model"], "model directory /nonexistent/model does not exist"),
        (["--max-tokens", "-3"], "max_tokens must be >= 0"),
        (["--quantization", "int3"], "expected auto, none, int8, int4 or gguf, got 'int3'"),
    ],
)
def test_errors_are_one_line(tiny_model_path, args, message):
    if "--model" not in args:
        args = [*args, "--model", str(tiny_model_path)]
    out = braid("generate", "Hi", *args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


# `braid generate` with every forward failing: the engine fails the request (after trying it
# alone) and the command must say so.
_FAILING_FORWARD = """
import sys
from braid.runtime.cli.main import main
from braid.runtime.models.llama import LlamaForCausalLM

def fail(*args, **kwargs):
    raise RuntimeError("forward refused on purpose")

LlamaForCausalLM.forward = fail
sys.exit(main(sys.argv[1:]))
"""


def test_a_failed_generation_exits_nonzero_with_the_error(tiny_model_path):
    out = subprocess.run(
        [sys.executable, "-c", _FAILING_FORWARD, "generate", "Once upon", "--model",
         str(tiny_model_path), "--max-tokens", "4", "--device", "cpu", "--dtype", "float32"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stdout.strip() == ""  # no text to be taken for a completion
    assert "braid: error: generation failed" in out.stderr
    assert "forward refused on purpose" in out.stderr


def test_bench_help_lists_every_workload():
    out = braid("bench", "--help")
    assert out.returncode == 0, out.stderr
    workloads = "decode fewshot batch lora chat grammar kernels serve soak spec programs peers"
    workloads = workloads.split()
    assert [w for w in workloads if w not in out.stdout] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message shown where there is no GPU")
def test_bench_kernels_without_a_gpu_says_so():
    out = braid("bench", "kernels")
    assert out.returncode == 1
    assert "needs a CUDA GPU" in out.stderr and "Traceback" not in out.stderr
