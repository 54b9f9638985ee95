"""`braid bench agents` on the tiny model at tiny sizes: every row's programs run to their end
through the interpreter (the bench wraps a LocalBackend, so a Backend protocol change that the
wrapper misses fails here), and the JSON has the figures the docs quote. Speed itself is never
asserted."""

from __future__ import annotations

import json

import pytest

from braid.runtime.cli.main import main


# A minute of agent programs; the bench's parts run in the scheduler and lease tests.
@pytest.mark.slow
def test_bench_agents_runs_every_row(long_tiny_model, tmp_path):
    out = tmp_path / "agents.json"
    model = long_tiny_model(8.0, tied=True)  # decisive greedy picks: programs that end
    args = ["bench", "agents", "--model", str(model), "--dtype", "float32"]
    args += ["--programs", "2", "--words", "5", "--latency", "0", "--json", str(out)]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["workload"] == "agents" and result["programs"] == 2
    rows = result["rows"]
    assert len(rows) == 5
    for name, row in rows.items():
        assert row["programs_s"] > 0, name
        assert row["prefill_computed"] > 0, name
        # Every gen of a program ran: 5 to 8 turns of two gens each, an action constrained.
        assert row["live_context"] > 0, name
        assert row["constraint_wait_max_ms"] >= row["constraint_wait_p50_ms"] >= 0, name
    assert result["infinite_cache_prefill"] > 0
