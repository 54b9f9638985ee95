"""lm-evaluation-harness's local-completions model on a local multiple-choice task against
`braid serve`: argv = base URL, tokenizer directory, task directory (its YAML and data)."""

from __future__ import annotations

import json
import sys

import lm_eval
from lm_eval.tasks import TaskManager

url, tokenizer, tasks = sys.argv[1:4]
results = lm_eval.simple_evaluate(
    model="local-completions",
    model_args={
        "model": "tiny",
        "base_url": url + "/v1/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": tokenizer,
        "tokenized_requests": True,
        "num_concurrent": 1,
        "max_retries": 1,
    },
    tasks=["braid_tiny_quiz"],
    task_manager=TaskManager(include_path=tasks),
    log_samples=True,
)
samples = [
    {
        "doc_id": s["doc_id"],
        "target": s["target"],
        "arguments": [list(a) for a in s["arguments"]],
        "loglikelihoods": [r[0] for r in s["filtered_resps"]],
        "acc": s["acc"],
    }
    for s in results["samples"]["braid_tiny_quiz"]
]
task = results["results"]["braid_tiny_quiz"]
print(
    json.dumps({"version": lm_eval.__version__, "results": task, "samples": samples}, default=str)
)
