"""compile(job, vocab) -> Grammar (or CharRegex), cached; GrammarCompiler runs it in bounded
workers.

Regex, choices and JSON schemas become a regex, then an outlines-core index when it is cheap
enough to build up front (index_builder.fits_index), else the lazy automaton
(grammars/lazy.py), which makes states and masks as they are reached. EBNF grammars become
lark's parse table over terminal automata (grammars/ebnf.py); stop regexes (CharPattern) a
character automaton (grammars/char_regex.py). Each of these can take seconds and gigabytes
for a hostile input, so the runtime runs them in worker processes with a memory limit and
kills one past a time limit: a hostile or huge constraint fails its own request and nothing
else, and an index that blows either limit falls back to the lazy automaton over the regex
the worker sent first.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

from braid.grammars.char_regex import CharPattern, CharRegex
from braid.grammars.constraints import Constraint, Ebnf
from braid.grammars.index_builder import IndexUnbuildable, build_index, constraint_regex, fits_index
from braid.grammars.lazy import STATE_MEMORY_MB, LazyRegexGrammar
from braid.grammars.matcher import Grammar
from braid.grammars.regex import RegexGrammar
from braid.grammars.vocabulary import TokenVocabulary

log = logging.getLogger(__name__)

# What a compiler takes, and what it gives for it.
Job = Constraint | CharPattern
Compiled = Grammar | CharRegex

# An index that takes longer than this is abandoned for the lazy automaton: its cost (states
# x vocabulary) is hard to predict from the regex, and the lazy automaton compiles in
# milliseconds; its masks then cost a trie walk the first time each is needed.
INDEX_BUDGET_S = 1.0
_CACHE_SIZE = 256  # compiled grammars kept per compiler (an index can be megabytes)


def compile(job: Job, vocab: TokenVocabulary) -> Compiled:
    """Compile in this process, unbounded (tests, benchmarks, offline use); cached."""
    key = (job, vocab.fingerprint)
    grammar = _local_cache.get(key)
    if grammar is None:
        grammar = _build(job, vocab, lambda j: _run_here(j, vocab))
        _local_cache[key] = grammar
        if len(_local_cache) > _CACHE_SIZE:
            _local_cache.popitem(last=False)
    else:
        _local_cache.move_to_end(key)
    return grammar


_local_cache: OrderedDict = OrderedDict()


def _build(
    job: Job, vocab: TokenVocabulary, run: Callable, max_state_mb: int = STATE_MEMORY_MB
) -> Compiled:
    """`run(job)` does the costly part: a CharRegex, an EbnfGrammar, or for the other
    constraints (their regex, its outlines index or None for the lazy automaton)."""
    built = run(job)
    if isinstance(job, (CharPattern, Ebnf)):
        return built
    pattern, index = built
    if index is None:
        return LazyRegexGrammar(pattern, vocab, max_state_mb)
    return RegexGrammar(index, vocab, pattern)


def _run_here(job: Job, vocab: TokenVocabulary):
    if isinstance(job, CharPattern):
        return CharRegex(job.pattern)
    if isinstance(job, Ebnf):
        from braid.grammars.ebnf import EbnfGrammar

        return EbnfGrammar(job.grammar, vocab)
    pattern = constraint_regex(job)
    if not fits_index(pattern):
        return pattern, None
    try:
        return pattern, build_index(pattern, vocab)
    except IndexUnbuildable:
        return pattern, None


class GrammarCompiler:
    """Compiles jobs for one vocabulary off the caller's thread, within limits.

    `submit` returns a future at once. Each of `workers` compile threads hands its jobs to
    its own worker process (spawned on first use, replaced after a timeout or a crash), so a
    job that runs to the time limit holds up one thread, not every constrained request.
    Results are cached, and concurrent submissions of one job share one compile.
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        timeout_s: float = 30.0,
        max_memory_mb: int = 2048,
        max_state_mb: int = STATE_MEMORY_MB,
        workers: int = 2,
    ) -> None:
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.max_memory_mb = max_memory_mb
        self.max_state_mb = max_state_mb  # a lazy automaton's states (grammars/lazy.py)
        self._cache: OrderedDict[Job, Future[Compiled]] = OrderedDict()
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[Job, Future[Compiled]] | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"braid-grammar-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> Future[Compiled]:
        with self._lock:
            future = self._cache.get(job)
            if future is not None and not (future.done() and future.exception()):
                self._cache.move_to_end(job)
                return future
            future = Future()
            self._cache[job] = future
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        self._jobs.put((job, future))
        return future

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def _serve(self) -> None:
        worker: _Worker | None = None  # this thread's own, made on first use

        def in_worker(job: Job):
            nonlocal worker
            if worker is None or not worker.alive:
                worker = _Worker(self.vocab, self.max_memory_mb)
            try:
                return worker.build(job, self.timeout_s)
            except _WorkerLost as e:
                raise ValueError(str(e)) from None

        while (item := self._jobs.get()) is not None:
            job, future = item
            try:
                future.set_result(_build(job, self.vocab, in_worker, self.max_state_mb))
            except Exception as e:  # handed to the request that asked
                future.set_exception(e if isinstance(e, ValueError) else ValueError(str(e)))
        if worker is not None:
            worker.stop()


