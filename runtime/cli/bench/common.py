"""What the `braid bench` workloads share: the machine's name, isolated runs, timing, the
result file, the engines under comparison and the few-shot examples."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    import transformers

    from braid.runtime import Engine

T = TypeVar("T")

# A few-shot prompt as an eval harness builds it: the same examples, then one question.
FEWSHOT_EXAMPLES = "".join(
    f"Question: What is {a} plus {b}?\nAnswer: {a + b}\n\n"
    for a, b in [(12, 7), (30, 45), (8, 9), (100, 23), (61, 14), (5, 77), (19, 19), (44, 3)] * 5
)


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def isolated(fn: Callable[..., T], *args: Any) -> T:
    """Run fn(*args) in a fresh process and return its result.

    Each side of a comparison gets a process of its own: threads and OpenMP teams left by
    the other side (an engine thread, a transformers run) change the speed of the next.
    The process is not a daemon, so an engine in it may start its grammar worker.
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_run_isolated, args=(sender, fn, args))
    process.start()
    sender.close()
    try:
        ok, value = receiver.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"{fn.__name__} died (exit code {process.exitcode})") from None
    process.join()
    if not ok:
        raise RuntimeError(f"{fn.__name__} failed:\n{value}")
    return value


def _run_isolated(conn, fn, args) -> None:
    import traceback

    try:
        conn.send((True, fn(*args)))
    except BaseException:
        conn.send((False, traceback.format_exc()))


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection are not the speed
    return min(timed(fn) for _ in range(repeats))


def write_result(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def make_engine(model: str | None, dtype: str, **config: Any) -> Engine:
    from braid.runtime import Engine

    return Engine(model=model, dtype=dtype, **config)


def hf_model(model: str | None, dtype: torch.dtype) -> transformers.PreTrainedModel:
    import transformers

    from braid.runtime.loading.gguf import files as gguf_file
    from braid.runtime.loading.model_loader import resolve_model_dir

    path = resolve_model_dir(model)
    if gguf_file.source(path) is not None:  # a converted GGUF: transformers reads floats
        gguf_file.float_weights(path)
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process (this one by default), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class ServeProcess:
    """`braid serve` (the model, then `flags`) in a subprocess on a free loopback port; the
    context waits until it answers /health and stops it with SIGTERM (which drains it)."""

    def __init__(self, model: str | None, flags: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "braid.runtime.cli", "serve"]
        self.command += ["--port", str(self.port), *flags]
        if model:
            self.command += ["--model", model]

    def __enter__(self) -> ServeProcess:
        import httpx

        self.process = subprocess.Popen(self.command)
        deadline = time.monotonic() + 600
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"braid serve exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("braid serve did not come up in 10 minutes")
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.25)

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def add_workload(
    workloads: argparse._SubParsersAction,
    name: str,
    help: str,
    run: Callable[[argparse.Namespace], int],
    model: bool = True,
) -> argparse.ArgumentParser:
    """The `braid bench NAME` parser with what every workload takes: --json (its output) and,
    for one that runs a model, --model and --dtype."""
    parser = workloads.add_parser(name, help=help)
    if model:
        parser.add_argument("--model", help="HF model directory (default: the embedded model)")
        parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", type=Path, default=Path(f"bench-results/{name}.json"))
    parser.set_defaults(run=run)
    return parser
