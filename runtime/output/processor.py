"""OutputProcessor: sampled tokens become stream chunks, on the engine thread.

For each request of a step: take the sampled token through the request's constraint (and
the text it forces next: jump-forward), append it, detokenize, match stop strings and
regexes, and say what to stream, with a last chunk (its finish_reason set) when a stop
condition holds. It writes a request's output and nothing of its lifecycle: the scheduler
finishes the requests whose last chunk this made, then the engine publishes the chunks. A
request that meets an error here fails alone.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from braid.runtime.executor.model_runner import StepResult
from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.scheduler.batch import Batch
from braid.runtime.scheduler.request import Request
from braid.runtime.stats import EngineStats

log = logging.getLogger(__name__)

# A chunk for a request's consumer; a chunk with a finish_reason is the request's last.
Update = tuple[Request, StreamChunk]


class OutputProcessor:
    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats  # token, request and latency counters are counted here
        # A summary of each request that ends, newest last, kept only while a dashboard
        # asks for them (it sets a bounded deque here; None: nothing is kept).
        self.recent: deque[dict] | None = None
        self._step_end = time.monotonic()  # when the last step's forward ended

    def admit(self, r: Request) -> list[Update]:
        """A new request: text its grammar forces at the start is appended now, to be fed
        with the prompt."""
        self.stats.add(prompt_tokens=len(r.prompt_ids))
        if (
            r.constraint is None
            or r.max_new_tokens == 0
            or r.params.prompt_logprobs_from is not None  # its logits come before output
        ):
            return []
        forced = r.constraint.start()
        if r.constraint.error is not None:
            return [self.end(r, "abort", error=r.constraint.error, request_error=True)]
        update = self._add_tokens(r, forced, [], time.monotonic())
        return [update] if update is not None else []

    def process(self, batch: Batch, results: list[StepResult]) -> list[Update]:
        """The chunks a step's results make (before the scheduler counts the fed tokens)."""
        now = time.monotonic()
        updates: list[Update] = []
        for i, (r, res) in enumerate(zip(batch.requests, results, strict=True)):
            if r.trace is not None and r.trace.started is None:
                # This step ran r first; it began where the step before it ended (or when r
                # arrived, if the engine was idle then).
                r.trace.started = max(r.arrival, self._step_end)
            try:
                r.prompt_logprobs.extend(res.prompt_logprobs)
                r.prompt_top_logprobs.extend(res.prompt_top_logprobs)
                if res.steps is not None:
                    self._add_in_turn(r, res.steps, now, updates)
                elif res.token is not None:
                    updates += self._add_sampled(r, res, now)
                elif batch.completes_feed(i):  # max_tokens=0: prompt logprobs, the top next
                    updates.append(self.end(r, "length", next_top_logprobs=res.top_logprobs))
            except Exception as e:  # a bug met by this request: it alone fails
                log.exception("request %d: processing its step failed", r.rid)
                if not any(u[0] is r and u[1].finish_reason for u in updates):
                    updates.append(self.end(r, "abort", error=f"engine step failed: {e!r}"))
        self._step_end = now
        return updates

    def _add_in_turn(self, r: Request, steps, now: float, updates: list[Update]) -> None:
        """Tokens drawn one after another, each once the ones before it are appended
        (speculative verification): until one ends the request or the steps end."""
        try:
            for res in steps:
                added = self._add_sampled(r, res, now)
                updates += added
                if added and added[-1][1].finish_reason is not None:
                    break
        finally:
            steps.close()

    def _add_sampled(self, r: Request, res: StepResult, now: float) -> list[Update]:
        if res.token < 0:  # the sampler found no allowed token
            return [self.end(r, "abort", error=_no_token_error(r), request_error=True)]
        tokens, logprobs = [res.token], [(res.logprob, res.top_logprobs)]
        constraint = r.constraint
        if constraint is not None:
            if constraint.error is None and res.token not in r.stop_ids:
                # The sampled token may merge with the forced text that follows it: the
                # tokens replacing it carry no sampled logprob (0.0, forced).
                tokens = constraint.accept(res.token)
            if constraint.error is not None:  # whatever was sampled, r's output stops here
                return [self.end(r, "abort", error=constraint.error, request_error=True)]
            if tokens[0] != res.token:
                logprobs = []
        update = self._add_tokens(r, tokens, logprobs, now)
        return [update] if update is not None else []

    def _add_tokens(
        self,
        r: Request,
        tokens: list[int],
        logprobs: list[tuple[float, dict[int, float]]],
        now: float,
    ) -> Update | None:
        """Append tokens to the output (the sampled one, then any a grammar forces): the chunk
        of their text, the last one when a stop condition holds."""
        if not tokens:
            return None
        room = r.max_new_tokens - len(r.output_ids)
        # Forced text cut by max_tokens: the matcher has taken all of it, so its being
        # complete says nothing about the output, which ends for its length.
        cut = len(tokens) > room
        tokens = tokens[:room]
        if r.first_token_time is None:
            r.first_token_time = now
            self.stats.observe("ttft_s", now - r.arrival)
        if len(tokens) > len(logprobs):
            self.stats.add(jump_forward_tokens=len(tokens) - len(logprobs))
        r.append_output(tokens)
        if r.trace is not None:
            r.trace.add_tokens(len(tokens), num_sampled=len(logprobs))
        if r.params.wants_logprobs:
            forced = [(0.0, {})] * (len(tokens) - len(logprobs))
            for lp, top in logprobs + forced:
                r.output_logprobs.append(lp)
                r.output_top_logprobs.append(top)
        last = tokens[-1]
        # A document steered to close in time ends for its length, however it ends.
        closed = "length" if r.constraint is not None and r.constraint.steered else "stop"
        if last in r.stop_ids:
            return self.end(r, closed, text=r.stop_matcher.flush(), tokens=tokens)
        text = r.stop_matcher.add(r.detokenizer.add(tokens))
        if r.stop_matcher.stopped:
            return self.end(r, "stop", text=text, tokens=tokens)
        if r.constraint is not None and r.constraint.is_terminated() and not cut:  # nothing follows
            return self.end(r, closed, text=text + r.stop_matcher.flush(), tokens=tokens)
        if len(r.output_ids) >= r.max_new_tokens:
            return self.end(r, "length", text=text + r.stop_matcher.flush(), tokens=tokens)
        return r, _chunk(r, text, tokens)

    def end(
        self,
        r: Request,
        reason: str,
        text: str = "",
        tokens: list[int] | None = None,
        error: str | None = None,
        request_error: bool = False,
        next_top_logprobs: dict[int, float] | None = None,
    ) -> Update:
        """r ends for `reason`: it is counted, and its last chunk carries its counts (and
        logprobs when it asked for them; `next_top_logprobs`: a max_tokens=0 request's top
        alternatives after its prompt); the scheduler finishes r when it sees the chunk."""
        now = time.monotonic()
        if reason == "abort":
            self.stats.add(requests_aborted=1)
        else:
            self.stats.add(requests_finished=1, cached_tokens=r.num_cached_prompt_tokens)
            self.stats.observe("e2e_s", now - r.arrival)
            if r.first_token_time is not None and len(r.output_ids) > 1:
                self.stats.observe("tpot_s", (now - r.first_token_time) / (len(r.output_ids) - 1))
        meta = {
            "prompt_tokens": len(r.prompt_ids),
            "cached_tokens": r.num_cached_prompt_tokens,
            "completion_tokens": len(r.output_ids),
            "preemptions": r.num_preemptions,
        }
        if r.constraint is not None and r.constraint.reasoning_tokens is not None:
            meta["reasoning_tokens"] = r.constraint.reasoning_tokens
        if r.detokenizer.healed:  # the prompt text the output's first tokens spell again
            meta["healed"] = r.detokenizer.healed
        if r.params.wants_logprobs:
            meta["logprobs"] = r.output_logprobs
            meta["top_logprobs"] = r.output_top_logprobs
        if next_top_logprobs:  # apart from top_logprobs, which has one entry per output token
            meta["next_top_logprobs"] = next_top_logprobs
        if r.params.prompt_logprobs_from is not None:
            meta["prompt_logprobs"] = r.prompt_logprobs
            if r.params.top_logprobs:
                meta["prompt_top_logprobs"] = r.prompt_top_logprobs
        if r.trace is not None:
            r.trace.finished = now
            meta["trace"] = r.trace.to_meta(r.arrival, r.first_token_time)
        if self.recent is not None:
            self.recent.append(_summary(r, reason, now, meta))
        last = dict(finish_reason=reason, error=error, request_error=request_error, meta=meta)
        return r, _chunk(r, text, tokens or [], **last)


