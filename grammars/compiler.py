"""compile(constraint, vocab) -> Grammar, cached; GrammarCompiler runs it in a bounded worker.

Regex, choices and JSON schemas become a regex, then an outlines-core index when it is cheap
enough to build up front (index_builder.fits_index), else the lazy automaton
(grammars/lazy.py), which makes states and masks as they are reached. Converting and
indexing can take seconds and gigabytes, so the runtime runs them in a separate worker
process with a memory limit and kills it past a time limit: a hostile or huge schema fails
its own request and nothing else, and an index that blows either limit falls back to the
lazy automaton over the regex the worker sent first. EBNF grammars compile in-process
(lark's parser tables are cheap; their cost is paid per token by the matcher).
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
from concurrent.futures import Future
from multiprocessing.connection import Connection

from grammars.constraints import Constraint, Ebnf
from grammars.index_builder import IndexUnbuildable, build_index, constraint_regex, fits_index
from grammars.lazy import STATE_MEMORY_MB, LazyRegexGrammar
from grammars.matcher import Grammar
from grammars.regex import RegexGrammar
from grammars.vocabulary import TokenVocabulary

log = logging.getLogger(__name__)

# An index that takes longer than this is abandoned for the lazy automaton: its cost (states
# x vocabulary) is hard to predict from the regex, and the lazy automaton compiles in
# milliseconds; its masks then cost a trie walk the first time each is needed.
INDEX_BUDGET_S = 1.0
_CACHE_SIZE = 256  # compiled grammars kept per compiler (an index can be megabytes)


def compile(constraint: Constraint, vocab: TokenVocabulary) -> Grammar:
    """Compile in this process, unbounded (tests, benchmarks, offline use); cached."""
    key = (constraint, vocab.fingerprint)
    grammar = _local_cache.get(key)
    if grammar is None:
        grammar = _build(constraint, vocab, lambda c: _regex_and_index(c, vocab))
        _local_cache[key] = grammar
        if len(_local_cache) > _CACHE_SIZE:
            _local_cache.popitem(last=False)
    else:
        _local_cache.move_to_end(key)
    return grammar


_local_cache: OrderedDict = OrderedDict()


def _build(
    constraint: Constraint,
    vocab: TokenVocabulary,
    regex_and_index,
    max_state_mb: int = STATE_MEMORY_MB,
) -> Grammar:
    if isinstance(constraint, Ebnf):
        from grammars.ebnf import EbnfGrammar

        return EbnfGrammar(constraint.grammar, vocab)
    pattern, index = regex_and_index(constraint)
    if index is None:
        return LazyRegexGrammar(pattern, vocab, max_state_mb)
    return RegexGrammar(index, vocab, pattern)


def _regex_and_index(constraint: Constraint, vocab: TokenVocabulary):
    """(regex, outlines index or None when the lazy automaton should take the regex)."""
    pattern = constraint_regex(constraint)
    if not fits_index(pattern):
        return pattern, None
    try:
        return pattern, build_index(pattern, vocab)
    except IndexUnbuildable:
        return pattern, None


class GrammarCompiler:
    """Compiles constraints for one vocabulary off the caller's thread, within limits.

    `submit` returns a future at once; a compile thread hands index building to a worker
    process (spawned once, replaced after a timeout or a crash). Results are cached, and
    concurrent submissions of one constraint share one compile.
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        timeout_s: float = 30.0,
        max_memory_mb: int = 2048,
        max_state_mb: int = STATE_MEMORY_MB,
    ) -> None:
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.max_memory_mb = max_memory_mb
        self.max_state_mb = max_state_mb  # a lazy automaton's states (grammars/lazy.py)
        self._cache: OrderedDict[Constraint, Future[Grammar]] = OrderedDict()
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[Constraint, Future[Grammar]] | None] = queue.Queue()
        self._worker: _Worker | None = None
        self._thread = threading.Thread(target=self._serve, name="braid-grammar", daemon=True)
        self._thread.start()

    def submit(self, constraint: Constraint) -> Future[Grammar]:
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None and not (future.done() and future.exception()):
                self._cache.move_to_end(constraint)
                return future
            future = Future()
            self._cache[constraint] = future
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        self._jobs.put((constraint, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            constraint, future = job
            try:
                grammar = _build(constraint, self.vocab, self._in_worker, self.max_state_mb)
                future.set_result(grammar)
            except Exception as e:  # handed to the request that asked
                future.set_exception(e if isinstance(e, ValueError) else ValueError(str(e)))
        if self._worker is not None:
            self._worker.stop()

    def _in_worker(self, constraint: Constraint):
        if self._worker is None or not self._worker.alive:
            self._worker = _Worker(self.vocab, self.max_memory_mb)
        try:
            return self._worker.build(constraint, self.timeout_s)
        except _WorkerLost as e:
            self._worker = None
            raise ValueError(str(e)) from None


class _WorkerLost(Exception):
    pass


class _Worker:
    """A process that turns constraints into regexes and indexes, one at a time, under a
    memory limit (a schema's regex can grow large before its index does).

    It is a plain `python -m grammars.compile_worker` child talking over its stdin/stdout,
    not a multiprocessing one: spawn would re-run the user's main script in it (a script
    without an `if __name__ == "__main__"` guard would crash), and fork would copy a process
    full of threads. For each constraint it sends the regex, then the index (or None)."""

    def __init__(self, vocab: TokenVocabulary, max_memory_mb: int) -> None:
        self.max_memory_mb = max_memory_mb
        self.process = subprocess.Popen(
            [sys.executable, "-m", "grammars.compile_worker", str(max_memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.sender = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.receiver = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.sender.send(vocab)
        self.alive = True

    def build(self, constraint: Constraint, timeout_s: float):
        """(regex, index or None). An index that runs past INDEX_BUDGET_S or the memory
        limit gives (regex, None): the lazy automaton needs no index."""
        deadline = time.monotonic() + timeout_s
        try:
            self.sender.send(constraint)
        except OSError:
            pass  # the worker is gone: receiving says so
        pattern = self._receive(deadline, timeout_s)
        try:
            return pattern, self._receive(
                min(deadline, time.monotonic() + INDEX_BUDGET_S), timeout_s
            )
        except _WorkerLost as e:
            log.info("outlines index abandoned (%s); compiling the regex lazily", e)
            return pattern, None

    def _receive(self, deadline: float, timeout_s: float):
        try:
            ready = self.receiver.poll(max(0.0, deadline - time.monotonic()))
        except OSError:
            ready = True  # the worker is gone: recv below says so
        if not ready:
            self.stop()
            raise _WorkerLost(
                f"compiling the constraint took longer than the {timeout_s:g} s limit "
                "(grammar_compile_timeout_s)"
            )
        try:
            ok, payload = self.receiver.recv()
        except (EOFError, OSError):
            self.stop()
            raise _WorkerLost(
                f"compiling the constraint exceeded the {self.max_memory_mb} MB memory limit "
                "(grammar_compile_memory_mb) or crashed the compile worker"
            ) from None
        if not ok:
            raise ValueError(payload)
        return pickle.loads(payload)

    def stop(self) -> None:
        self.alive = False
        self.process.kill()
        self.process.wait()
        self.sender.close()
        self.receiver.close()
