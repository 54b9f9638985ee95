"""compile(job, vocab) -> Grammar (or CharRegex), cached; GrammarCompiler runs it in bounded
workers.

What each kind of job compiles to, and how, is declared once in jobs.py. Compiling can take
seconds and gigabytes for a hostile input, so the runtime runs a job's costly part in worker
processes with a memory limit and kills one past a time limit: a hostile or huge constraint
fails its own request and nothing else.
"""

from __future__ import annotations

import functools
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from braid.grammars.compiling.cache import GrammarCache
from braid.grammars.compiling.jobs import Job, JobKind, ResultLost, kind_of, run_here
from braid.grammars.matcher import Grammar
from braid.grammars.regex.char_regex import CharRegex
from braid.grammars.regex.lazy import STATE_MEMORY_MB, lazy_available, vocab_memory_bytes
from braid.grammars.vocabulary import TokenVocabulary, build_vocabulary

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerBase

Compiled = Grammar | CharRegex  # what a compiler gives for a Job

_CACHE_SIZE = 256  # compiled jobs kept per cache, however small
# Memory of a cache's grammars and the vocabulary structures they share (cache.py).
GRAMMAR_MEMORY_MB = 1024
_TRIM_INTERVAL_S = 1.0  # an idle compile thread measures the cache again this often
_ABANDON_CHECK_S = 0.05  # a compile thread checks this often whether its job's callers left
# What GrammarCompiler.stats reports.
COMPILER_STATS = (
    "grammar_memory_bytes",
    "grammar_cache_entries",
    "grammar_cache_evictions",
    "grammar_workers_resident_bytes",
    "grammar_compiles",
)


def compile(job: Job, vocab: TokenVocabulary | PreTrainedTokenizerBase) -> Compiled:
    """Compile in this process, without the workers' time and memory limits (tests,
    benchmarks, offline use); cached within GRAMMAR_MEMORY_MB. `vocab` is a TokenVocabulary
    or a Hugging Face tokenizer (its vocabulary is built once)."""
    vocab = as_vocabulary(vocab)
    key = (job, vocab.fingerprint)
    future = _local_cache.get(key)
    if future is None:
        future = Future()
        future.set_result(kind_of(job).assemble(job, vocab, run_here(vocab), STATE_MEMORY_MB))
        _local_cache.put(key, future)
        _local_cache.trim()
    return future.result()


# compile()'s cache: its grammars' memory within the default budget.
_local_cache = GrammarCache(GRAMMAR_MEMORY_MB << 20, _CACHE_SIZE)


def as_vocabulary(vocab: TokenVocabulary | PreTrainedTokenizerBase) -> TokenVocabulary:
    """A tokenizer's TokenVocabulary, built once per tokenizer (its EOS token allowed where
    the grammar accepts); a TokenVocabulary as it is."""
    if isinstance(vocab, TokenVocabulary):
        return vocab
    built = _vocabularies.get(vocab)
    if built is None:
        built = build_vocabulary(vocab)
        _vocabularies[vocab] = built
    return built


# Tokenizer -> its vocabulary, as long as the tokenizer lives.
_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class CompileQueueFull(RuntimeError):
    """More distinct jobs wait to compile than the compiler queues: try again later."""


@dataclass
class _Pending:
    """A job queued or compiling, and how many of its callers still wait for it."""

    job: Job
    waiters: int = 0
    abandoned: bool = False  # every caller cancelled: skip it, or stop its worker


