"""Engine: the public entry point to generation.

Callers (any thread) tokenize and validate their prompts, then enqueue requests for the
engine thread (loop.py), each with a RequestStream its chunks come back through; everything
else they ask of it (aborts, adapters, embeddings, cache flushes) goes there as a message too
(inbox.py).
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import functools
import itertools
import logging
import random
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from concurrent.futures import Future

import torch

from braid.grammars.constraints import JsonSchema, ToolCalls
from braid.grammars.phases import Phases
from braid.grammars.tool_calls import MARK
from braid.runtime.config import EngineConfig
from braid.runtime.constraint.service import GrammarService, Prepared
from braid.runtime.engine.core import build_core
from braid.runtime.engine.embedding import EmbedJob
from braid.runtime.engine.inbox import Abort, Add, Call, Embed, Flush, Release
from braid.runtime.engine.loop import EngineLoop
from braid.runtime.engine.request_stream import RequestStream
from braid.runtime.engine.scoring import score_requests
from braid.runtime.loading.model_loader import load_model_config, resolve_model_dir
from braid.runtime.loading.quantization import resolve_quantization
from braid.runtime.lora.adapter import LoraAdapter
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.output.detokenizer import IncrementalDetokenizer
from braid.runtime.output.stop import StopMatcher
from braid.runtime.protocol.outputs import GenerateOutput, StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.scheduler.request import Request
from braid.runtime.spec import SpecWorker
from braid.runtime.stats import EngineStats
from braid.runtime.text.reasoning import ReasoningFormat, detect, encode, prompt_opening
from braid.runtime.text.tokenizer import eos_token_ids, load_tokenizer

log = logging.getLogger(__name__)

Prompt = str | list[int]


class HealedPrompt(list):
    """A text prompt's token ids with token healing applied (Engine.heal): its last token
    taken off, and `healed`, the bytes it spelled, which the output's first tokens spell
    again. Given as a prompt, it runs so (a server heals where it counts a prompt's tokens)."""

    def __init__(self, ids: list[int], healed: bytes) -> None:
        super().__init__(ids)
        self.healed = healed


def capped_context(mc: ModelConfig, c: EngineConfig) -> ModelConfig:
    """`mc` with the engine's context: EngineConfig.context_length, at most the model's own
    max_position_embeddings (positions past it have no trained rotation)."""
    cap = c.context_length or mc.max_position_embeddings
    if cap > mc.max_position_embeddings:
        raise ValueError(
            f"EngineConfig.context_length {cap} is above the model's own context of "
            f"{mc.max_position_embeddings} tokens (max_position_embeddings); it only lowers it"
        )
    capped = dataclasses.replace(mc, context_length=cap)
    # Tensor-parallel ranks read the model's config again from its directory, so they would
    # rotate with the uncapped context's tables: refuse a cap that changes them (longrope).
    if c.tp > 1 and not _same_rope(capped, dataclasses.replace(mc, context_length=None)):
        raise ValueError(
            f"EngineConfig.context_length {cap} changes the model's rope factors, which "
            "tensor-parallel ranks do not follow; run it with tp=1"
        )
    return capped


def _same_rope(a: ModelConfig, b: ModelConfig) -> bool:
    (freq_a, scale_a), (freq_b, scale_b) = a.rope_inv_freq(), b.rope_inv_freq()
    return scale_a == scale_b and torch.equal(freq_a, freq_b)


class Engine:
    def __init__(
        self, model: str | None = None, lora_adapters: dict[str, str] | None = None, **config_fields
    ) -> None:
        """`lora_adapters`: name -> PEFT adapter directory, loaded at start (added to
        EngineConfig.lora's "name=path" entries)."""
        if lora_adapters:
            named = tuple(f"{name}={path}" for name, path in lora_adapters.items())
            config_fields["lora"] = (*config_fields.get("lora", ()), *named)
        config = EngineConfig(model=model, **config_fields)
        path = resolve_model_dir(config.model)
        # From here on the config says what runs: `auto` resolved (the dtype is resolved on
        # the engine thread, in self.dtype).
        quantization, self._quantization_why = resolve_quantization(config, path)
        self.config = c = dataclasses.replace(config, quantization=quantization)
        log.info("quantization %s (%s)", c.quantization, self._quantization_why)
        self.model_config = mc = capped_context(load_model_config(path), c)
        self.tokenizer = load_tokenizer(path)
        self.device = c.torch_device
        self.eos_token_ids = eos_token_ids(path, mc, self.tokenizer)
        self.context_length = mc.context_length
        template = self.tokenizer.chat_template
        # How the model marks its thoughts (None: it does not think, or was told not to).
        self.reasoning_format: ReasoningFormat | None = detect(
            self.tokenizer, template if isinstance(template, str) else None, c.reasoning_format
        )
        self._stats = EngineStats()
        self._rids = itertools.count()
        harmony = self.reasoning_format is not None and self.reasoning_format.kind == "harmony"
        self.grammars = GrammarService(self.tokenizer, self.eos_token_ids, c, harmony)
        build = functools.partial(build_core, path, mc, c, self.tokenizer, self._stats)
        # On the CPU the thread team shrinks to the cores other programs leave free;
        # tensor-parallel ranks split the cores between them already.
        self._loop = EngineLoop(build, share_cores=self.device.type == "cpu" and c.tp == 1)
        core = self._loop.core
        self.runner, self.dtype, self.tp_ranks = core.runner, core.dtype, core.tp_ranks
        self.kv, self.cache, self.scheduler = core.kv, core.cache, core.scheduler
        self.outputs, self.worker = core.outputs, core.worker
        self._speculation = core.speculation
        self._registry = core.adapters
        # Registered LoRA adapters by name: written on the engine thread only (load_lora,
        # unload_lora), read by callers to resolve a request's `lora`.
        self.adapters = self._registry.by_name
        _RUNNING.add(self)

    @property
    def model(self):
        return self.runner.model

    # ---- public API (any thread) -----------------------------------------------------

    def generate(
        self,
        prompt: Prompt | list[Prompt],
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora: str | None = None,
    ) -> GenerateOutput | list[GenerateOutput] | list[list[GenerateOutput]]:
        """Generate for one prompt (text or token ids) or a list of them; all of a list's
        prompts run concurrently. With params.n > 1 each prompt gives a list of n outputs.

        Requests share cached prefixes only with requests of the same `cache_salt` (None:
        those without one), so a salt per client keeps each client's prompts from showing
        in another's cached token counts or timing.

        `lora`: the name of a loaded LoRA adapter to generate with (None: the base model);
        prefixes are cached per adapter too."""
        params = params or SamplingParams()
        many = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
        prompts = prompt if many else [prompt]
        encoded = [self.prompt_ids(p, params) for p in prompts]  # all checked before any runs
        adapter = self.adapter(lora)
        prepared = self.prepare(params).result()  # raises for a bad constraint
        groups = [
            self._enqueue(ids, params, prepared, priority, cache_salt, adapter, healed=healed)
            for ids, healed in encoded
        ]
        outs = [[s.result() for s in group] for group in groups]
        outs = [group if params.n > 1 else group[0] for group in outs]
        return outs if many else outs[0]

    async def ascore(
        self,
        prefix: str,
        continuations: list[str],
        cache_salt: str | None = None,
        lora: str | None = None,
    ) -> list[list[float]]:
        """For each continuation, the logprobs of its tokens after `prefix`, all counted from
        the first token position where any of them departs from the prefix's tokens (one
        request per continuation, under `cache_salt` and `lora`; see scoring.py). Tokenizing
        runs in a thread."""
        adapter = self.adapter(lora)
        leaves = await asyncio.to_thread(self.score_leaves, prefix, continuations)
        return await self._score(leaves, cache_salt, adapter)

    def score_leaves(
        self, prefix: str, continuations: list[str]
    ) -> list[tuple[list[int], SamplingParams]]:
        """ascore's requests, tokenized and checked: each continuation is tokenized with the
        prefix, work in proportion to both, for a thread rather than an event loop."""
        requests = score_requests(self.tokenizer, self.eos_token_ids, prefix, continuations)
        return [(self.encode(ids), params) for ids, params in requests]

    async def ascore_leaves(
        self,
        leaves: list[tuple[list[int], SamplingParams]],
        cache_salt: str | None = None,
        lora: str | None = None,
    ) -> list[list[float]]:
        """Run score_leaves' requests, at most a quarter of max_running_requests at once. The
        scheduler matches every waiting leaf against the shared prefix each step (a cost in
        proportion to both), and leaves all queued at once came before everyone else's
        requests: many choices share the steps instead."""
        return await self._score(leaves, cache_salt, self.adapter(lora))

    async def _score(
        self,
        leaves: list[tuple[list[int], SamplingParams]],
        cache_salt: str | None,
        adapter: LoraAdapter | None,
    ) -> list[list[float]]:
        window = max(1, self.config.max_running_requests // 4)
        outs = await self._run_leaves(leaves, 0, cache_salt, adapter, window)
        return [out.meta["prompt_logprobs"] for out in outs]

    async def _run_leaves(
        self,
        leaves: list[tuple[list[int], SamplingParams]],
        priority: int,
        cache_salt: str | None,
        adapter: LoraAdapter | None = None,
        window: int | None = None,
    ) -> list[GenerateOutput]:
        """Submit the leaves and wait for them all. With a `window` the first runs alone (it
        computes the prefix the others share, which the radix cache keeps) and then at most
        `window` are in the engine at once. A caller cancelled meanwhile aborts those it
        submitted and still waits until the engine has ended them, so that whoever admitted
        the work (the server's queue limit) counts it until then."""
        loop = asyncio.get_running_loop()
        prepared = await asyncio.gather(
            *(asyncio.wrap_future(self.prepare(params)) for _, params in leaves)
        )
        streams: list[RequestStream] = []
        outputs: list[asyncio.Task[GenerateOutput]] = []  # one per stream, not the caller's
        try:
            for i, ((ids, params), p) in enumerate(zip(leaves, prepared, strict=True)):
                if window is not None and (i == 1 or i > window):
                    # asyncio.wait never cancels what it waits for.
                    await asyncio.wait({outputs[0 if i == 1 else i - window]})
                streams += self._enqueue(ids, params, p, priority, cache_salt, adapter, loop)
                outputs.append(asyncio.ensure_future(streams[-1].output()))
            if outputs:
                await asyncio.wait(outputs)
        except asyncio.CancelledError:  # the caller left: its requests go too
            for stream in streams:
                self.abort(stream.rid)
            if outputs:
                await asyncio.wait(outputs)
            raise
        return [task.result() for task in outputs]

    async def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        on_submit: Callable[[int], None] | None = None,
        cache_salt: str | None = None,
        lora: str | None = None,
        program: str | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Yield chunks of new text as they are generated; leaving early aborts the request.
        `on_submit(request id)` once it is queued: a caller that aborts it by that id reads
        on to its last chunk (finish_reason "abort", with its counts). `cache_salt`, `lora`:
        see `generate`. `program`: the id of the program state sending it, which is leased
        the prefix the request computes until its next request or `release_program`."""
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError("stream() takes n=1; call it once per sample")
        ids, healed = self.prompt_ids(prompt, params)
        adapter = self.adapter(lora)
        prepared = await asyncio.wrap_future(self.prepare(params))
        loop = asyncio.get_running_loop()
        [stream] = self._enqueue(
            ids, params, prepared, priority, cache_salt, adapter, loop, None, program, healed
        )
        if on_submit is not None:
            on_submit(stream.rid)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            if not stream.finished:
                self.abort(stream.rid)

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams,
        emit: Callable[[StreamChunk], None],
        priority: int = 0,
        cache_salt: str | None = None,
        lora: str | None = None,
        program: str | None = None,
    ) -> int:
        """Queue one request (n=1); `emit` gets its chunks on the engine thread. Returns its id.
        `cache_salt`, `lora`: see `generate`; `program`: see `stream`.

        A constrained request's grammar is compiled first (blocking this caller, not the
        engine), so a bad constraint raises here."""
        if params.n != 1:
            raise ValueError("submit() takes n=1")
        ids, healed = self.prompt_ids(prompt, params)
        adapter = self.adapter(lora)
        prepared = self.prepare(params).result()
        [stream] = self._enqueue(
            ids, params, prepared, priority, cache_salt, adapter, None, emit, program, healed
        )
        return stream.rid

    def abort(self, rid: int) -> None:
        """Stop a request; it ends with finish_reason "abort" and its KV is freed."""
        self._loop.post(Abort(rid))

    def release_program(
        self, program: str, cache_salt: str | None = None, lora: str | None = None
    ) -> None:
        """Program state `program` (under `cache_salt` and `lora`, as its requests) will not
        continue: its leased prefix becomes an ordinary cache entry. Returns at once."""
        key = (_namespace(self.adapter(lora), cache_salt), program)
        self._loop.post(Release(key))

    def flush_cache(self) -> None:
        """Drop every prefix cached in the radix tree that no running request uses; returns
        once the engine thread has done it."""
        done = threading.Event()
        self._loop.post(Flush(done))
        done.wait()

    def adapter(self, name: str | None) -> LoraAdapter | None:
        """The loaded LoRA adapter called `name` (None for None); ValueError naming the
        loaded ones otherwise."""
        return self._registry.get(name)

    def load_lora(self, name: str, path: str) -> None:
        """Load a PEFT LoRA adapter directory under `name` (ValueError if the name is taken
        or the adapter is not one this engine can serve); returns once requests may use it."""
        self._on_engine_thread(functools.partial(self._registry.register, name, path))

    def unload_lora(self, name: str) -> None:
        """Forget the adapter `name`; ValueError while a queued or running request uses it.
        Its cached prefixes are never matched again and go when the cache needs room."""
        self._on_engine_thread(functools.partial(self._registry.unregister, name))

    def _on_engine_thread(self, job: Callable[[], None]) -> None:
        done: Future[None] = Future()
        self._loop.post(Call(job, done))
        done.result()

    def embed(self, ids_list: list[list[int]]) -> list[list[float]]:
        """Each token list's embedding: the model's final normed hidden states mean-pooled
        over its tokens, L2-normalized (what llama.cpp's server gives for a generative
        model). Computed on the engine thread between generation steps, a group of inputs at
        a time; raises ValueError for an empty list, an id outside the vocabulary, or a list
        longer than the context or the KV pool."""
        return self._embed(ids_list).result()

    async def aembed(self, ids_list: list[list[int]]) -> list[list[float]]:
        """`embed` for asyncio callers; cancelling it drops the inputs not yet embedded."""
        return await asyncio.wrap_future(self._embed(ids_list))

    def _embed(self, ids_list: list[list[int]]) -> Future[list[list[float]]]:
        if not ids_list:
            raise ValueError("no inputs to embed")
        vocab = self.model_config.vocab_size
        for i, ids in enumerate(ids_list):
            if not ids:
                raise ValueError(f"input[{i}] is empty")
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"input[{i}]: token ids must be ints in [0, {vocab}); got {bad[:5]}"
                )
            if len(ids) > self.context_length:
                raise ValueError(
                    f"input[{i}] has {len(ids)} tokens; the model's context is "
                    f"{self.context_length} tokens"
                )
            if len(ids) > self.kv.num_slots:
                raise ValueError(
                    f"input[{i}] has {len(ids)} tokens; the KV pool holds {self.kv.num_slots} "
                    "(raise max_kv_tokens or kv_cache_gb)"
                )
        job = EmbedJob(ids_list, self.config.max_batch_tokens)
        self._loop.post(Embed(job))
        return job.done

    def describe(self) -> str:
        """What runs, in one line: weights, activations, device, speculation (for logs and the
        CLI)."""
        c = self.config
        weights = {
            "none": "weights as stored",
            "gguf": "GGUF blocks",
            "int8": "int8 blocks",
            "int4": "int4 blocks",
        }[c.quantization]
        return (
            f"{weights} (quantization={c.quantization}: {self._quantization_why}), "
            f"{str(self.dtype).removeprefix('torch.')} activations on {self.device}"
            + (f", tp={c.tp}" if c.tp > 1 else "")
            + f", {self._speculation}"
        )

    def stats(self) -> dict:
        # The engine thread settles counters and KV before a request leaves the scheduler, so
        # the request counts are read first: "nothing running" implies the rest is settled.
        running, waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        out = self._stats.snapshot()
        out.update(
            kv_slots_total=self.kv.num_slots,
            kv_slots_free=self.kv.num_free_slots,
            kv_slots_cached=self.cache.num_cached_tokens,
            kv_slots_leased=self.cache.num_leased_tokens,
            program_leases=len(self.cache.leases),
            running_requests=running,
            waiting_requests=waiting,
            lora_adapters_loaded=self._registry.memory.num_held,
            lora_adapter_reloads=self._registry.memory.num_reloads,
            **self.grammars.stats(),
        )
        draft = self.worker.proposer if isinstance(self.worker, SpecWorker) else None
        if draft is not None and draft.kv is not None:  # its own pool: empty once all are done
            out.update(
                draft_kv_slots_total=draft.kv.num_slots, draft_kv_slots_free=draft.kv.num_free_slots
            )
        return out

    def shutdown(self) -> None:
        """Abort what is queued or running and stop the engine thread (at exit, if the
        program has not)."""
        if not self._loop.stop():  # shut down already
            return
        _RUNNING.discard(self)
        self.grammars.close()
        if self.runner.ranks is not None:
            self.runner.ranks.close()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt, checked against the vocabulary and the context length."""
        if isinstance(prompt, str):
            longest = self.context_length * self.longest_token_chars
            if len(prompt) > longest:  # refused without paying to tokenize it
                raise ValueError(
                    f"prompt has {len(prompt)} characters; no token spells more than "
                    f"{self.longest_token_chars}, so it cannot fit the model's context of "
                    f"{self.context_length} tokens"
                )
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            ids = list(prompt)
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be ints in [0, {vocab}); got {bad[:5]}")
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.context_length:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's context is {self.context_length} "
                f"tokens, so at most {self.context_length - 1} fit with room to generate"
            )
        if len(ids) >= self.kv.num_slots:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the KV pool holds {self.kv.num_slots} "
                "(raise max_kv_tokens or kv_cache_gb)"
            )
        return ids

    def prompt_ids(self, prompt: Prompt, params: SamplingParams) -> tuple[list[int], bytes]:
        """The token ids a request's prompt is prefilled with, and the bytes token healing
        took off its end (b"": none), which the output's first tokens spell again and its
        text leaves out (grammars/token_healing.py)."""
        if isinstance(prompt, HealedPrompt):
            return list(prompt), prompt.healed
        ids = self.heal(prompt, self.encode(prompt), params)
        return list(ids), getattr(ids, "healed", b"")

    def heal(self, prompt: Prompt, ids: list[int], params: SamplingParams) -> list[int]:
        """`ids`, the tokens of `prompt`, healed where params.token_healing asks for it and
        there is something to heal (a HealedPrompt), else as they are.

        Only a text prompt is healed, and not where the output thinks first (the boundary is
        the thought's, not the text's), where prompt logprobs are asked for (they are of the
        prompt as given), or over an added token (chat markers: template text)."""
        if not (
            params.token_healing
            and isinstance(prompt, str)
            and not params.reasoning
            and params.prompt_logprobs_from is None
            and params.max_tokens > 0
            and ids[-1] not in self.tokenizer.added_tokens_decoder
        ):
            return ids
        healed = self.grammars.healing_index.heals(ids)
        return HealedPrompt(ids[:-1], healed) if healed else ids

    def prepare(self, params: SamplingParams) -> Future[Prepared]:
        """Check the params against the model (raises ValueError now) and compile their
        constraint and stop regexes off the caller's and the engine's threads, in the bounded
        compile workers; the future raises ValueError for a bad or too costly one. Results
        are cached, so a server may prepare before it answers and submit afterwards."""
        vocab = self.model_config.vocab_size
        for field, ids in (
            ("stop_token_ids", params.stop_token_ids),
            ("logit_bias", params.logit_bias),
        ):
            bad = [t for t in ids or () if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{field} token ids must be in [0, {vocab}); got {bad[:5]}")
        if params.reasoning and self.reasoning_format is None:
            raise ValueError(
                "reasoning: this model has no reasoning format (its tokenizer and chat template "
                "show no think tags or harmony channels; --reasoning-format names one)"
            )
        return self.grammars.prepare(params)

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """An upper bound on the characters one token stands for: the longest token string
        (byte-level and sentencepiece token strings are at least as long as their text)."""
        return max(len(t) for t in self.tokenizer.get_vocab())

    # ---- submission: every way in above ends here ------------------------------------

    def _enqueue(
        self,
        ids: list[int],
        params: SamplingParams,
        prepared: Prepared,
        priority: int,
        cache_salt: str | None,
        adapter: LoraAdapter | None,
        loop: asyncio.AbstractEventLoop | None = None,
        on_chunk: Callable[[StreamChunk], None] | None = None,
        program: str | None = None,
        healed: bytes = b"",
    ) -> list[RequestStream]:
        """Queue params.n requests for the engine thread; each one's chunks come back through
        its stream (to an asyncio consumer on `loop`, to `on_chunk`, or to a blocking one).
        `healed`: the bytes token healing took off the prompt (see prompt_ids)."""
        base_seed = params.seed if params.seed is not None else random.getrandbits(62)
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        namespace = _namespace(adapter, cache_salt)
        leases = self.config.program_leases and self.config.prefix_cache
        grammar = prepared.grammar
        phases = self._phases(ids, params, stop_ids) if params.reasoning else None
        keep_special = phases is not None and self.reasoning_format.special
        streams = []
        for i in range(params.n):
            stream = RequestStream(next(self._rids), loop, on_chunk)
            r = Request(
                rid=stream.rid,
                prompt_ids=ids,
                params=params,
                seed=base_seed + i,
                emit=stream.put,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer, ids, keep_special, given=healed.decode()
                ),
                stop_matcher=StopMatcher(params.stop_strings, prepared.stop_regexes),
                stop_ids=frozenset(stop_ids),
                max_new_tokens=min(params.max_tokens, self.context_length - len(ids)),
                priority=priority,
                cache_namespace=namespace,
                lora=adapter,
                lease_key=(namespace, program) if leases and program is not None else None,
                constraint=(
                    self.grammars.constraint(grammar, phases, healed)
                    if grammar is not None or phases is not None or healed
                    else None
                ),
            )
            self._loop.post(Add(r))
            streams.append(stream)
        return streams

    def _phases(self, ids: list[int], params: SamplingParams, stop_ids: set[int]) -> Phases:
        """A reasoning request's phases: where its prompt leaves the model, its markers, and
        its budget. A format's answer header is forced only where the answer is held to
        something (a constraint or a budget); a free answer after a free thought is the
        model's to open. A call marker that is one token closes a thought (Qwen3's)."""
        fmt = self.reasoning_format
        budget = params.thinking_budget
        soft = budget is not None and params.thinking_budget_mode == "soft"
        constraint = params.constraint
        calls = isinstance(constraint, ToolCalls)
        answer_ids: tuple[int, ...] = ()
        direct_ids: tuple[int, ...] = ()
        if constraint is not None or budget is not None:  # else the model opens its answer
            kind = "calls" if calls else "json" if isinstance(constraint, JsonSchema) else "text"
            answer_ids, direct_ids = (encode(self.tokenizer, h) for h in fmt.headers(kind))
        closers: frozenset[int] = frozenset()
        if calls and fmt.kind == "think":
            mark = encode(self.tokenizer, MARK)
            if len(mark) == 1:  # Qwen3's <tool_call>
                closers = frozenset(mark)
        return Phases(
            opening=prompt_opening(fmt, self.tokenizer, ids),
            start_ids=fmt.start_ids,
            end_ids=fmt.end_ids,
            answer_ids=answer_ids,
            direct_ids=direct_ids,
            closer_ids=closers,
            excluded=frozenset(stop_ids),
            budget=budget,
            soft_from=budget - budget // 5 if soft else None,
            guard=self.grammars.marker_guard(fmt.end),
        )


def _namespace(adapter: LoraAdapter | None, cache_salt: str | None) -> Hashable:
    """The radix cache namespace of a request: an adapter changes every KV, so its prefixes
    are its own (per load)."""
    return cache_salt if adapter is None else (adapter.serial, cache_salt)


# Engines not shut down yet. Their thread is a daemon, so a program that never calls shutdown
# still exits; but a daemon thread inside a torch op when the interpreter finalizes is ended
# by pthread_exit as it takes the GIL back, which unwinds C++ frames that may not be unwound:
# `terminate called without an active exception` (exit code 134). atexit runs before that,
# while the thread can still finish its step and stop. The set holds them strongly: an engine
# its program dropped without shutdown still runs (its thread holds the core), and must stop.
_RUNNING: set[Engine] = set()


@atexit.register
def _shutdown_running() -> None:
    for engine in list(_RUNNING):
        engine.shutdown()
