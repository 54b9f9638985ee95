"""`braid bench peers`' tally (runtime/cli/bench/peers.py): batch-1 decode takes the median of
runs that alternate between the sides, and ratios compare those medians."""

from __future__ import annotations

from braid.runtime.cli.bench import peers


def test_decode_runs_reduce_to_their_median_and_keep_every_rate():
    got = peers._median([{"tok_s": 90.0, "dtype": "x"}, {"tok_s": 70.0}, {"tok_s": 110.0}])
    assert got == {"tok_s": 90.0, "dtype": "x", "runs": [70.0, 90.0, 110.0]}
    assert peers._median([{"seconds": 2.0, "tokens": 9}]) == {"seconds": 2.0, "tokens": 9}


def test_a_failed_run_fails_its_side():
    assert peers._median([{"tok_s": 90.0}, {"error": "boom"}]) == {"error": "boom"}


def test_ratios_compare_braid_without_flags_with_the_peers(capsys):
    rows = {
        "start": {
            "braid": {"first_token_s": 2.0, "rss_mb": 400.0},
            "llama.cpp": {"first_token_s": 1.0, "rss_mb": 300.0},
        },
        "decode": {
            "braid": peers._median([{"tok_s": t} for t in (100.0, 120.0, 90.0)]),
            "braid (float)": {"tok_s": 15.0},
            "llama.cpp": peers._median([{"tok_s": t} for t in (80.0, 60.0, 95.0)]),
        },
        "prefill": {
            "braid": {"seconds": 2.0, "tokens": 1, "prompt_tokens": 500},
            "llama.cpp": {"seconds": 5.0, "tokens": 1, "prompt_tokens": 500},
        },
        "json": {"braid": {"seconds": 2.0, "tokens": 1}, "vLLM CPU": {"error": "no xgrammar"}},
    }
    peers._print(rows)
    lines = capsys.readouterr().out.splitlines()
    start, decode, prefill = (
        next(line for line in lines if line.startswith(w) and "llama.cpp" in line)
        for w in ("start", "decode", "prefill")
    )
    assert "0.50x" in start and "resident 300 MB" in start  # braid takes twice the time
    assert "80.0" in decode and "1.25x" in decode and "median of 60.0..95.0" in decode
    assert "100.00" in prefill and "2.50x" in prefill  # prompt tokens/s
    vllm = next(line for line in lines if "vLLM CPU" in line)
    assert "failed" in vllm and "no xgrammar" in vllm
