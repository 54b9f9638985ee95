"""GrammarService: the engine's side of constrained decoding.

It compiles constraints and stop regexes off the engine thread (bounded in time and memory
by the grammars compiler's workers) and turns the text a grammar forces into tokens
(jump-forward).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from transformers import PreTrainedTokenizerBase

from braid.grammars.compile.compiler import COMPILER_STATS, Compiled, Job
from braid.grammars.matcher import Grammar, Matcher
from braid.grammars.regex.char_regex import CharPattern, CharRegex
from braid.grammars.vocabulary import TokenVocabulary, build_vocabulary
from braid.runtime.config import EngineConfig
from braid.runtime.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request

T = TypeVar("T")


@dataclass(frozen=True)
class Prepared:
    """What a request's parameters compile to before it can run."""

    grammar: Grammar | None  # None without a constraint
    stop_regexes: tuple[CharRegex, ...]


class GrammarService:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: set[int], config: EngineConfig
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.config = config
        self._lock = threading.Lock()
        self._vocab: TokenVocabulary | None = None
        self._compiler = None  # started with the first constrained request

    @property
    def vocab(self) -> TokenVocabulary:
        with self._lock:
            if self._vocab is None:
                self._vocab = build_vocabulary(self.tokenizer, self.eos_token_ids)
            return self._vocab

    def prepare(self, params: SamplingParams) -> Future[Prepared]:
        """The request's grammar and stop regex automata, compiled in the workers; the
        future raises ValueError for a bad or too costly one (a bad schema raises now)."""
        jobs: list[Job] = [CharPattern(p) for p in params.stop_regexes]
        constraint = params.constraint
        if constraint is not None:
            jobs.insert(0, constraint)
        futures = [self.compile(job) for job in jobs]

        def combine(done: list) -> Prepared:
            grammar = done.pop(0) if constraint is not None else None
            return Prepared(grammar, tuple(done))

        return _gather(futures, combine)

    def compile(self, job: Job) -> Future[Compiled]:
        from braid.grammars.compile.compiler import GrammarCompiler

        vocab = self.vocab
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(
                    vocab,
                    timeout_s=self.config.grammar_compile_timeout_s,
                    max_memory_mb=self.config.grammar_compile_memory_mb,
                    max_state_mb=self.config.grammar_state_memory_mb,
                    workers=self.config.grammar_compile_workers,
                    max_cache_mb=self.config.grammar_memory_mb,
                    max_queued=self.config.grammar_compile_queue,
                )
            return self._compiler.submit(job)

    def stats(self) -> dict[str, int]:
        """The compile cache's memory, entries and evictions, and the compile workers'
        resident memory (all 0 before the first constrained request)."""
        with self._lock:
            compiler = self._compiler
        if compiler is None:
            return dict.fromkeys(COMPILER_STATS, 0)
        return compiler.stats()

    def worker_pids(self) -> list[int]:
        """The live compile worker processes."""
        with self._lock:
            return [] if self._compiler is None else self._compiler.worker_pids()

    def close(self) -> None:
        with self._lock:
            if self._compiler is not None:
                self._compiler.close()
                self._compiler = None

    def forced_tokens(self, r: Request, sampled: int | None) -> list[int]:
        """The tokens to append after `sampled` was accepted by r's matcher (None: at the
        start): `sampled` itself plus the tokens of any text the grammar forces next.

        The forced text is tokenized together with the sampled token when that spells the
        same bytes, so the model sees the tokens it would have produced itself (`"` then
        `name` would otherwise stand where the tokenizer writes `"name`). The matcher is
        left having accepted exactly the returned tokens.
        """
        matcher = r.matcher
        tokens = [] if sampled is None else [sampled]
        if not self.config.jump_forward or matcher.is_terminated():
            return tokens
        forced = matcher.jump_forward().encode()
        if not forced:
            return tokens
        if sampled is not None:
            merged = self._tokenize(self.vocab.token_bytes[sampled] + forced)
            if merged is not None:
                matcher.rollback(1)
                if _accept_all(matcher, merged):
                    return merged
                matcher.accept_token(sampled)
        tail = self._tokenize(forced)
        if tail is not None and _accept_all(matcher, tail):
            return tokens + tail
        return tokens

    def _tokenize(self, data: bytes) -> list[int] | None:
        """Token ids spelling exactly `data`, or None (a partial UTF-8 character, or text
        the tokenizer would turn into special tokens)."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        spelled = [self.vocab.token_bytes[i] for i in ids]
        if not ids or any(b is None for b in spelled) or b"".join(spelled) != data:
            return None
        return ids


def _gather(futures: list[Future], combine: Callable[[list], T]) -> Future[T]:
    """A future of `combine(results)` once every future is done, or of the first error.
    Cancelling it cancels the futures (their compiles are abandoned if nobody else waits)."""
    out: Future[T] = Future()
    if not futures:
        out.set_result(combine([]))
        return out
    remaining = len(futures)
    lock = threading.Lock()

    def settle(_: Future) -> None:
        nonlocal remaining
        with lock:
            remaining -= 1
            if remaining:
                return
        if any(f.cancelled() for f in futures):
            out.cancel()
            return
        errors = [f.exception() for f in futures if f.exception() is not None]
        try:
            if errors:
                out.set_exception(errors[0])
            else:
                out.set_result(combine([f.result() for f in futures]))
        except InvalidStateError:  # cancelled meanwhile
            pass

    def cancel_parts(_: Future) -> None:
        if out.cancelled():
            for f in futures:
                f.cancel()

    for f in futures:
        f.add_done_callback(settle)
    out.add_done_callback(cancel_parts)
    return out


def _accept_all(matcher: Matcher, tokens: list[int]) -> bool:
    """Accept every token or none."""
    for n, t in enumerate(tokens):
        if not matcher.accept_token(t):
            if n:
                matcher.rollback(n)
            return False
    return True
