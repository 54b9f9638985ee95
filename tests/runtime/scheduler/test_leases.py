"""Program leases on cached prefixes (runtime/kvcache/leases.py), constraints compiled ahead, and
both through a braid server (RemoteBackend)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from braid import RemoteBackend, assistant, gen, program, user
from braid.runtime import Engine, SamplingParams
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.kvcache.radix_cache import RadixCache
from tests.conftest import LiveServer, StepGate, assert_no_kv_leak, wait_for, wait_idle

BIG = 1 << 20  # a lease bound that never binds


def _cache(num_slots: int = 64) -> RadixCache:
    kv = KVPool(1, num_slots, num_kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu")
    return RadixCache(kv)


def _insert(cache: RadixCache, tokens: list[int]) -> None:
    cache.insert(tokens, cache.kv.allocate(len(tokens)))


def _cached(cache: RadixCache, tokens: list[int]) -> int:
    return cache.match_prefix(tokens)[0].numel()


def test_a_leased_prefix_outlives_pressure_that_evicts_an_unleased_one():
    cache = _cache()
    leased, plain = [1, 2, 3, 4], [9, 8, 7, 6]
    _insert(cache, leased)
    _insert(cache, plain)
    cache.match_prefix(leased)  # the leased one is the more recently used: LRU would take it
    cache.lease("program", leased, None, ttl_s=60, max_leased_tokens=BIG)
    assert cache.num_leased_tokens == 4
    assert cache.evict(4) == 4
    assert _cached(cache, leased) == 4 and _cached(cache, plain) == 0


def test_leases_break_only_when_nothing_unleased_is_left_and_least_urgent_first():
    """Waiting states go before queued ones; among those waiting, the one whose wait began
    last (it will be needed last when tools take alike)."""
    cache = _cache()
    waited_long, waiting, queued = [1, 2, 3], [5, 6, 7], [9, 10, 11]
    for tokens in (waited_long, waiting, queued):
        _insert(cache, tokens)
    cache.lease("queued", queued, None, ttl_s=60, max_leased_tokens=BIG)
    cache.lease("waited long", waited_long, None, ttl_s=60, max_leased_tokens=BIG)
    time.sleep(0.01)
    cache.lease("waiting", waiting, None, ttl_s=60, max_leased_tokens=BIG)  # renewed last
    cache.leases.queue("queued", +1)  # its next request is in the scheduler's queue
    assert cache.evict(3, break_leases=False) == 0
    assert cache.evict(3) == 3
    assert "waiting" not in cache.leases and {"waited long", "queued"} <= set(cache.leases._by_key)
    assert _cached(cache, waiting) == 0 and _cached(cache, waited_long) == 3
    assert cache.evict(3) == 3
    assert "queued" in cache.leases and _cached(cache, queued) == 3


def test_an_expired_lease_is_evicted_like_an_unleased_prefix():
    cache = _cache()
    expired, plain = [1, 2, 3], [4, 5, 6]
    _insert(cache, expired)
    cache.lease("gone", expired, None, ttl_s=0.01, max_leased_tokens=BIG)
    _insert(cache, plain)  # more recent, unleased
    time.sleep(0.02)
    assert cache.evict(3, break_leases=False) == 3
    assert "gone" not in cache.leases and cache.num_leased_tokens == 0
    assert _cached(cache, expired) == 0 and _cached(cache, plain) == 3


def test_leased_tokens_stay_within_their_bound():
    cache = _cache()
    first, second = [1, 2, 3, 4], [5, 6, 7, 8]
    for tokens in (first, second):
        _insert(cache, tokens)
    cache.lease("first", first, None, ttl_s=60, max_leased_tokens=6)
    cache.lease("second", second, None, ttl_s=60, max_leased_tokens=6)
    assert list(cache.leases._by_key) == ["second"] and cache.num_leased_tokens == 4
    cache.lease("huge", first, None, ttl_s=60, max_leased_tokens=3)
    assert "huge" not in cache.leases  # larger than the bound alone: not taken


def test_a_lease_follows_its_prefix_through_an_edge_split():
    cache = _cache()
    _insert(cache, [1, 2, 3, 4, 5])
    cache.lease("p", [1, 2, 3, 4, 5], None, ttl_s=60, max_leased_tokens=BIG)
    _insert(cache, [1, 2, 9])  # splits the leased edge after [1, 2]
    assert cache.num_leased_tokens == 5
    cache.release("p")
    assert cache.num_leased_tokens == 0
    assert cache.evict(BIG) == 6


# ---- the engine: leases from program states ------------------------------------------------


@pytest.fixture(scope="module")
def small_engine(tiny_model_path):
    """A pool that holds a few prompts, so that pressure is easy to make."""
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=160)
    yield engine
    engine.shutdown()


def _prompt(seed: int, n: int = 40) -> list[int]:
    return [1] + [3 + (seed * 31 + i * 7) % 200 for i in range(n - 1)]


async def _run(engine: Engine, ids: list[int], program_id: str | None, max_tokens: int = 4):
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    async for _ in engine.stream(ids, params, program=program_id):
        pass


def test_an_engine_program_lease_survives_other_traffic_and_is_released(small_engine):
    import asyncio

    engine = small_engine
    engine.flush_cache()
    leased = _prompt(1)
    asyncio.run(_run(engine, leased, "agent-1"))
    assert engine.stats()["program_leases"] == 1
    for seed in range(2, 8):  # enough other prompts to fill the pool several times over
        asyncio.run(_run(engine, _prompt(seed), None))
    wait_idle(engine)
    before = engine.stats()["prefill_tokens_computed"]
    asyncio.run(_run(engine, leased + [5, 6], "agent-1"))
    computed = engine.stats()["prefill_tokens_computed"] - before
    assert computed <= 2 + 1  # the new tokens (and a token past the cached output) only
    engine.release_program("agent-1")
    wait_for(lambda: engine.stats()["program_leases"] == 0, what="the release")
    assert_no_kv_leak(engine)


def test_a_plain_request_breaks_a_lease_when_nothing_else_runs(small_engine):
    """A request that only fits by breaking a lease, with nothing running that could free
    room, breaks it rather than wait for ever."""
    import asyncio

    engine = small_engine
    engine.flush_cache()
    asyncio.run(_run(engine, _prompt(11, 100), "agent-2"))
    assert engine.stats()["kv_slots_leased"] >= 100
    asyncio.run(_run(engine, _prompt(12, 100), None))  # alone: it may break the lease
    assert engine.stats()["program_leases"] == 0
    wait_idle(engine)
    assert_no_kv_leak(engine)


# ---- programs -------------------------------------------------------------------------------


@program
def agent(s, proceed: threading.Event, at_tool: threading.Event):
    s += user("What is the weather?")
    s += assistant(gen("thought", max_tokens=6))
    at_tool.set()
    proceed.wait(60)  # the tool runs
    s += user("It is sunny.")
    s += assistant(gen("answer", max_tokens=4))


@program
def failing(s, at_tool: threading.Event):
    s += user("Count.")
    s += assistant(gen("a", max_tokens=4))
    s["a"]  # noqa: B018 (wait for the gen)
    at_tool.set()
    raise RuntimeError("the tool failed")


def _leases(engine: Engine) -> int:
    return engine.stats()["program_leases"]


def _run_agent(backend, engine: Engine, while_the_tool_runs=lambda: None) -> None:
    proceed, at_tool = threading.Event(), threading.Event()
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(s=agent.run(proceed, at_tool, backend=backend)), daemon=True
    )
    thread.start()
    assert at_tool.wait(60)
    wait_for(lambda: _leases(engine) == 1, what="the state's lease while its tool runs")
    while_the_tool_runs()
    proceed.set()
    thread.join(60)
    assert result["s"]["answer"] is not None
    wait_for(lambda: _leases(engine) == 0, what="the lease's release at the program's end")


def test_a_program_holds_a_lease_while_its_tool_runs_and_releases_it(tiny_engine):
    from braid import LocalBackend

    _run_agent(LocalBackend(tiny_engine), tiny_engine)


def test_a_program_that_raises_releases_its_lease(tiny_engine):
    from braid import LocalBackend

    at_tool = threading.Event()
    with pytest.raises(RuntimeError, match="the tool failed"):
        failing.run(at_tool, backend=LocalBackend(tiny_engine))
    assert at_tool.is_set()
    wait_for(lambda: _leases(tiny_engine) == 0, what="the failed program's release")


@program
def forks(s):
    s += "Two ideas:"
    branches = s.fork(2)
    for i, b in enumerate(branches):
        b += f" idea {i}:" + gen("idea", max_tokens=3)
    branches.join()
    s += " done" + gen("end", max_tokens=2)


def test_a_join_releases_its_branches(tiny_engine):
    from braid import LocalBackend

    s = forks.run(backend=LocalBackend(tiny_engine))
    assert len(s["idea"]) == 2
    wait_for(lambda: _leases(tiny_engine) == 0, what="every lease released")


class _NamingRemoteBackend(RemoteBackend):
    """A RemoteBackend that keeps the program ids its requests carry."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.programs: set[str] = set()

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.programs.add(program)
        return await super().generate(prompt, params, on_text, lora, program)


