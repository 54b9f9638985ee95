"""`braid bench spec`: speculative decoding against plain decoding, on the work it is for.

Four workloads of chat-templated prompts (spec_workloads.py), greedy:
- extraction: a JSON object of fields copied from a ~1,000-token business document (an
  invoice, an incident review, a contract, an insurance claim), constrained by its schema;
- code-edit: a 60-80 line Python file and a small edit to make; the reply is the whole file;
- agent-loop: a support agent resolving a ticket in five tool calls, one conversation: each
  step's prompt is the last one plus the model's call and the tool's (scripted) result, each
  call constrained by the tools' schema;
- free-text: stories and explanations, whose replies repeat little of their prompt.
The first three are where drafts from the context pay (the reply copies it); free text is
where drafting must cost little. Each runs at batch 1 (requests one after another: four, or
two agent conversations) and batch 16 (sixteen at once; sixteen conversations stepping
together).

Sides: braid with its defaults (`default`: no spec field), with spec_method="none" (the
baseline: speedups compare with it, and "same output" is its token ids), and any other of
METHODS by --methods; with --llama-cpp-python, llama.cpp on the same GGUF at batch 1 only
(llama-cpp-python serves one sequence), plain and with its prompt-lookup drafting,
constrained by the grammar it makes from the same schemas (its rows compare with its plain
side, the output by text). tok/s is output tokens over the time from the first request to
the last reply, prefill included: what a user waits for; decode tok/s is each reply's tokens
after its first over the time from its first token to its last (the phase speculation
speeds up, with the prefill left out; at batch 16, per request).

Every (workload, mode, side) run is a fresh process, the sides alternate their order per
round, and each keeps its best round: a shared machine's speed drifts over minutes
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from braid.runtime.cli.bench import spec_workloads as data
from braid.runtime.cli.bench.common import (
    add_workload,
    isolated,
    machine,
    make_engine,
    write_result,
)
from braid.runtime.cli.bench.peers import model_files, run_peer

if TYPE_CHECKING:
    from braid.runtime import Engine, SamplingParams
    from braid.runtime.protocol.outputs import StreamChunk


class Conversation(TypedDict):
    """What one conversation sends, as JSON (the llama.cpp side reads it too)."""

    messages: list[dict]  # the first request's chat messages
    tool_results: list[str]  # one after each reply but the last; none: a single request
    schema: dict | None  # every reply's JSON schema; None: free text


# method name -> engine fields
METHODS = {
    "default": {},
    "none": dict(spec_method="none"),
    "ngram": dict(spec_method="ngram"),
    "suffix": dict(spec_method="suffix"),
    "auto": dict(spec_method="auto"),
    "self-draft": dict(spec_method="draft", draft_model="self"),
}
BASELINE = "none"
LLAMA_CPP, LLAMA_CPP_LOOKUP = "llama.cpp", "llama.cpp lookup"
MODES = {"batch 1": 1, "batch 16": 16}


def _extraction() -> list[Conversation]:
    # One document of each kind first, so batch 1 (the first four) reads all four kinds.
    return [
        _conversation(
            data.EXTRACTION_SYSTEM,
            data.EXTRACTION_REQUEST.format(
                kind=kind, fields=", ".join(schema["properties"]), document=doc.format(**party)
            ),
            schema=schema,
        )
        for party in data.PARTIES
        for doc, schema, kind in data.DOCUMENTS
    ]


def _code_edit() -> list[Conversation]:
    # Each file's first edit, then each file's second, ...: batch 1 edits all four files.
    by_file = [[(code, edit) for edit in edits] for code, edits in data.CODE_EDITS]
    return [
        _conversation(data.CODE_SYSTEM, data.CODE_REQUEST.format(edit=edit, code=code))
        for column in zip(*by_file, strict=True)
        for code, edit in column
    ]


def _agent_loop() -> list[Conversation]:
    conversations = []
    keys = ("ticket", "customer", "email", "order", "item", "price", "problem")
    for i, ticket in enumerate(data.TICKETS):
        # `number`: the ticket's own ids in its tool results (customer, refund, card).
        facts = dict(zip(keys, ticket, strict=True), number=str(100 + 37 * i))
        conversations.append(
            _conversation(
                data.AGENT_SYSTEM,
                data.TICKET_MESSAGE.format(**facts),
                tool_results=[result.format(**facts) for result in data.TOOL_RESULTS],
                schema=data.TOOL_CALL_SCHEMA,
            )
        )
    return conversations


def _free_text() -> list[Conversation]:
    return [_conversation(None, prompt) for prompt in data.FREE_TEXT]


def _conversation(
    system: str | None, user: str, tool_results: Sequence[str] = (), schema: dict | None = None
) -> Conversation:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    return Conversation(messages=messages, tool_results=list(tool_results), schema=schema)


@dataclass(frozen=True)
class Workload:
    build: Callable[[], list[Conversation]]  # its sixteen conversations
    tokens: int  # max new tokens a reply, unless --tokens
    single: int  # conversations run at batch 1, the first of them


WORKLOADS = {
    "extraction": Workload(_extraction, 256, 4),
    "code-edit": Workload(_code_edit, 256, 4),
    "agent-loop": Workload(_agent_loop, 64, 2),
    "free-text": Workload(_free_text, 128, 4),
}


def _conversations(workload: str, batch: int) -> list[Conversation]:
    spec = WORKLOADS[workload]
    return spec.build()[: spec.single if batch == 1 else batch]


def add_parser(workloads: argparse._SubParsersAction) -> None:
    p = add_workload(
        workloads,
        "spec",
        "speculative decoding vs plain decoding: extraction, code edits, an agent loop, free text",
        bench_spec,
    )
    p.add_argument("--gguf", type=Path, help="a GGUF file for braid and llama.cpp (not --model)")
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="which of them, comma-separated"
    )
    p.add_argument(
        "--methods",
        default="default,none",
        help=f"braid's sides, comma-separated, with {BASELINE} (from {', '.join(METHODS)})",
    )
    p.add_argument(
        "--tokens",
        type=int,
        help="max new tokens a reply (default: "
        + ", ".join(f"{name} {w.tokens}" for name, w in WORKLOADS.items())
        + ")",
    )
    p.add_argument("--modes", default=",".join(MODES), help="which of them, comma-separated")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per side")
    p.add_argument(
        "--llama-cpp-python",
        type=Path,
        help="a Python with llama-cpp-python, for the llama.cpp sides (`bash "
        "scripts/peer_venv.sh llama-cpp --check` prints it); without it, none",
    )
    p.add_argument(
        "--lookup-tokens",
        type=int,
        default=2,
        help="llama.cpp's prompt-lookup draft length, num_pred_tokens (llama-cpp-python's "
        "README: 2 for CPU-only machines, 10 for GPUs)",
    )


def _render(engine: Engine, messages: list[dict]) -> str:
    return engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def _params(conversation: Conversation, tokens: int) -> SamplingParams:
    from braid.runtime import SamplingParams

    return SamplingParams(temperature=0, max_tokens=tokens, json_schema=conversation["schema"])


@dataclass
class _Reply:
    """One request's output as its chunks arrive, with when its first and last tokens came
    (the decode phase lies between them)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    first: float | None = None
    last: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def add(self, chunk: StreamChunk) -> None:
        now = time.perf_counter()
        if chunk.token_ids:
            if self.first is None:
                self.first = now
            self.last = now
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        if chunk.finish_reason is not None:
            if chunk.error:
                self.meta["error"] = chunk.error
            self.meta.update(chunk.meta or {})
            self.done.set()


