"""A seeded slice of MaskBench (real-world schemas with labelled instances), when the shared
data is present: no invalid instance may get through the masks, and mask and matcher agree.
The full run is `braid bench grammar --maskbench DIR`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from braid import grammars
from braid.runtime.cli.bench.grammar_cases import load_case
from braid.runtime.cli.bench.grammar_maskbench import score_one

MASKBENCH = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "maskbench"
pytestmark = pytest.mark.skipif(not MASKBENCH.is_dir(), reason="../shared/data absent")


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "spec-objects"])
def test_slice_has_no_invalidation_errors(tokenizer, vocab, strict):
    compiler = grammars.GrammarCompiler(vocab, timeout_s=5.0)
    mask = grammars.allocate_bitmask(1, vocab.size)[0]
    paths = sorted(MASKBENCH.glob("*.json"))
    results = []
    try:
        for path in random.Random(7).sample(paths, 12):
            results.append(score_one(load_case(path), compiler, tokenizer, mask, strict))
    finally:
        compiler.close()
    for result in results:
        assert not result.get("invalidation_errors"), result
        for error in result.get("validation_errors", []):
            assert "accept_token refused" not in error.get("error", ""), result
        if result["status"] == "compile_error":
            assert result["error"]  # a message, never a crash
    assert sum(r["status"] == "pass" for r in results) >= 4