class GrammarCompiler:
    """Compiles jobs for one vocabulary off the caller's thread, within limits.

    `submit` returns a future at once. Each of `workers` compile threads hands its jobs to
    its own worker process (spawned on first use, replaced after a timeout or a crash), so a
    job that runs to the time limit holds up one thread, not every constrained request.
    Results are cached, and concurrent submissions of one job share one compile. The cache
    keeps the grammars and the vocabulary structures they share within `max_cache_mb`
    (grammars/compiling/cache.py); a server has one compiler, so that is its grammars' whole memory.

    A caller that cancels its future (a client gone) gives up its place: a job nobody waits
    for any more is skipped, or its worker stopped if it is compiling, so abandoned jobs do
    not hold up the ones after them. At most `max_queued` distinct jobs wait or compile at
    once; past that `submit` raises CompileQueueFull.
    """

    def __init__(
        self,
        vocab: TokenVocabulary | PreTrainedTokenizerBase,
        timeout_s: float = 30.0,
        max_memory_mb: int = 2048,
        max_state_mb: int = STATE_MEMORY_MB,
        workers: int = 2,
        max_cache_mb: int = GRAMMAR_MEMORY_MB,
        max_queued: int = 256,
    ) -> None:
        self.vocab = as_vocabulary(vocab)
        self.timeout_s = timeout_s
        self.max_memory_mb = max_memory_mb
        self.max_state_mb = max_state_mb  # a lazy automaton's states (grammars/regex/lazy.py)
        self._cache = GrammarCache(max_cache_mb << 20, _CACHE_SIZE, self._shared_bytes)
        # The TokenVocabulary: a bytes object per token (33 bytes and its length) and its slot.
        self._vocab_bytes = sum(33 + len(b or b"") + 8 for b in self.vocab.token_bytes)
        self._kinds_seen: frozenset[JobKind] = frozenset()  # replaced, never changed in place
        self._last_trim = time.monotonic()
        self._workers: dict[str, _Worker] = {}  # compile thread -> its worker process
        self._lock = threading.Lock()
        self.max_queued = max_queued
        self.num_compiles = 0  # jobs the cache did not hold, sent to compile
        self._pending: dict[Future, _Pending] = {}  # by the job's shared future
        self._closed = False
        self._jobs: queue.Queue[tuple[Job, Future[Compiled]] | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"braid-grammar-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: Job) -> Future[Compiled]:
        """A future of the compiled job: the cached one once compiled, else the caller's own,
        which it may cancel."""
        with self._lock:
            if self._closed:
                raise ValueError("the grammar compiler is closed (the engine shut down)")
            future = self._cache.get(job)
            if future is not None and future.done():
                return future
            if future is None:
                if len(self._pending) >= self.max_queued:
                    raise CompileQueueFull(
                        f"{len(self._pending)} constraints are waiting to compile, the most "
                        "this engine queues; try again later"
                    )
                kind = kind_of(job)
                if kind not in self._kinds_seen:
                    self._kinds_seen = self._kinds_seen | {kind}
                future = Future()
                self._cache.put(job, future)
                self._pending[future] = _Pending(job)
                self._jobs.put((job, future))
                self.num_compiles += 1
            self._pending[future].waiters += 1
        mine: Future[Compiled] = Future()
        future.add_done_callback(functools.partial(_settle, mine))
        mine.add_done_callback(functools.partial(self._left, future))
        return mine

    def _left(self, shared: Future, mine: Future) -> None:
        """A caller's future is done: if it was cancelled and nobody else waits for the job,
        the job is abandoned (and dropped from the cache: a later request compiles it anew)."""
        if not mine.cancelled():
            return
        with self._lock:
            pending = self._pending.get(shared)
            if pending is None:
                return
            pending.waiters -= 1
            if pending.waiters == 0:
                pending.abandoned = True
                del self._pending[shared]
                self._cache.discard(pending.job, shared)

    def trim(self) -> None:
        """Measure the cache and evict what is past its budget (see grammars/compiling/cache.py)."""
        self._last_trim = time.monotonic()
        self._cache.trim()

    def stats(self) -> dict[str, int]:
        """The cache's memory as last measured (shared structures included), its entries and
        evictions so far, the compile workers' resident memory, and the compiles started."""
        workers = sum(_resident_bytes(pid) for pid in self.worker_pids())
        cache = self._cache
        values = (cache.memory_bytes(), len(cache), cache.evictions, workers, self.num_compiles)
        return dict(zip(COMPILER_STATS, values, strict=True))

    def worker_pids(self) -> list[int]:
        """The live compile worker processes."""
        workers = list(self._workers.values())
        return [w.process.pid for w in workers if w.alive and w.process.poll() is None]

    def _shared_bytes(self) -> int:
        """What every grammar shares: the vocabulary, and the structures over it of the lazy
        automata and (once one was compiled) of each kind's jobs (EBNF grammars' trie)."""
        total = self._vocab_bytes
        if lazy_available():
            total += vocab_memory_bytes(self.vocab)
        for kind in self._kinds_seen:
            if kind.shared_bytes is not None:
                total += kind.shared_bytes(self.vocab)
        return total

    def close(self) -> None:
        """Stop now: the compiles under way have their workers stopped and the queued ones
        are not started (their callers get a ValueError), so closing never waits for the
        queue to compile (an engine shut down with hundreds queued did, for minutes)."""
        with self._lock:
            self._closed = True
            for pending in self._pending.values():
                pending.abandoned = True
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def _serve(self) -> None:
        worker: _Worker | None = None  # this thread's own, made on first use

        pending: _Pending | None = None  # the job being compiled

        def in_worker(job: Job, index: bool) -> _Results:
            nonlocal worker
            if worker is not None and worker.alive and worker.process.poll() is not None:
                worker.stop()  # it died while idle (killed, out of memory): not this job's doing
            if worker is None or not worker.alive:
                worker = _Worker(self.vocab, self.max_memory_mb)
                self._workers[threading.current_thread().name] = worker
            return worker.run(job, index, self.timeout_s, lambda: pending.abandoned)

        while True:
            try:
                item = self._jobs.get(timeout=_TRIM_INTERVAL_S)
            except queue.Empty:  # idle: the grammars in use may have grown meanwhile
                if time.monotonic() - self._last_trim >= _TRIM_INTERVAL_S:
                    self.trim()
                continue
            if item is None:
                break
            job, future = item
            with self._lock:
                pending = self._pending.get(future)
                if self._closed:
                    self._pending.pop(future, None)
                    pending = None
            if pending is None:  # abandoned while queued, or the compiler closed
                future.set_exception(self._dropped())
                continue
            try:
                kind = kind_of(job)
                compiled = kind.assemble(job, self.vocab, in_worker, self.max_state_mb)
                self._cache.measured(job, compiled.memory_bytes())
                future.set_result(compiled)
            except _Abandoned:
                future.set_exception(self._dropped())
            except Exception as e:  # handed to the request that asked (a ResultLost included)
                future.set_exception(e if isinstance(e, ValueError) else ValueError(str(e)))
            with self._lock:
                self._pending.pop(future, None)
            if time.monotonic() - self._last_trim >= _TRIM_INTERVAL_S:
                self.trim()  # the grammars in use grow while the compiler is busy too
        if worker is not None:
            worker.stop()

    def _dropped(self) -> ValueError:
        """The error of a job dropped before its result: nobody waited, or the compiler closed."""
        if self._closed:
            return ValueError("the grammar compiler is closed (the engine shut down)")
        return ValueError("abandoned by every request that asked")


class _Abandoned(Exception):
    """Every caller of the job being compiled left; its worker was stopped."""


def _settle(mine: Future, shared: Future) -> None:
    """A caller's future gets the shared compile's outcome (unless the caller cancelled)."""
    try:
        if shared.exception() is not None:
            mine.set_exception(shared.exception())
        else:
            mine.set_result(shared.result())
    except InvalidStateError:  # cancelled meanwhile
        pass


class _Worker:
    """A process that compiles jobs one at a time under a memory limit (a schema's regex can
    grow large before its index does).

    It is a plain `python -m braid.grammars.compiling.worker` child talking over its stdin and
    stdout, not a multiprocessing one: spawn would re-run the user's main script in it (a
    script without an `if __name__ == "__main__"` guard would crash), and fork would copy a
    process full of threads. Each job goes with a number its results come back with, so a
    result its kind did not read is skipped, never taken for the next job's."""

    def __init__(self, vocab: TokenVocabulary, max_memory_mb: int) -> None:
        self.vocab = vocab
        self.max_memory_mb = max_memory_mb
        self.process = subprocess.Popen(
            [sys.executable, "-m", "braid.grammars.compiling.worker", str(max_memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.sender = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.receiver = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.sender.send(vocab)
        self.alive = True
        self._jobs_sent = 0

    def run(
        self, job: Job, index: bool, timeout_s: float, abandoned: Callable[[], bool]
    ) -> _Results:
        """Start `job` (its kind's `produce`) in the worker; its results come within
        `timeout_s` of now. Once `abandoned()` says nobody waits, the worker is stopped."""
        deadline = time.monotonic() + timeout_s
        self._jobs_sent += 1
        try:
            self.sender.send((self._jobs_sent, job, index))
        except OSError:
            pass  # the worker is gone: receiving says so
        return _Results(self, self._jobs_sent, kind_of(job), deadline, timeout_s, abandoned)

    def receive(
        self,
        number: int,
        deadline: float,
        timeout_s: float,
        what: str,
        abandoned: Callable[[], bool],
    ) -> bytes:
        """Job `number`'s next result: _Abandoned once nobody waits, ResultLost past the
        deadline or when the worker dies, ValueError for the worker's own error."""
        while True:
            ready = False
            while not ready and time.monotonic() < deadline:
                if abandoned():
                    self.stop()
                    raise _Abandoned()
                try:
                    ready = self.receiver.poll(min(_ABANDON_CHECK_S, deadline - time.monotonic()))
                except OSError:
                    ready = True  # the worker is gone: recv below says so
            if not ready:
                self.stop()
                raise ResultLost(
                    f"compiling {what} took longer than the {timeout_s:g} s limit "
                    "(grammar_compile_timeout_s)"
                )
            try:
                sent_for, ok, payload = self.receiver.recv()
            except (EOFError, OSError):
                self.stop()
                raise ResultLost(
                    f"compiling {what} exceeded the {self.max_memory_mb} MB memory limit "
                    "(grammar_compile_memory_mb) or crashed the compile worker"
                ) from None
            if sent_for != number:
                continue  # an earlier job's result its kind did not read
            if not ok:
                raise ValueError(payload)
            return payload

    def stop(self) -> None:
        self.alive = False
        self.process.kill()
        self.process.wait()
        self.sender.close()
        self.receiver.close()


@dataclass
class _Results:
    """A job's results as its worker sends them (jobs.Results)."""

    worker: _Worker
    number: int
    kind: JobKind
    deadline: float
    timeout_s: float
    abandoned: Callable[[], bool]

    def next(self, budget_s: float | None = None) -> Any:
        deadline = self.deadline
        if budget_s is not None:
            deadline = min(deadline, time.monotonic() + budget_s)
        payload = self.worker.receive(
            self.number, deadline, self.timeout_s, self.kind.what, self.abandoned
        )
        return self.kind.load(payload, self.worker.vocab)


def _resident_bytes(pid: int) -> int:
    """A process's resident memory (Linux; 0 elsewhere or once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
