"""`braid bench soak --minutes 2` against the tiny model: two minutes of the whole mix after a
short warm-up, and the soak's own verdict (nothing lost, back to idle with every KV slot
free, memory within 10% of the start) plus what makes the run meaningful: every outcome
occurred, grammars were evicted, and grammar memory stayed within the server's budget."""

from __future__ import annotations

import json

from braid.runtime.cli import main

MINUTES = 2
BUDGET_MB = 10  # the vocabulary's structures take ~9 MB of it: grammars are soon evicted


def test_a_two_minute_soak_loses_nothing_and_holds_memory(tiny_model_path, tmp_path):
    out = tmp_path / "soak.json"
    args = ["bench", "soak", "--minutes", str(MINUTES), "--warmup-minutes", "0.4"]
    args += ["--model", str(tiny_model_path), "--dtype", "float32", "--clients", "4"]
    args += ["--burst-every", "10", "--grammar-memory-mb", str(BUDGET_MB), "--json", str(out)]
    code = main(args)
    result = json.loads(out.read_text())
    assert code == 0, result
    assert result["ok"] and result["lost"] == [] and result["idle"] and result["kv_ok"]
    assert result["memory_growth"] <= 0.10
    assert len(result["minutes_rows"]) == MINUTES
    outcomes = result["outcomes"]
    assert all(outcomes[o] > 0 for o in ("complete", "left", "aborted", "refused", "rejected"))
    assert result["end"]["grammar_evictions"] > result["start"]["grammar_evictions"]
    samples = [result["start"], result["end"], *result["minutes_rows"]]
    assert all(0 < s["grammar_mb"] <= BUDGET_MB for s in samples), samples
    assert result["end"]["kv_free_tokens"] == result["end"]["kv_total_tokens"]
