"""The `braid` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from braid.runtime import Engine
from braid.runtime.cli import bench
from braid.runtime.cli import trace as trace_command
from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="braid", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = commands.add_parser("generate", help="stream a completion of PROMPT to the terminal")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="wrap PROMPT as a user chat message")
    gen.add_argument("--system", help="system message (with --chat)")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--model", help="HF model directory (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    gen.add_argument(
        "--quantization",
        default="auto",
        help="CPU weights: auto (a GGUF's own blocks, else as stored), none, int8, int4, gguf",
    )
    gen.add_argument("--stats", action="store_true", help="print load time and tokens/s")
    gen.set_defaults(run=_generate)
    serve.add_parser(commands)
    bench.add_parser(commands)
    trace_command.add_parser(commands)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"braid: error: {e}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    engine = Engine(
        model=args.model, device=args.device, dtype=args.dtype, quantization=args.quantization
    )
    load_s = time.perf_counter() - t0
    try:
        return _generate_with(engine, args, load_s)
    finally:
        engine.shutdown()  # the engine thread ends before the interpreter does


def _generate_with(engine: Engine, args: argparse.Namespace, load_s: float) -> int:
    from braid.runtime import SamplingParams
    from braid.runtime.text import template_render

    print(f"[braid: {engine.describe()}]", file=sys.stderr, flush=True)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
    )
    prompt: str | list[int] = args.prompt
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        if args.system:
            messages.insert(0, {"role": "system", "content": args.system})
        # The prompt is the operator's own text: the special tokens it spells are theirs.
        text = template_render.render(engine.tokenizer, messages, add_generation_prompt=True)
        prompt = template_render.tokenize(engine.tokenizer, text)
    num_tokens, t1 = 0, 0.0

    async def run() -> StreamChunk:
        nonlocal num_tokens, t1
        async for chunk in engine.stream(prompt, params):
            if num_tokens == 0:
                t1 = time.perf_counter()  # decode rate is timed from the first token
            num_tokens += len(chunk.token_ids)
            print(chunk.text, end="", flush=True)
        return chunk

    last = asyncio.run(run())
    print(flush=True)
    if last.error:
        # A script reading stdout must not take what was printed for a whole completion.
        print(f"braid: error: generation failed: {last.error}", file=sys.stderr)
        return 2 if last.request_error else 1
    if args.stats:
        decode_s = time.perf_counter() - t1
        rate = (num_tokens - 1) / decode_s if num_tokens > 1 and decode_s > 0 else 0.0
        print(
            f"[load {load_s:.2f} s, {num_tokens} tokens, decode {rate:.1f} tok/s]",
            file=sys.stderr,
        )
    return 0