def test_leases_through_a_remote_backend(tiny_engine):
    import httpx

    server = LiveServer(tiny_engine)
    backend = _NamingRemoteBackend(server.url)

    def release(program: str, **scope) -> None:
        r = httpx.post(server.url + "/braid/release", json={"program_id": program, **scope})
        assert r.status_code == 200 and r.json() == {"released": program}, r.text
        # The engine thread takes the release before this request: the lease count after it
        # is the release's doing.
        tiny_engine.generate([7], SamplingParams(max_tokens=1))

    def foreign_releases() -> None:
        [ours] = backend.programs
        # Another client (another cache_salt) releasing our program id, and anyone releasing
        # an id no state holds: answered, and our lease stays.
        release(ours, cache_salt="other")
        release("no-such-program")
        assert _leases(tiny_engine) == 1

    try:
        _run_agent(backend, tiny_engine, foreign_releases)
    finally:
        server.stop()


# ---- constraints compiled ahead ----------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"tool": {"enum": ["search", "calc"]}, "n": {"type": "integer"}},
    "required": ["tool", "n"],
}


@program
def act(s, i: int):
    s += user(f"Task {i}: pick a tool.")
    s += assistant(gen("action", json_schema=SCHEMA, max_tokens=24))


def test_run_batch_with_one_schema_compiles_once(tiny_model_path):
    from braid import LocalBackend

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    try:
        states = act.run_batch([{"i": i} for i in range(64)], backend=LocalBackend(engine))
        assert all(isinstance(s["action"], str) for s in states)
        assert engine.stats()["grammar_compiles"] == 1
    finally:
        engine.shutdown()