def _chunk(r: Request, text: str, tokens: list[int], **fields) -> StreamChunk:
    """A chunk of r's output: `tokens` (the last of its output ids), their text, and their
    logprobs when r asked for them."""
    if r.params.wants_logprobs and tokens:
        n = len(tokens)
        fields.update(logprobs=r.output_logprobs[-n:], top_logprobs=r.output_top_logprobs[-n:])
    return StreamChunk(text, tokens, **fields)


def _summary(r: Request, reason: str, now: float, meta: dict) -> dict:
    """What a dashboard shows of a request that ended: its times and counts, and its output
    tokens with their trace when it asked for one."""
    summary = {
        "rid": r.rid,
        "finish_reason": reason,
        "arrival": r.arrival,
        "first_token": r.first_token_time,
        "finished": now,
        "prompt_tokens": meta["prompt_tokens"],
        "cached_tokens": meta["cached_tokens"],
        "completion_tokens": meta["completion_tokens"],
    }
    if r.trace is not None:
        summary.update(trace=meta["trace"], token_ids=list(r.output_ids))
        summary["logprobs"] = meta.get("logprobs")
    return summary


def _no_token_error(r: Request) -> str:
    at = len(r.output_ids)
    if r.constraint is not None and at < r.params.min_tokens:
        return (
            f"no token may follow output token {at}: the constraint allows only tokens that "
            f"min_tokens={r.params.min_tokens} holds back (EOS and stop_token_ids)"
        )
    return f"no token may follow output token {at}: every token is masked or has logit -inf"
