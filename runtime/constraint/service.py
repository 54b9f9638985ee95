"""GrammarService: the engine's side of constrained decoding.

It compiles constraints and stop regexes off the engine thread (bounded in time and memory
by the grammars compiler's workers), and makes each constrained request's ConstraintState
(state.py), which advances its matcher.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from braid.grammars.compiling.compiler import COMPILER_STATS, Compiled, Job
from braid.grammars.constraints import AnyText, Choices, JsonSchema, ToolCalls
from braid.grammars.harmony_calls import (
    CHANNEL,
    FINAL,
    PREFIX,
    HarmonyCallsGrammar,
    HarmonyTokens,
)
from braid.grammars.matcher import Grammar
from braid.grammars.phases import (
    FreeMatcher,
    MarkerGuard,
    PhasedMatcher,
    Phases,
    TokenClasses,
)
from braid.grammars.regex.char_regex import CharPattern, CharRegex
from braid.grammars.token_healing import HealingIndex, HealingMatcher
from braid.grammars.tool_calls import arguments_schema
from braid.grammars.vocabulary import TokenVocabulary, build_vocabulary
from braid.runtime.config import EngineConfig
from braid.runtime.constraint.state import ConstraintState, JumpForward
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.text.reasoning import encode

T = TypeVar("T")


@dataclass(frozen=True)
class Prepared:
    """What a request's parameters compile to before it can run."""

    grammar: Grammar | None  # None without a constraint
    stop_regexes: tuple[CharRegex, ...]


class GrammarService:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: set[int],
        config: EngineConfig,
        harmony: bool = False,
    ) -> None:
        """`harmony`: the model writes tool calls in harmony's format (GPT-OSS), not Hermes'."""
        self.tokenizer = tokenizer
        self.harmony = harmony
        self.eos_token_ids = eos_token_ids
        self.config = config
        self._lock = threading.Lock()
        self._vocab: TokenVocabulary | None = None
        self._compiler = None  # started with the first constrained request
        self._jump: JumpForward | None = None
        self._classes: TokenClasses | None = None
        self._harmony: HarmonyTokens | None = None
        self._guards: dict[str, MarkerGuard] = {}
        self._healing: HealingIndex | None = None

    @property
    def vocab(self) -> TokenVocabulary:
        with self._lock:
            return self._vocab_locked()

    def _vocab_locked(self) -> TokenVocabulary:
        if self._vocab is None:
            self._vocab = build_vocabulary(self.tokenizer, self.eos_token_ids)
        return self._vocab

    def prepare(self, params: SamplingParams) -> Future[Prepared]:
        """The request's grammar and stop regex automata, compiled in the workers; the
        future raises ValueError for a bad or too costly one (a bad schema raises now)."""
        futures: list[Future] = [self.compile(CharPattern(p)) for p in params.stop_regexes]
        constraint = params.constraint
        if isinstance(constraint, ToolCalls) and self.harmony:
            futures.insert(0, self._harmony_calls(constraint))
        elif constraint is not None:
            futures.insert(0, self.compile(constraint))

        def combine(done: list) -> Prepared:
            grammar = done.pop(0) if constraint is not None else None
            return Prepared(grammar, tuple(done))

        return _gather(futures, combine)

    def compile(self, job: Job) -> Future[Compiled]:
        from braid.grammars.compiling.compiler import GrammarCompiler

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

    def marker_guard(self, marker: str) -> MarkerGuard:
        """The guard of a reasoning format's end marker (built once: a pass over the
        vocabulary)."""
        vocab = self.vocab
        with self._lock:
            if marker not in self._guards:
                self._guards[marker] = MarkerGuard.of(marker.encode(), vocab.token_bytes)
            return self._guards[marker]

    @property
    def healing_index(self) -> HealingIndex:
        """The vocabulary sorted for token healing (built once: a sort of the vocabulary)."""
        vocab = self.vocab
        with self._lock:
            if self._healing is None:
                self._healing = HealingIndex(vocab)
            return self._healing

    def _harmony_calls(self, calls: ToolCalls) -> Future[Grammar]:
        """A harmony call grammar, of its parts compiled as usual: the names, each tool's
        arguments, and a text reply's grammar where the reply may be text."""
        names = [t.name for t in calls.tools]
        jobs: list[Job] = [Choices(tuple(PREFIX + n for n in names))]
        jobs += [arguments_schema(t, calls.compact) for t in calls.tools]
        if isinstance(calls.text, (JsonSchema, Choices)):
            jobs.append(calls.text)
        futures = [self.compile(job) for job in jobs]
        tokens = self._harmony_tokens()

        def combine(done: list[Grammar]) -> Grammar:
            text = done[-1] if isinstance(calls.text, (JsonSchema, Choices)) else None
            if isinstance(calls.text, AnyText):
                text = "free"
            arguments = dict(zip(names, done[1 : 1 + len(names)], strict=True))
            return HarmonyCallsGrammar(done[0], arguments, text, tokens)

        return _gather(futures, combine)

    def _harmony_tokens(self) -> HarmonyTokens:
        """The ids harmony's calls are written with (made once)."""
        with self._lock:
            if self._harmony is None:
                vocab, tok = self._vocab_locked(), self.tokenizer
                [call], [ret] = encode(tok, "<|call|>"), encode(tok, "<|return|>")
                self._harmony = HarmonyTokens(
                    encode(tok, CHANNEL),
                    encode(tok, FINAL),
                    call,
                    ret,
                    vocab.eos_token_ids,
                    vocab.token_bytes,
                    self._classes_locked().every,
                )
            return self._harmony

    def _classes_locked(self) -> TokenClasses:
        if self._classes is None:
            self._classes = TokenClasses.of(self._vocab_locked().token_bytes)
        return self._classes

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

    def constraint(
        self, grammar: Grammar | None, phases: Phases | None = None, healed: bytes = b""
    ) -> ConstraintState:
        """A new request's state in `grammar` (a fresh matcher; None: an answer held to
        nothing), in `phases` when the request reasons first, behind token healing of the
        prompt bytes `healed` where there are some (never with phases: a thought comes
        first there)."""
        if healed:
            assert phases is None
            index = self.healing_index
            inner = grammar.matcher() if grammar is not None else None
            with self._lock:
                jump = self._jump_locked()
            return ConstraintState(HealingMatcher(inner, healed, index), jump)
        with self._lock:
            vocab = self._vocab_locked()
            jump = self._jump_locked()
            classes = self._classes_locked() if phases is not None else None
        if phases is None:
            assert grammar is not None
            return ConstraintState(grammar.matcher(), jump)
        inner = (
            grammar.matcher() if grammar is not None else FreeMatcher(classes, vocab.eos_token_ids)
        )
        return ConstraintState(PhasedMatcher(inner, phases, classes), jump)

    def _jump_locked(self) -> JumpForward:
        if self._jump is None:
            self._jump = JumpForward(
                self.tokenizer,
                self._vocab_locked(),
                self.config.jump_forward,
                lambda: self.healing_index,
            )
        return self._jump


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
