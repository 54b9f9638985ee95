"""`braid bench lora` on the tiny model at tiny sizes: the JSON it writes has the figures the
docs quote, both rates positive. Speed itself is never asserted."""

from __future__ import annotations

import json

import pytest

from braid.runtime.cli.main import main


@pytest.mark.slow  # suite time: LoRA's numerics are tested against PEFT elsewhere
def test_bench_lora_writes_both_rates(tiny_model_path, tmp_path):
    out = tmp_path / "lora.json"
    args = ["bench", "lora", "--model", str(tiny_model_path), "--dtype", "float32"]
    args += ["--rank", "2", "--adapters", "3", "--requests", "6", "--tokens", "4"]
    args += ["--rounds", "2", "--json", str(out)]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["workload"] == "lora"
    assert (result["rank"], result["adapters"], result["requests"], result["new_tokens"]) == (
        2, 3, 6, 4,
    )  # fmt: skip
    assert len(result["base_tok_s_per_round"]) == len(result["lora_tok_s_per_round"]) == 2
    for key in ("base_tok_s", "lora_tok_s", "ratio", "ratio_median_of_rounds"):
        assert result[key] > 0, key
