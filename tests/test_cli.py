"""The `braid` console script."""

from __future__ import annotations

import re
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


def test_generate_chat(long_tiny_model, capsys):
    from braid.runtime import Engine, SamplingParams
    from braid.runtime.cli.main import main

    # An untied head: the shared tiny model (tied) answers any text ending in "\n" with "\n"s,
    # so a chat rendered wrong (no system message, no generation prompt) would go unnoticed.
    model = long_tiny_model(8.0, tied=False)
    engine = Engine(model=str(model), device="cpu", dtype="float32", max_kv_tokens=2048)
    try:
        # The chat as the tokenizer's own template writes it, with its generation prompt.
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        chat = engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        expected = engine.generate(chat, SamplingParams(temperature=0, max_tokens=12))
    finally:
        engine.shutdown()
    # In this process (the console script is the same `main`; a process costs seconds).
    code = main(
        ["generate", "Hi", "--chat", "--system", "Be brief.", "--model", str(model),
         "--max-tokens", "12", "--device", "cpu", "--dtype", "float32", "--stats"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out == expected.text + "\n"
    assert f"{len(expected.token_ids)} tokens" in out.err and "tok/s" in out.err


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


def test_bench_help_lists_every_workload(capsys, monkeypatch):
    from braid.runtime.cli.bench import workload_names
    from braid.runtime.cli.main import main

    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps the help to the terminal's width
    with pytest.raises(SystemExit) as exit_:  # in this process: the console script's `main`
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    # Each workload with a help is a line four spaces in (a help's continuations are indented
    # further); one registered without a help would be missing.
    listed = re.findall(r"^ {4}(\S+)", out, re.MULTILINE)
    registered = workload_names()  # what `braid bench` parses, read off its parser
    assert registered and listed == registered


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message shown where there is no GPU")
def test_bench_kernels_without_a_gpu_says_so():
    out = braid("bench", "kernels")
    assert out.returncode == 1
    assert "needs a CUDA GPU" in out.stderr and "Traceback" not in out.stderr