def _generate(
    engine: Engine, conversations: list[Conversation], prompts: list[str], tokens: int
) -> list[_Reply]:
    """Submit every prompt at once and wait for all their replies."""
    replies = [_Reply() for _ in prompts]
    for c, prompt, reply in zip(conversations, prompts, replies, strict=True):
        engine.submit(prompt, _params(c, tokens), reply.add)
    for reply in replies:
        reply.done.wait()
        if "error" in reply.meta:
            raise RuntimeError(f"bench spec: a request failed: {reply.meta['error']}")
    return replies


def _converse(engine: Engine, group: list[Conversation], tokens: int) -> list[_Reply]:
    """Step the group's conversations together, each step one request per conversation, all
    at once; every reply, by conversation then step."""
    histories = [list(c["messages"]) for c in group]
    replies: list[list[_Reply]] = [[] for _ in group]
    for step in range(len(group[0]["tool_results"]) + 1):
        outs = _generate(engine, group, [_render(engine, h) for h in histories], tokens)
        for c, history, own, out in zip(group, histories, replies, outs, strict=True):
            own.append(out)
            if step < len(c["tool_results"]):
                history.append({"role": "assistant", "content": out.text})
                history.append({"role": "tool", "content": c["tool_results"][step]})
    return [out for own in replies for out in own]


