"""Trace: a record of one program run (its states, their text by origin, every generated
token, each select's scores, each gen's timeline) and its rendering as one self-contained
HTML file.

Tracing is off unless a run asks (`program.run(..., trace=True)`) or BRAID_TRACE=1 is set;
then each state's executor records its gens, selects, forks and joins, and each gen asks
the engine for its per-token facts (logprobs with 5 alternatives, which tokens the grammar
forced, how many tokens its mask allowed, the request's stage times). `state.trace()` builds
the record from those; nothing here runs while a program runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from braid.interpreter.executor import StreamExecutor

# Where a character of a state's text came from.
ORIGINS = ("prompt", "cached", "generated", "forced", "selected")
TRACE_ENV = "BRAID_TRACE"


def tracing_default() -> bool:
    """Whether runs that do not say are traced: BRAID_TRACE=1 (the one place it is read)."""
    return os.environ.get(TRACE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Trace:
    """A traced run: `states[0]` is the root; each state holds its own text (a fork's from
    the fork on) as segments {"origin", "text", "token"?, "thinking"?} ("thinking": the token
    is in a reasoning gen's thought, before its answer), and its events in order: gens
    (counts, timeline), selects (choices, scores, method), forks (child ids), joins."""

    program: str
    states: list[dict]

    def to_dict(self) -> dict:
        return {"program": self.program, "states": self.states}

    def to_html(self, path: str | os.PathLike | None = None) -> str:
        """The trace as one HTML page (inline CSS and JS, nothing fetched); written to `path`
        when given."""
        data = json.dumps(self.to_dict(), ensure_ascii=False)
        data = data.replace("</", "<\\/")  # the JSON sits inside a <script> element
        template = resources.files("braid").joinpath("trace_view.html").read_text("utf-8")
        html = template.replace("/*TRACE_JSON*/null", data)
        if path is not None:
            Path(path).write_text(html, encoding="utf-8")
        return html


def build_trace(root: StreamExecutor, program: str) -> Trace:
    """The trace of a finished state and the forks under it."""
    executors = _walk(root)
    if root.events is None:
        raise ValueError(
            "this state was run without tracing: run it with trace=True, or set BRAID_TRACE=1"
        )
    ids = {id(e): i for i, e in enumerate(executors)}
    t0 = min((ev["submitted"] for e in executors for ev in e.events), default=0.0)
    states = [_state(e, ids, executors, t0) for e in executors]
    return Trace(program, states)


def _walk(e: StreamExecutor) -> list[StreamExecutor]:
    return [e] + [d for c in e.children for d in _walk(c)]


def _state(e: StreamExecutor, ids: dict[int, int], executors: list, t0: float) -> dict:
    parent = next((ids[id(p)] for p in executors if e in p.children), None)
    gens = [{**ev, "cached_chars": _cached_chars(e, ev)} for ev in e.events if ev["kind"] == "gen"]
    segments: list[dict] = []
    pos = e.fork_start
    for ev in e.events:
        if ev["kind"] not in ("gen", "select") or ev["end"] <= ev["start"]:
            continue
        segments += _prompt_segments(e.text, pos, ev["start"], gens)
        if ev["kind"] == "gen":
            segments += _token_segments(e, ev)
        else:
            segments.append({"origin": "selected", "text": e.text[ev["start"] : ev["end"]]})
        pos = ev["end"]
    segments += _prompt_segments(e.text, pos, len(e.text), gens)
    return {
        "id": ids[id(e)],
        "parent": parent,
        "error": repr(e.error) if e.error is not None else None,
        "segments": [s for s in segments if s["text"] or "token" in s],
        "events": [_event(ev, e, ids, t0) for ev in e.events],
    }


def _prompt_segments(text: str, a: int, b: int, gens: list[dict]) -> list[dict]:
    """text[a:b], which no gen or select wrote: each character is "cached" when the first gen
    whose prompt held it found it in the prefix cache, else "prompt"."""
    out = []
    for g in sorted(gens, key=lambda g: g["start"]):
        if a >= b:
            break
        if g["start"] < a:
            continue
        upto = min(b, g["start"])  # the text before g's start is in g's prompt
        cached = min(upto, max(a, g["cached_chars"]))
        out += [{"origin": "cached", "text": text[a:cached]}]
        out += [{"origin": "prompt", "text": text[cached:upto]}]
        a = upto
    out.append({"origin": "prompt", "text": text[a:b]})
    return [s for s in out if s["text"]]


def _cached_chars(e: StreamExecutor, gen: dict) -> int:
    """How many characters of the gen's prompt the prefix cache served (0 where the backend
    cannot say)."""
    cached = gen["meta"].get("cached_tokens", 0)
    if not cached:
        return 0
    return e.backend.prompt_chars(e.text[: gen["start"]], cached) or 0


def _token_segments(e: StreamExecutor, ev: dict) -> list[dict]:
    """A gen's text, a segment per output token (generated or forced) with its facts, those
    of a reasoning gen's thought marked "thinking"; text a backend gives no tokens for is one
    "generated" segment."""
    meta, backend = ev["meta"], e.backend
    text = e.text[ev["start"] : ev["end"]]
    ids = meta.get("token_ids") or []
    healed = meta.get("healed", "")
    pieces = backend.token_pieces(e.text[: ev["start"]], ids, healed) if ids else None
    if pieces is None:
        return [{"origin": "generated", "text": text}]
    trace = meta.get("trace") or {}
    forced = trace.get("forced") or [False] * len(ids)
    allowed = trace.get("allowed") or [None] * len(ids)
    logprobs = meta.get("logprobs") or [None] * len(ids)
    tops = meta.get("top_logprobs") or [{}] * len(ids)
    thought = meta.get("reasoning_tokens") or 0  # the first tokens: the thought, its markers too
    out, pos = [], 0
    for i, piece in enumerate(pieces):
        shown = text[pos : pos + len(piece)]
        if not piece.startswith(shown):  # the text departs from the tokens: stop walking
            break
        alternatives = list(tops[i].items())
        names = backend.token_texts([t for t, _ in alternatives]) if alternatives else []
        token = {
            "i": i,
            "id": ids[i],
            "gen": ev["name"],
            "logprob": None if forced[i] else logprobs[i],
            "top": [[n, lp] for n, (_, lp) in zip(names, alternatives, strict=True)],
            "allowed": allowed[i],
            "cut": len(shown) < len(piece),  # a stop string (or EOS) ended the text here
        }
        origin = "forced" if forced[i] else "generated"
        segment = {"origin": origin, "text": shown, "token": token}
        if i < thought:
            segment["thinking"] = True
        out.append(segment)
        pos += len(shown)
    if pos < len(text):
        out.append({"origin": "generated", "text": text[pos:]})
    return out


def _event(ev: dict, e: StreamExecutor, ids: dict[int, int], t0: float) -> dict:
    base = {"kind": ev["kind"], "name": ev["name"], "start": ev["start"], "end": ev["end"]}
    if ev["kind"] == "gen":
        return {**base, **_gen_facts(ev, t0)}
    if ev["kind"] == "select":
        meta, method = ev["meta"], ev["method"]
        scores = meta["scores"]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        return {
            **base,
            "method": getattr(method, "__name__", str(method)),
            "choices": meta["choices"],
            "scores": scores,
            "chosen": best,
            "ms": _ms(ev["returned"], ev["submitted"]),
        }
    if ev["kind"] == "fork":
        return {**base, "children": [ids[id(c)] for c in ev["children"]]}
    return {**base, "mode": ev["mode"], "children": [ids[id(c)] for c in ev["children"]]}


def _gen_facts(ev: dict, t0: float) -> dict[str, Any]:
    meta, params = ev["meta"], ev["params"]
    constraint = next(
        (k for k in ("regex", "json_schema", "choices", "grammar") if getattr(params, k)), None
    )
    trace = meta.get("trace") or {}
    forced = trace.get("forced") or []
    times = {
        "submitted": ev["submitted"],
        "arrival": trace.get("arrival"),
        "started": trace.get("started"),
        "first_token": trace.get("first_token"),
        "finished": trace.get("finished"),
        "returned": ev["returned"],
    }
    timeline = {k: None if v is None else round((v - t0) * 1000, 3) for k, v in times.items()}
    decode_s = _seconds(times["finished"], times["first_token"])
    completion = meta.get("completion_tokens", len(meta.get("token_ids") or []))
    prompt, cached = meta.get("prompt_tokens"), meta.get("cached_tokens", 0)
    return {
        "constraint": constraint,
        "finish_reason": meta.get("finish_reason"),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_tokens": None if prompt is None else prompt - cached,
        "completion_tokens": completion,
        "forced_tokens": sum(forced),
        "reasoning_tokens": meta.get("reasoning_tokens"),  # None: not a reasoning gen
        "timeline_ms": timeline,
        "tokens_per_s": (completion - 1) / decode_s if decode_s and completion > 1 else None,
    }


def _seconds(end: float | None, start: float | None) -> float | None:
    return None if end is None or start is None else end - start


def _ms(end: float, start: float) -> float:
    return round((end - start) * 1000, 3)
