"""`braid bench peers`' tally (runtime/bench/peers.py): batch-1 decode takes the median of
runs that alternate between the sides, and ratios compare those medians."""

from __future__ import annotations

from braid.runtime.bench import peers


def test_decode_runs_reduce_to_their_median_and_keep_every_rate():
    got = peers._median([{"tok_s": 90.0, "dtype": "x"}, {"tok_s": 70.0}, {"tok_s": 110.0}])
    assert got == {"tok_s": 90.0, "dtype": "x", "runs": [70.0, 90.0, 110.0]}
    assert peers._median([{"seconds": 2.0, "tokens": 9}]) == {"seconds": 2.0, "tokens": 9}


def test_a_failed_run_fails_its_side():
    assert peers._median([{"tok_s": 90.0}, {"error": "boom"}]) == {"error": "boom"}


def test_ratios_compare_braids_best_median_with_the_peers(capsys):
    rows = {
        "decode": {
            "braid": {"tok_s": 15.0},
            "braid (gguf blocks)": peers._median([{"tok_s": t} for t in (100.0, 120.0, 90.0)]),
            "llama.cpp": peers._median([{"tok_s": t} for t in (80.0, 60.0, 95.0)]),
        },
        "json": {"braid": {"seconds": 2.0, "tokens": 1}, "vLLM CPU": {"error": "no xgrammar"}},
    }
    peers._print(rows)
    lines = capsys.readouterr().out.splitlines()
    llama = next(line for line in lines if "llama.cpp" in line)
    assert "80.0" in llama and "1.25x" in llama and "median of 60.0..95.0" in llama
    vllm = next(line for line in lines if "vLLM CPU" in line)
    assert "failed" in vllm and "no xgrammar" in vllm