def _braid(
    model: str | None, dtype: str, method: str, workload: str, batch: int, tokens: int
) -> dict:
    """One braid side in this (fresh) process: the conversations in groups of `batch`; the
    time from the first request to the last reply, the outputs and the spec counters."""
    engine = make_engine(model, dtype, max_kv_tokens=32768, **METHODS[method])
    conversations = _conversations(workload, batch)
    # Warm-up on the first request of each schema (kernels built, grammars compiled), then
    # the cache flushed so the timed run computes every prompt.
    firsts = list({json.dumps(c["schema"]): c for c in reversed(conversations)}.values())
    _generate(engine, firsts, [_render(engine, c["messages"]) for c in firsts], 8)
    engine.flush_cache()
    before = engine.stats()
    start = time.perf_counter()
    outs = [
        out
        for i in range(0, len(conversations), batch)
        for out in _converse(engine, conversations[i : i + batch], tokens)
    ]
    seconds = time.perf_counter() - start
    after = engine.stats()
    engine.shutdown()
    counters = ("spec_steps", "spec_proposed_tokens", "spec_accepted_tokens")
    return {
        "seconds": seconds,
        "output_tokens": sum(len(o.token_ids) for o in outs),
        # The decode phase: each reply's tokens after its first, over the time they took.
        "decode_tokens": sum(len(o.token_ids) - 1 for o in outs),
        "decode_seconds": sum(o.last - o.first for o in outs if o.first is not None),
        "prompt_tokens": sum(o.meta["prompt_tokens"] for o in outs),
        "outputs": [o.token_ids for o in outs],
        "sample": outs[0].text[:120],
        "dtype": str(engine.dtype).removeprefix("torch."),
        **{k: after[k] - before[k] for k in counters},
    }


def _llama_cpp(python: Path, gguf: Path, lookup: int, workload: str, tokens: int) -> dict:
    """One llama.cpp side (peer_llama_cpp_spec.py, in its own Python): the batch-1
    conversations, plain (lookup 0) or with prompt-lookup drafts of `lookup` tokens."""
    job = {"gguf": str(gguf), "lookup": lookup, "max_tokens": tokens}
    job["conversations"] = _conversations(workload, 1)
    result = run_peer(python, "peer_llama_cpp_spec.py", [], stdin=json.dumps(job))
    if "error" in result:
        raise RuntimeError(f"llama.cpp ({workload}): {result['error']}")
    texts = result.pop("texts")
    return {**result, "outputs": texts, "sample": texts[0][:120]}


def _tokens(args: argparse.Namespace, workload: str) -> int:
    return args.tokens or WORKLOADS[workload].tokens


def _sides(
    args: argparse.Namespace, model: str | None, gguf: Path | None, workload: str, batch: int
) -> dict[str, Callable[[], dict]]:
    """Every side of one (workload, mode), by name: braid's methods, each in a fresh
    process, and llama.cpp's at batch 1 (its script is a process of its own)."""
    tokens = _tokens(args, workload)
    sides = {
        method: partial(isolated, _braid, model, args.dtype, method, workload, batch, tokens)
        for method in args.methods.split(",")
    }
    if gguf is not None and batch == 1:
        python = args.llama_cpp_python
        sides[LLAMA_CPP] = partial(_llama_cpp, python, gguf, 0, workload, tokens)
        lookup = args.lookup_tokens
        sides[LLAMA_CPP_LOOKUP] = partial(_llama_cpp, python, gguf, lookup, workload, tokens)
    return sides


def _check(args: argparse.Namespace) -> None:
    methods, workloads = args.methods.split(","), args.workloads.split(",")
    if any(m not in METHODS for m in methods) or BASELINE not in methods:
        raise ValueError(f"--methods: {BASELINE} and any of {', '.join(METHODS)}; got {methods}")
    if any(w not in WORKLOADS for w in workloads):
        raise ValueError(f"--workloads: any of {', '.join(WORKLOADS)}; got {workloads}")
    if any(m not in MODES for m in args.modes.split(",")):
        raise ValueError(f"--modes: any of {', '.join(MODES)}; got {args.modes}")


