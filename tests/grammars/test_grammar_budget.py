"""The compile cache's memory budget (grammars/compiling/cache.py): however many distinct
constraints a server compiles, the cache's grammars and the vocabulary structures they share
stay within it, the least recently used evicted first, and what is cached still works; and a
compile worker killed mid-compile fails only its own job and is replaced."""

from __future__ import annotations

import json
import os
import signal
import threading
from concurrent.futures import Future

import pytest
from conftest import wait_for

from braid import grammars
from braid.grammars.compiling.cache import GrammarCache
from braid.grammars.regex.char_regex import CharPattern

NUM_CONSTRAINTS = 200
BUDGET_MB = 24


def _schema(i: int) -> grammars.JsonSchema:
    """A distinct schema of 30 properties: its automaton's NFA holds tens of thousands of
    nodes, so a few dozen of them pass the budget."""
    properties = {f"field_{i}_{j}": {"type": "string", "maxLength": 12} for j in range(30)}
    return grammars.JsonSchema.of(
        {"type": "object", "properties": properties, "required": list(properties)}
    )


def _document(i: int) -> str:
    return json.dumps({f"field_{i}_{j}": "ok" for j in range(30)}, separators=(",", ":"))


@pytest.fixture(scope="module")
def takes(tokenizer):
    """takes(grammar, text): each token of `text`, then EOS, allowed by the mask before it
    and accepted, and the matcher terminated (bits read directly: a few hundred masks)."""

    def take(grammar, text: str) -> bool:
        matcher = grammar.matcher()
        row = grammars.allocate_bitmask(1, grammar.vocab.size)[0]
        for token in [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]:
            matcher.fill_bitmask(row)
            if not (int(row[token // 32]) >> (token % 32)) & 1 or not matcher.accept_token(token):
                return False
        return matcher.is_terminated()

    return take


def test_distinct_constraints_stay_within_the_budget_and_cached_ones_work(vocab, takes):
    budget = BUDGET_MB << 20
    compiler = grammars.GrammarCompiler(vocab, max_cache_mb=BUDGET_MB)
    try:
        futures = []
        for i in range(NUM_CONSTRAINTS):
            futures.append(compiler.submit(_schema(i)))
            grammar = futures[-1].result(timeout=120)
            if i % 20 == 0:  # a request's states and masks: the grammar grows (to ~6 MB)
                assert takes(grammar, _document(i))
            compiler.trim()
            stats = compiler.stats()
            assert 0 < stats["grammar_memory_bytes"] <= budget, (i, stats)
        stats = compiler.stats()
        assert stats["grammar_cache_evictions"] > 0
        assert 1 < stats["grammar_cache_entries"] < NUM_CONSTRAINTS
        # The most recent ones are still cached: the same compile serves them, and works.
        last = NUM_CONSTRAINTS - 1
        assert compiler.submit(_schema(last)).result() is futures[last].result()
        assert takes(futures[last].result(), _document(last))
        # An evicted one compiles again and works the same.
        again = compiler.submit(_schema(0))
        assert again.result(timeout=120) is not futures[0].result()
        assert takes(again.result(timeout=120), _document(0))
        assert not takes(again.result(), _document(1))
    finally:
        compiler.close()


def test_eviction_is_least_recently_used_first_and_spares_the_newest():
    class Sized:
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

        def memory_bytes(self) -> int:
            return self.nbytes

    def settled(nbytes: int) -> Future:
        future = Future()
        future.set_result(Sized(nbytes))
        return future

    cache = GrammarCache(max_bytes=100, max_entries=10, shared_bytes=lambda: 20)
    for key in "abc":
        cache.put(key, settled(30))
    cache.get("a")  # now more recent than b and c
    cache.trim()
    assert (cache.get("b"), len(cache), cache.memory_bytes()) == (None, 2, 80)
    cache.put("huge", settled(500))
    cache.trim()  # over the budget alone: kept, the others go
    assert len(cache) == 1 and cache.get("huge") is not None and cache.evictions == 3
    failed = Future()
    failed.set_exception(ValueError("bad"))
    cache.put("bad", failed)
    assert cache.get("bad") is None  # a failed compile is tried again, not kept


def test_a_worker_killed_mid_compile_fails_only_its_job_and_is_replaced(vocab, takes):
    compiler = grammars.GrammarCompiler(vocab, timeout_s=120)
    try:
        # A counted repetition: its character automaton takes seconds to build.
        doomed = compiler.submit(CharPattern("a{20000}"))
        wait_for(lambda: len(compiler.worker_pids()) == 1, 60, "the first compile worker")
        [pid] = compiler.worker_pids()
        # Meanwhile the other compile thread serves another job with a worker of its own.
        quick = compiler.submit(grammars.Regex("[0-9]{3}"))
        assert takes(quick.result(timeout=60), "123")
        assert not doomed.done()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ValueError, match="crashed the compile worker"):
            doomed.result(timeout=60)
        assert pid not in compiler.worker_pids()
        # The next job gets a new worker.
        assert takes(compiler.submit(grammars.Regex("[a-z]{2}")).result(timeout=60), "ok")
    finally:
        compiler.close()


def test_abandoned_compiles_give_up_their_place(vocab, takes):
    """Three slow jobs on one compile thread, every caller gone: the compiling one's worker
    is stopped and the queued ones are skipped, so the next job compiles at once instead of
    after them (each takes tens of seconds). The queue is bounded meanwhile."""
    compiler = grammars.GrammarCompiler(vocab, timeout_s=600, workers=1, max_queued=3)
    try:
        slow = [compiler.submit(CharPattern(f"a{{{20000 + i}}}")) for i in range(3)]
        wait_for(lambda: len(compiler.worker_pids()) == 1, 60, "the compile worker")
        [pid] = compiler.worker_pids()
        with pytest.raises(grammars.CompileQueueFull, match="3 constraints are waiting"):
            compiler.submit(grammars.Regex("[0-9]{3}"))
        assert all(f.cancel() for f in slow)
        quick = compiler.submit(grammars.Regex("[0-9]{3}"))
        assert takes(quick.result(timeout=30), "123")
        assert pid not in compiler.worker_pids()
        # A job one caller left and another still waits for is compiled for the other.
        shared = CharPattern("[ab]c")
        leaving, staying = compiler.submit(shared), compiler.submit(shared)
        leaving.cancel()
        assert staying.result(timeout=30) is not None
    finally:
        compiler.close()


def test_closing_drops_the_queue_and_stops_the_compile_under_way(vocab):
    """Closing with slow jobs compiling and queued (each takes tens of seconds, so compiling
    them all would take minutes) stops the worker and starts none of the queue: close returns
    within seconds, every caller gets the closed error, and nothing more is accepted."""
    compiler = grammars.GrammarCompiler(vocab, timeout_s=600, workers=1, max_queued=16)
    slow = [compiler.submit(CharPattern(f"a{{{20000 + i}}}")) for i in range(6)]
    wait_for(lambda: len(compiler.worker_pids()) == 1, 60, "the compile worker")
    [pid] = compiler.worker_pids()
    closing = threading.Thread(target=compiler.close)
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive(), "close waited for the queue to compile"
    for future in slow:
        with pytest.raises(ValueError, match="closed"):
            future.result(timeout=1)
    assert pid not in compiler.worker_pids()
    with pytest.raises(ValueError, match="closed"):
        compiler.submit(grammars.Regex("[0-9]{3}"))