class _WorkerLost(Exception):
    pass


class _Worker:
    """A process that compiles jobs one at a time under a memory limit (a schema's regex can
    grow large before its index does).

    It is a plain `python -m grammars.compile_worker` child talking over its stdin/stdout,
    not a multiprocessing one: spawn would re-run the user's main script in it (a script
    without an `if __name__ == "__main__"` guard would crash), and fork would copy a process
    full of threads."""

    def __init__(self, vocab: TokenVocabulary, max_memory_mb: int) -> None:
        self.vocab = vocab
        self.max_memory_mb = max_memory_mb
        self.process = subprocess.Popen(
            [sys.executable, "-m", "braid.grammars.compile_worker", str(max_memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.sender = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.receiver = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.sender.send(vocab)
        self.alive = True

    def build(self, job: Job, timeout_s: float):
        """What `_run_here(job)` gives, built in the worker. For a regex-like constraint an
        index that runs past INDEX_BUDGET_S or the memory limit gives (regex, None): the
        lazy automaton needs no index."""
        deadline = time.monotonic() + timeout_s
        what = "the stop regex" if isinstance(job, CharPattern) else "the constraint"
        try:
            self.sender.send(job)
        except OSError:
            pass  # the worker is gone: receiving says so
        first = self._receive(deadline, timeout_s, what)
        if isinstance(job, CharPattern):
            return pickle.loads(first)
        if isinstance(job, Ebnf):
            from braid.grammars.ebnf import EbnfGrammar

            return EbnfGrammar.loads(first, self.vocab)
        pattern = pickle.loads(first)
        budget = min(deadline, time.monotonic() + INDEX_BUDGET_S)
        try:
            return pattern, pickle.loads(self._receive(budget, timeout_s, what))
        except _WorkerLost as e:
            log.info("outlines index abandoned (%s); compiling the regex lazily", e)
            return pattern, None

    def _receive(self, deadline: float, timeout_s: float, what: str) -> bytes:
        try:
            ready = self.receiver.poll(max(0.0, deadline - time.monotonic()))
        except OSError:
            ready = True  # the worker is gone: recv below says so
        if not ready:
            self.stop()
            raise _WorkerLost(
                f"compiling {what} took longer than the {timeout_s:g} s limit "
                "(grammar_compile_timeout_s)"
            )
        try:
            ok, payload = self.receiver.recv()
        except (EOFError, OSError):
            self.stop()
            raise _WorkerLost(
                f"compiling {what} exceeded the {self.max_memory_mb} MB memory limit "
                "(grammar_compile_memory_mb) or crashed the compile worker"
            ) from None
        if not ok:
            raise ValueError(payload)
        return payload

    def stop(self) -> None:
        self.alive = False
        self.process.kill()
        self.process.wait()
        self.sender.close()
        self.receiver.close()