@program
def slow_then_constrained(s, release: threading.Event):
    s += user("Say something.")
    s += assistant(gen("first", max_tokens=2))
    s += user("Now pick.")
    s += assistant(gen("action", json_schema={**SCHEMA, "title": "ahead"}, max_tokens=24))
    release.set()


def test_a_constraint_compiles_when_its_gen_is_submitted(tiny_engine, monkeypatch):
    """The second gen's constraint is sent to compile while the engine has not yet run a
    step of the first gen."""
    from braid import LocalBackend

    constrained = threading.Event()
    prepare = tiny_engine.prepare

    def recording(params):
        if params.constraint is not None:
            constrained.set()
        return prepare(params)

    monkeypatch.setattr(tiny_engine, "prepare", recording)
    done = threading.Event()
    with StepGate(tiny_engine, monkeypatch) as gate:
        thread = threading.Thread(
            target=slow_then_constrained.run,
            args=(done,),
            kwargs={"backend": LocalBackend(tiny_engine)},
            daemon=True,
        )
        thread.start()
        assert gate.waiting.wait(60)  # the first gen's step is held
        assert constrained.wait(60)
    thread.join(60)
    assert done.is_set()


def test_a_new_program_state_waits_while_leases_are_full_and_a_plain_request_does_not(
    tiny_model_path,
):
    """With leases over a third of their share and a request running, a program's new state
    waits (the running states need room to grow) while a plain request goes ahead; the new
    state starts once nothing runs."""
    import asyncio

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=1000)
    try:
        asyncio.run(_run(engine, _prompt(21, 400), "holder"))  # over half of 1000 * 0.75
        done: dict[str, threading.Event] = {k: threading.Event() for k in ("long", "new", "plain")}

        def finished(name):
            return lambda chunk: done[name].set() if chunk.finish_reason else None

        long = SamplingParams(max_tokens=300, ignore_eos=True, temperature=0)
        rid = engine.submit(_prompt(22, 10), long, finished("long"))
        wait_for(lambda: engine.stats()["running_requests"] == 1, what="the long request")
        new = SamplingParams(max_tokens=2, temperature=0)
        engine.submit(_prompt(23, 20), new, finished("new"), program="newcomer")
        engine.submit(_prompt(24, 20), new, finished("plain"))
        assert done["plain"].wait(60)
        assert not done["new"].is_set() and not done["long"].is_set()
        engine.abort(rid)
        assert done["new"].wait(60)
    finally:
        engine.shutdown()


def test_a_remote_backend_compiles_ahead_on_the_server(tiny_engine):
    server = LiveServer(tiny_engine)
    try:
        before = tiny_engine.stats()["grammar_compiles"]
        schema = {**SCHEMA, "title": "remote-ahead"}
        RemoteBackend(server.url).compile_ahead(SamplingParams(json_schema=schema))
        wait_for(
            lambda: tiny_engine.stats()["grammar_compiles"] == before + 1,
            what="the server's compile of the schema",
        )
    finally:
        server.stop()