def bench_spec(args: argparse.Namespace) -> int:
    _check(args)
    model = str(args.gguf) if args.gguf else args.model
    gguf = None
    if args.llama_cpp_python:
        gguf = model_files(model)[1]
        if gguf is None:
            raise ValueError("--llama-cpp-python: llama.cpp reads a GGUF file; give --gguf")
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for workload in args.workloads.split(","):
            for mode in args.modes.split(","):
                batch = MODES[mode]
                sides = _sides(args, model, gguf, workload, batch)
                # Alternate which side goes first, so a drift in speed within a round does
                # not always land on the same side.
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for side in order:
                    load = os.getloadavg()[0]  # other work on this machine, for the record
                    out = sides[side]()
                    out["load_before"] = round(load, 2)
                    out["max_tokens"] = _tokens(args, workload)
                    runs.setdefault((workload, mode, side), []).append(out)
                    print(
                        f"round {round_ + 1}: {workload}, {mode}, {side}: {_rate(out):.1f} "
                        f"tok/s (load average before: {load:.2f})"
                    )
    dtype = next(r[0]["dtype"] for r in runs.values() if "dtype" in r[0])
    print(
        f"\nspeculative decoding, greedy, {model or 'default model'}, {dtype}, {machine()}, "
        f"best of {args.rounds} rounds, each run a fresh process; speedup and same output: "
        f"against {BASELINE} ({LLAMA_CPP}'s rows: against {LLAMA_CPP})"
    )
    rows = _rows(runs)
    result = {"workload": "spec", "machine": machine(), "model": model}
    result["gguf"] = str(gguf) if gguf else None
    result.update(dtype=dtype, rounds=args.rounds, rows=rows)
    write_result(result, args.json)
    return 0


def _rate(out: dict) -> float:
    return out["output_tokens"] / out["seconds"]


def _decode_rate(out: dict) -> float | None:
    """Tokens after each reply's first over the time they took (braid's sides)."""
    seconds = out.get("decode_seconds")
    return out["decode_tokens"] / seconds if seconds else None


def _rows(runs: dict[tuple[str, str, str], list[dict]]) -> list[dict]:
    """Each side's best round against its engine's plain side's best, printed as a table."""
    print(
        f"{'workload':<12}{'mode':<10}{'side':<18}{'tok/s':>8}{'speedup':>9}"
        f"{'decode tok/s':>14}{'speedup':>9}{'accepted/proposed':>19}{'same output':>13}"
    )
    rows = []
    for (workload, mode, side), outs in runs.items():
        baseline = LLAMA_CPP if side.startswith(LLAMA_CPP) else BASELINE
        best = max(outs, key=_rate)
        reference = max(runs[(workload, mode, baseline)], key=_rate)
        proposed, accepted = best.get("spec_proposed_tokens"), best.get("spec_accepted_tokens")
        same = None if side == baseline else best["outputs"] == reference["outputs"]
        decode, decode_reference = _decode_rate(best), _decode_rate(reference)
        decode_speedup = decode / decode_reference if decode and decode_reference else None
        row = {
            "workload": workload,
            "mode": mode,
            "side": side,
            "max_tokens": best["max_tokens"],
            "tok_s": round(_rate(best), 1),
            "tok_s_per_round": [round(_rate(o), 1) for o in outs],
            "speedup": round(_rate(best) / _rate(reference), 3),
            "decode_tok_s": None if decode is None else round(decode, 1),
            "decode_speedup": None if decode_speedup is None else round(decode_speedup, 3),
            "output_tokens": best["output_tokens"],
            "prompt_tokens": best["prompt_tokens"],
            "spec_steps": best.get("spec_steps"),
            "spec_proposed_tokens": proposed,
            "spec_accepted_tokens": accepted,
            "same_output_as_baseline": same,
            "load_average_before_each_round": [o["load_before"] for o in outs],
            "sample": best["sample"],
        }
        rows.append(row)
        acceptance = f"{accepted}/{proposed}" if proposed else "-"
        same_text = "-" if same is None else "yes" if same else "NO"
        decode_text = "-" if decode is None else f"{decode:.1f}"
        decode_x = "-" if decode_speedup is None else f"{decode_speedup:.2f}x"
        print(
            f"{workload:<12}{mode:<10}{side:<18}{row['tok_s']:>8.1f}{row['speedup']:>8.2f}x"
            f"{decode_text:>14}{decode_x:>9}{acceptance:>19}{same_text:>13}"
        )
    return rows
