"""OutputProcessor: a step's results become request outputs, on the engine thread.

For each request of a step: count what was computed, take the sampled token through the
request's grammar (and the text it forces next: jump-forward), append it, detokenize,
match stop strings and regexes, stream the new text, and finish the request when a stop
condition holds, releasing its KV. A request that meets an error here fails alone.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from braid.grammars.matcher import MatcherError
from braid.runtime.constrained import GrammarService
from braid.runtime.model_runner import StepResult
from braid.runtime.outputs import StreamChunk
from braid.runtime.request import Request
from braid.runtime.scheduler import Batch, Scheduler
from braid.runtime.stats import EngineStats

if TYPE_CHECKING:
    from braid.runtime.model_runner import ModelRunner
    from braid.runtime.spec import Speculator

log = logging.getLogger(__name__)


class OutputProcessor:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        grammars: GrammarService,
        stats: EngineStats,
        speculator: Speculator | None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.grammars = grammars
        self.stats = stats
        self.speculator = speculator
        self.live: dict[int, Request] = {}  # every request admitted and not yet finished

    def admit(self, r: Request) -> None:
        """A new request joins the scheduler's queue."""
        self.live[r.rid] = r
        self.scheduler.add(r)
        self.stats.add(prompt_tokens=len(r.prompt_ids))
        if (
            r.matcher is not None
            and r.max_new_tokens > 0
            and r.params.prompt_logprobs_from is None  # its logits come before output
        ):
            # Text the grammar forces at the start is fed with the prompt.
            try:
                forced = self.grammars.forced_tokens(r, None)
            except MatcherError as e:
                self.finish(r, "abort", error=str(e), request_error=True)
                return
            self.add_tokens(r, forced, [], time.monotonic())

    def process(self, batch: Batch, results: list[StepResult]) -> None:
        now = time.monotonic()
        num_decodes = sum(1 for r in batch.requests if r.is_decoding)
        num_known = [batch.num_known(i) for i in range(len(batch.requests))]
        self.stats.add(
            forward_steps=1,
            prefill_tokens_computed=sum(num_known) - num_decodes,
            decode_tokens=num_decodes,
        )
        for i, (r, n, res) in enumerate(zip(batch.requests, num_known, results, strict=True)):
            try:
                prefilled = not r.is_decoding
                r.num_computed += n
                r.prompt_logprobs.extend(res.prompt_logprobs)
                r.prompt_top_logprobs.extend(res.prompt_top_logprobs)
                if res.draft_logits is not None:
                    self.speculator.verify(
                        r, batch.drafts[i], res.draft_logits, self.runner.sample_node,
                        lambda r, res: self.add_sampled(r, res, now),
                    )  # fmt: skip
                elif res.token is not None:
                    self.add_sampled(r, res, now)
                elif r.num_uncomputed == 0:  # prompt logprobs only (max_tokens=0)
                    self.finish(r, "length")
                if prefilled and r.finish_reason is None:
                    # Others may be waiting for this prefix: cache it now, not at the finish.
                    self.scheduler.cache_prefill_progress(r)
            except Exception as e:  # a bug met by this request: it alone fails
                log.exception("request %d: processing its step failed", r.rid)
                self.fail(r, f"engine step failed: {e!r}")

    def add_sampled(self, r: Request, res: StepResult, now: float) -> None:
        if res.token < 0:  # the sampler found no allowed token
            self.finish(r, "abort", error=_no_token_error(r), request_error=True)
            return
        tokens, logprobs = [res.token], [(res.logprob, res.top_logprobs)]
        if r.matcher is not None:
            if r.grammar_error is None and res.token not in r.stop_ids:
                try:
                    if r.matcher.accept_token(res.token):
                        # The sampled token may merge with the forced text that follows it:
                        # the tokens replacing it carry no sampled logprob (0.0, forced).
                        tokens = self.grammars.forced_tokens(r, res.token)
                    else:
                        r.grammar_error = f"token {res.token} is outside the grammar"
                except MatcherError as e:
                    r.grammar_error = str(e)
            if r.grammar_error is not None:  # whatever was sampled, r's output stops here
                self.finish(r, "abort", error=r.grammar_error, request_error=True)
                return
            if tokens[0] != res.token:
                logprobs = []
        self.add_tokens(r, tokens, logprobs, now)

    def add_tokens(
        self,
        r: Request,
        tokens: list[int],
        logprobs: list[tuple[float, dict[int, float]]],
        now: float,
    ) -> None:
        """Append tokens to the output (the sampled one, then any a grammar forces), stream
        their text, and finish the request when one of its stop conditions holds."""
        if not tokens:
            return
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
        r.output_ids.extend(tokens)
        if r.params.wants_logprobs:
            forced = [(0.0, {})] * (len(tokens) - len(logprobs))
            for lp, top in logprobs + forced:
                r.output_logprobs.append(lp)
                r.output_top_logprobs.append(top)
        last = tokens[-1]
        if last in r.stop_ids:
            self.finish(r, "stop", text=r.stop_matcher.flush(), tokens=tokens)
            return
        text = r.stop_matcher.add(r.detokenizer.add(tokens))
        if r.stop_matcher.stopped:
            self.finish(r, "stop", text=text, tokens=tokens)
        elif r.matcher is not None and r.matcher.is_terminated() and not cut:  # nothing follows
            self.finish(r, "stop", text=text + r.stop_matcher.flush(), tokens=tokens)
        elif len(r.output_ids) >= r.max_new_tokens:
            self.finish(r, "length", text=text + r.stop_matcher.flush(), tokens=tokens)
        elif not self.emit(r, _chunk(r, text, tokens)):
            self.finish(r, "abort")  # its consumer is gone

    def fail(self, r: Request, error: str) -> None:
        """End a request the engine could not serve (unless it has ended already)."""
        if r.rid in self.live:
            self.finish(r, "abort", error=error)

    def finish(
        self,
        r: Request,
        reason: str,
        text: str = "",
        tokens: list[int] | None = None,
        error: str | None = None,
        request_error: bool = False,
    ) -> None:
        """Count the request, release its KV, then send its last chunk: a caller woken by it,
        or a `stats()` reader that sees it gone from the scheduler, sees the counters and the
        pool already settled."""
        r.finish_reason = reason
        now = time.monotonic()
        if reason == "abort":
            self.stats.add(requests_aborted=1)
        else:
            self.stats.add(requests_finished=1, cached_tokens=r.num_cached_prompt_tokens)
            self.stats.observe("e2e_s", now - r.arrival)
            if r.first_token_time is not None and len(r.output_ids) > 1:
                self.stats.observe("tpot_s", (now - r.first_token_time) / (len(r.output_ids) - 1))
        if self.speculator is not None:
            self.speculator.release(r)
        self.scheduler.finish(r)
        self.live.pop(r.rid, None)
        meta = {
            "prompt_tokens": len(r.prompt_ids),
            "cached_tokens": r.num_cached_prompt_tokens,
            "completion_tokens": len(r.output_ids),
            "preemptions": r.num_preemptions,
        }
        if r.params.wants_logprobs:
            meta["logprobs"] = r.output_logprobs
            meta["top_logprobs"] = r.output_top_logprobs
        if r.params.prompt_logprobs_from is not None:
            meta["prompt_logprobs"] = r.prompt_logprobs
            if r.params.top_logprobs:
                meta["prompt_top_logprobs"] = r.prompt_top_logprobs
        last = dict(finish_reason=reason, error=error, request_error=request_error, meta=meta)
        self.emit(r, _chunk(r, text, tokens or [], **last))

    def emit(self, r: Request, chunk: StreamChunk) -> bool:
        """Hand a chunk to the request's consumer; a consumer that fails (say, its event loop
        closed) loses its request, and the engine goes on."""
        try:
            r.emit(chunk)
            return True
        except Exception:
            log.warning("request %d: its consumer raised; aborting it", r.rid, exc_info=True)
            return False


def _chunk(r: Request, text: str, tokens: list[int], **fields) -> StreamChunk:
    """A chunk of r's output: `tokens` (the last of its output ids), their text, and their
    logprobs when r asked for them."""
    if r.params.wants_logprobs and tokens:
        n = len(tokens)
        fields.update(logprobs=r.output_logprobs[-n:], top_logprobs=r.output_top_logprobs[-n:])
    return StreamChunk(text, tokens, **fields)


def _no_token_error(r: Request) -> str:
    at = len(r.output_ids)
    if r.matcher is not None and at < r.params.min_tokens:
        return (
            f"no token may follow output token {at}: the constraint allows only tokens that "
            f"min_tokens={r.params.min_tokens} holds back (EOS and stop_token_ids)"
        )
    return f"no token may follow output token {at}: every token is masked or has logit -inf"
