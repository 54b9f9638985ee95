"""A peer engine on `braid bench grammar`'s MaskBench and test-suite schemas: llguidance,
run in a Python of its own (--peer-python, never braid's venv), on the same instances and
tokenizer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from braid.runtime.cli.bench.grammar_cases import SchemaCase, load_vocabulary, serialize

# Run by --peer-python: reads {"tokenizer", "eos", "cases": [{"name", "schema", "tests":
# [[valid, token ids]]}]} from the file named by argv[1], writes per-schema results in
# score_one's shape (plus the engine's name, last) to argv[2]. One thread; time to first
# mask is making the grammar and the matcher and filling the first mask, as for braid.
_LLGUIDANCE_SCORER = r"""
import json, sys, time
import llguidance, llguidance.hf, llguidance.numpy
from transformers import AutoTokenizer

job = json.load(open(sys.argv[1]))
hf = AutoTokenizer.from_pretrained(job["tokenizer"])
tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=job["eos"])
mask = llguidance.numpy.allocate_token_bitmask(1, len(hf))
out = []

def allowed(token):
    return (int(mask[0, token // 32]) >> (token % 32)) & 1 == 1

for case in job["cases"]:
    row = {"name": case["name"]}
    start = time.perf_counter()
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(case["schema"])
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if not matcher.is_error():
            llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
    except Exception as e:
        out.append({**row, "status": "compile_error", "error": str(e)[:300]})
        continue
    if matcher.is_error():
        out.append({**row, "status": "compile_error", "error": matcher.get_error()[:300]})
        continue
    row.update(ttfm_s=time.perf_counter() - start, fill_s=[], validation_errors=[],
               invalidation_errors=[])
    for index, (valid, ids) in enumerate(case["tests"]):
        matcher.reset()
        refused = None
        for i, token in enumerate(ids + [job["eos"]]):
            tick = time.perf_counter()
            llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
            row["fill_s"].append(time.perf_counter() - tick)
            if not allowed(token):
                refused = i
                break
            if i < len(ids):
                matcher.consume_token(token)
        if valid and refused is not None:
            row["validation_errors"].append({"index": index, "refused_at": refused})
        elif not valid and refused is None:
            row["invalidation_errors"].append({"index": index})
    bad = row["validation_errors"] or row["invalidation_errors"]
    out.append({**row, "status": "fail" if bad else "pass"})
out.append("llguidance " + llguidance.__version__)
json.dump(out, open(sys.argv[2], "w"))
"""


def score_peer(cases: list[SchemaCase], args: argparse.Namespace, out_path: Path) -> list[dict]:
    """llguidance's results on the same schemas, instances and tokenizer (serialized and
    tokenized here, as for braid), from a subprocess in --peer-python; its engine's name
    last."""
    import subprocess
    import tempfile

    from braid.runtime.loading.model_loader import resolve_model_dir

    tokenizer, _ = load_vocabulary(args.model)
    jobs = []
    for case in cases:
        tests = [
            [valid, tokenizer.encode(serialize(data, case.schema), add_special_tokens=False)]
            for valid, data in case.tests
        ]
        jobs.append({"name": case.name, "schema": case.schema, "tests": tests})
    job = {
        "tokenizer": str(resolve_model_dir(args.model)),
        "eos": tokenizer.eos_token_id,
        "cases": jobs,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as job_file:
        json.dump(job, job_file)
        job_file.flush()
        subprocess.run(
            [args.peer_python, "-c", _LLGUIDANCE_SCORER, job_file.name, str(out_path)],
            check=True,
            timeout=3600,
        )
    return json.loads(out_path.read_text())
