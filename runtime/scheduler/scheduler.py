"""Scheduler: continuous batching with chunked or hybrid prefill, priorities and preemption.

It owns every request from admission to finish, and is the one writer of its lifecycle:
queues, KV slots, `num_computed`, finishing. Each step it picks which requests feed how many
tokens, within a token budget, and makes sure their KV slots exist (evicting cached
prefixes, then preempting) before the forward; a request that cannot fit the pool even alone
leaves with the batch (`Batch.out_of_kv`). After the step, `postprocess` counts what the
forward computed (and which draft nodes speculation kept) and finishes the requests whose
last chunk output processing made: a finished request gives its KV to the cache, leased to
its program state when it names one (runtime/kvcache/leases.py).

Others that need KV slots ask it: speculation for draft tree nodes (`reserve`) and for the
draft model's own pool (`resize_draft`, `grow_draft`), embeddings for a turn's inputs
(`lend`, `take_back`).

Under pressure, cached prefixes go in this order: unleased ones (LRU), then leases, least
urgent first, before any running request is preempted. The first request of a program state
waits rather than break the leases of states that will continue, unless nothing runs, and
waits while leases hold a third of what they may (the states that run need room to grow): the
programs that run are the ones whose context fits. A plain request (no program) breaks
leases as it needs, so leases never hold it up.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import torch

from braid.runtime.config import EngineConfig
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.kvcache.radix_cache import RadixCache, common_prefix_length
from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.scheduler.batch import Batch
from braid.runtime.scheduler.request import Request, Status
from braid.runtime.stats import EngineStats

# A waiting request whose prompt shares at least this many not-yet-cached tokens with a
# request that is prefilling now waits for that prefill to reach the cache instead of
# computing the same tokens again. Shorter overlaps (a BOS token, a role header) are cheaper
# to recompute than to wait a step for.
MIN_SHARED_TOKENS = 8


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        kv: KVPool,
        cache: RadixCache,
        stats: EngineStats,
        draft_kv: KVPool | None = None,
    ) -> None:
        """`draft_kv`: a draft model's own pool (speculation with a draft model)."""
        self.config = config
        self.kv = kv
        self.cache = cache
        self.draft_kv = draft_kv
        self.stats = stats  # steps, computed tokens, preemptions and evictions count here
        self.live: dict[int, Request] = {}  # every request admitted and not yet finished
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._out_of_kv: list[Request] = []  # found while scheduling; leave with the batch
        self._last_step_prefilled = False  # for prefill_mode="chunked"

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request) -> None:
        """A new request joins the queue."""
        self.live[req.rid] = req
        self._enqueue(req)

    def schedule(self) -> Batch:
        """The next step's batch: the requests that feed tokens (none when nothing can run),
        and those that had to leave for want of KV."""
        batch = self._batch()
        if not batch.requests and self.waiting and not self.running:
            # Nothing runs to free KV, so the first waiting request cannot fit even alone.
            self._out_of_kv.append(self.waiting[0])
        batch.out_of_kv, self._out_of_kv = self._out_of_kv, []
        return batch

    def _batch(self) -> Batch:
        decodes = [r for r in self.running if r.is_decoding]
        budget = self.config.max_batch_tokens
        if self.config.prefill_mode == "chunked":
            # Prefill-only and decode-only steps alternate while both have work.
            if not (decodes and self._last_step_prefilled):
                batch = Batch()
                self._add_prefills(batch, budget)
                if batch.requests:
                    self._last_step_prefilled = True
                    return batch
            self._last_step_prefilled = False
            return self._decode_batch(decodes)
        # Hybrid: every running decode gets its token, prefill chunks fill the rest.
        batch = self._decode_batch(decodes)
        self._add_prefills(batch, budget - len(batch.requests))
        return batch

    def _decode_batch(self, decodes: list[Request]) -> Batch:
        batch = Batch()
        for r in self._reserve_decode_slots(decodes):
            batch.add(r, 1, is_prefill=False)
        return batch

    def postprocess(
        self,
        batch: Batch,
        kept_nodes: Sequence[list[int]],
        updates: Iterable[tuple[Request, StreamChunk]],
    ) -> None:
        """The step ran: count each request's fed tokens as computed (and, for a request with
        a draft tree, the `kept_nodes` speculation followed), put a prefill's progress into
        the radix cache now, not at its finish, since others may be waiting for that prefix;
        then finish the requests whose last chunk is among `updates`."""
        num_decodes = 0
        for i, r in enumerate(batch.requests):
            r.num_computed += batch.num_known(i)
            if batch.is_prefill[i]:
                self._cache_prefill_progress(r)
            else:
                num_decodes += 1
            if (draft := batch.draft(i)) is not None:
                self._keep_draft_nodes(r, kept_nodes[i], len(draft))
        num_known = sum(map(batch.num_known, range(len(batch.requests))))
        self.stats.add(
            forward_steps=1,
            prefill_tokens_computed=num_known - num_decodes,
            decode_tokens=num_decodes,
        )
        self.finish_ended(updates)

    def finish_ended(self, updates: Iterable[tuple[Request, StreamChunk]]) -> None:
        """Finish each request whose last chunk is among `updates` (its finish_reason set)."""
        for r, chunk in updates:
            if chunk.finish_reason is not None:
                self.finish(r, chunk.finish_reason)

    def finish(self, req: Request, reason: str) -> None:
        """A finished or aborted request gives its KV to the cache and leaves; the prefix it
        computed is leased to its program state, if it names one."""
        if req.status is Status.FINISHED:
            return
        req.finish_reason = reason
        self._release_draft(req)
        if req in self.running:
            computed = req.token_ids[: req.num_computed]
            self._release(req)  # before leaving `running`: see Engine.stats
            self.running.remove(req)
            if req.lease_key is not None:
                self.cache.lease(
                    req.lease_key,
                    computed,
                    req.cache_namespace,
                    self.config.lease_ttl_s,
                    int(self.config.max_leased_fraction * self.kv.num_slots),
                )
        elif req in self.waiting:
            self._dequeue(req)
        self.live.pop(req.rid, None)
        req.status = Status.FINISHED

    def release_lease(self, key: Hashable) -> None:
        """Program state `key` will not continue: its prefix is an ordinary cache entry."""
        self.cache.release(key)

    def reserve(self, r: Request, n: int) -> bool:
        """n more slots for running request r this step (a draft tree's nodes), found by
        evicting cached prefixes but never by preempting; False when they cannot be."""
        if not self._make_room(n):
            return False
        r.add_slots(self.kv.allocate(n))
        return True

    def lend(self, n: int) -> torch.Tensor | None:
        """n slots for work outside the requests (an embedding turn), found by evicting
        cached prefixes; None when they cannot be. Hand them back with `take_back` before the
        next step."""
        return self.kv.allocate(n) if self._make_room(n) else None

    def take_back(self, slots: torch.Tensor) -> None:
        self.kv.free(slots)

    def resize_draft(self, r: Request, keep: int, grow: int, headroom: int) -> bool:
        """r's draft-model slots: the first `keep` kept, `grow` more added, when the draft
        pool has room for `grow + headroom` (the draft steps to come); otherwise all of them
        go and False."""
        self.draft_kv.free(r.draft_slots[keep:])
        r.draft_slots = r.draft_slots[:keep]
        if not self.draft_kv.can_allocate(grow + headroom):
            self._release_draft(r)
            return False
        r.draft_slots = torch.cat([r.draft_slots, self.draft_kv.allocate(grow)])
        return True

    def grow_draft(self, r: Request) -> bool:
        """One more draft-model slot for r, if the draft pool has one free."""
        if not self.draft_kv.can_allocate(1):
            return False
        r.draft_slots = torch.cat([r.draft_slots, self.draft_kv.allocate(1)])
        return True

    def _release_draft(self, r: Request) -> None:
        if r.draft_slots.numel():
            self.draft_kv.free(r.draft_slots)
            r.draft_slots = r.draft_slots[:0]
            r.spec.draft_ids = []

    def _make_room(self, n: int, break_leases: bool = True) -> bool:
        """Ensure n free slots, evicting unused cached prefixes if needed (leased ones only
        if `break_leases`)."""
        if not self.kv.can_allocate(n):
            need = n - self.kv.num_free_slots
            self.stats.add(evicted_tokens=self.cache.evict(need, break_leases))
        return self.kv.can_allocate(n)

    def _cache_prefill_progress(self, req: Request) -> None:
        """Put a partly prefilled request's computed tokens into the radix cache now, so a
        request waiting on the same prefix can use them (and swap our duplicate slots for
        the cache's if another request got there first)."""
        if not self.cache.enabled:
            return
        fed = req.num_computed
        tokens = req.token_ids[:fed]
        self.cache.insert(tokens, req.slots[:fed], req.cache_namespace)
        prefix, node = self.cache.match_prefix(tokens, req.cache_namespace)
        self.cache.lock(node)
        self.cache.unlock(req.cache_node)
        req.slots = torch.cat([prefix, req.slots[fed:]])  # (copied in: no aliasing)
        req.cache_node, req.num_tree_slots = node, fed

    def _keep_draft_nodes(self, r: Request, kept: list[int], num_nodes: int) -> None:
        """Of the draft tree's nodes (their slots follow r's computed ones), the `kept` ones,
        whose tokens speculation appended, are computed now; the others' slots go back to the
        pool, so rejected tokens never reach the radix cache."""
        start = r.num_computed
        nodes = r.slots[start : start + num_nodes].clone()
        unused = torch.ones(num_nodes, dtype=torch.bool)
        unused[kept] = False
        self.kv.free(nodes[unused])
        r.keep_slots(start)
        r.add_slots(nodes[kept])
        r.num_computed = start + len(kept)

    def _reserve_decode_slots(self, decodes: list[Request]) -> list[Request]:
        """One new slot per decoding request; preempt the least important when KV runs out."""
        while decodes and not self._make_room(len(decodes)):
            if len(self.running) == 1:  # alone and still too long for the whole pool
                self._out_of_kv.append(decodes.pop())
                break
            victim = self._victim(self.running)
            self._preempt(victim)
            if victim in decodes:
                decodes.remove(victim)
        if decodes:  # one allocation for all of them: per request it cost more than the cat
            for r, slot in zip(decodes, self.kv.allocate(len(decodes)).split(1), strict=True):
                r.add_slots(slot)
        return decodes

    def _add_prefills(self, batch: Batch, budget: int) -> None:
        # Requests already part-way through their prefill continue first.
        for r in self.running:
            if budget <= 0:
                return
            if r.is_decoding or r in batch.requests:
                continue
            n = min(r.num_uncomputed, budget, self.config.chunk_size)
            if not self._make_room(n):
                return
            r.add_slots(self.kv.allocate(n))
            batch.add(r, n, is_prefill=True)
            budget -= n
        for r in self._admission_order():
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                return
            if self._new_state(r) and self.running and self._leases_full():
                continue  # the program states that run need room to grow
            cacheable = r.token_ids[: r.max_cached_prefix]
            if self._waits_for_shared_prefix(
                r, self.cache.cached_length(cacheable, r.cache_namespace)
            ):
                continue
            if not self._admit(r, cacheable, batch, budget):
                return
            budget -= batch.num_new[-1]

    def _admission_order(self) -> list[Request]:
        if self.config.schedule_policy == "lpm":
            # Longest cached prefix first: those requests cost least to start and keep the
            # cache entries they use warm.
            def key(r: Request):
                cacheable = r.token_ids[: r.max_cached_prefix]
                cached = self.cache.cached_length(cacheable, r.cache_namespace)
                return (-r.priority, r.lease_key not in leases, -cached, r.arrival)
        else:

            def key(r: Request):
                return (-r.priority, r.lease_key not in leases, r.arrival)

        # States that will continue (they hold a lease) go before new ones.
        leases = self.cache.leases
        return sorted(self.waiting, key=key)

    def _admit(self, r: Request, cacheable: list[int], batch: Batch, budget: int) -> bool:
        """Start r over the cached prefix of `cacheable` with a first chunk."""
        prefix, node = self.cache.match_prefix(cacheable, r.cache_namespace)
        self.cache.lock(node)  # keep our prefix out of the eviction below
        n = min(r.num_tokens - prefix.numel(), budget, self.config.chunk_size)
        # A new program state breaks no leases unless nothing runs (which could free room);
        # a plain request or a leased state may break them.
        break_leases = not (self._new_state(r) and self.running)
        while not self._make_room(n, break_leases):
            # Only requests outside this step's batch can give their slots back now.
            lower = [
                x
                for x in self.running
                if x.priority < r.priority and all(x is not y for y in batch.requests)
            ]
            victim = self._victim(lower)
            if victim is None:
                self.cache.unlock(node)
                return False
            self._preempt(victim)
        r.slots = prefix
        r.add_slots(self.kv.allocate(n))
        r.num_computed = r.num_tree_slots = prefix.numel()
        r.cache_node = node
        if r.num_preemptions == 0:
            # The prefix may reach past the prompt into output a grammar forced at admission.
            r.num_cached_prompt_tokens = min(prefix.numel(), len(r.prompt_ids))
        r.status = Status.RUNNING
        self._dequeue(r)
        self.running.append(r)
        batch.add(r, n, is_prefill=True)
        return True

    def _new_state(self, r: Request) -> bool:
        """Is r from a program state that holds no lease (its first request, or its lease
        was broken)?"""
        return r.lease_key is not None and r.lease_key not in self.cache.leases

    def _leases_full(self) -> bool:
        """Do leases hold more than a third of what they may? New program states then wait:
        those that run would otherwise break each other's leases as they grow."""
        limit = self.config.max_leased_fraction / 3 * self.kv.num_slots
        return self.cache.num_leased_tokens > limit

    def _waits_for_shared_prefix(self, r: Request, cached: int) -> bool:
        """Is a prefix of r that the cache lacks (past its `cached` tokens) being prefilled
        right now by another request of its namespace? (Another namespace's prefill is never
        shared; waiting for it would make r's first token late only when r's prompt matches
        another client's, which would tell r's client what that prompt holds.)"""
        if not self.cache.enabled:
            return False
        return any(
            common_prefix_length(r.token_ids, x.token_ids) - cached >= MIN_SHARED_TOKENS
            for x in self.running
            if not x.is_decoding and x.cache_namespace == r.cache_namespace
        )

    def _victim(self, candidates: list[Request]) -> Request | None:
        """Lowest priority first, then the latest arrival (it has the least work to lose)."""
        return min(candidates, key=lambda r: (r.priority, -r.arrival), default=None)

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self._release(r)
        if not r.output_ids:  # its prompt logprobs are computed again with its prompt
            r.prompt_logprobs.clear()
            r.prompt_top_logprobs.clear()
        r.num_preemptions += 1
        self.stats.add(preemptions=1)
        self._enqueue(r)

    def _enqueue(self, r: Request) -> None:
        r.status = Status.WAITING
        self.waiting.append(r)
        if r.lease_key is not None:
            self.cache.leases.queue(r.lease_key, +1)

    def _dequeue(self, r: Request) -> None:
        self.waiting.remove(r)
        if r.lease_key is not None:
            self.cache.leases.queue(r.lease_key, -1)

    def _release(self, r: Request) -> None:
        fed = r.num_computed
        self.cache.insert(r.token_ids[:fed], r.slots[:fed], r.cache_namespace)
        if r.slots.numel() > fed:  # allocated for a step that never ran
            self.kv.free(r.slots[fed:])
        self.cache.unlock(r.cache_node)
        r.keep_slots(0)
        r.cache_node, r.num_computed, r.num_tree_slots = None, 0, 0
