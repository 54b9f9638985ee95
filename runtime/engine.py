"""Engine: the public entry point to generation.

This first version runs one request at a time under a lock; the scheduler (continuous
batching over the same KV pool and ForwardBatch) replaces `_run` without changing the API.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import AsyncIterator, Iterator

import torch

from runtime.config import EngineConfig
from runtime.detokenizer import IncrementalDetokenizer
from runtime.forward_batch import ForwardBatch
from runtime.kv_cache import KVPool
from runtime.model_loader import load_model, load_model_config, resolve_model_dir
from runtime.outputs import GenerateOutput, StreamChunk
from runtime.sampler import sample, step_seed
from runtime.sampling_params import SamplingParams
from runtime.stop import StopStringMatcher
from runtime.tokenizer import eos_token_ids, load_tokenizer

log = logging.getLogger(__name__)

Prompt = str | list[int]


class Engine:
    def __init__(self, model: str | None = None, **config_fields) -> None:
        self.config = EngineConfig(model=model, **config_fields)
        path = resolve_model_dir(self.config.model)
        self.model_config = load_model_config(path)
        self.tokenizer = load_tokenizer(path)
        self.device, dtype = self.config.torch_device, self.config.torch_dtype
        self.model = load_model(path, self.model_config, dtype, self.device)
        mc = self.model_config
        per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, dtype)
        num_slots = self.config.kv_pool_tokens(per_token)
        self.kv = KVPool(mc.num_layers, num_slots, mc.num_kv_heads, mc.head_dim, dtype, self.device)
        log.info(
            "KV pool: %d tokens (%.2f GB, %s, %s)",
            num_slots,
            num_slots * per_token / 1024**3,
            dtype,
            self.device,
        )
        self.eos_token_ids = eos_token_ids(path, mc, self.tokenizer)
        self.context_length = mc.max_position_embeddings
        self._lock = threading.Lock()

    def generate(
        self, prompt: Prompt | list[Prompt], params: SamplingParams | None = None
    ) -> GenerateOutput | list[GenerateOutput]:
        """Generate for one prompt (text or token ids) or a list of them."""
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return [self.generate(p, params) for p in prompt]
        params = params or SamplingParams()
        ids = self.encode(prompt)
        text, token_ids, finish = [], [], "abort"
        for chunk in self._run(ids, params):
            text.append(chunk.text)
            token_ids.extend(chunk.token_ids)
            finish = chunk.finish_reason or finish
        meta = {"prompt_tokens": len(ids), "completion_tokens": len(token_ids)}
        return GenerateOutput("".join(text), token_ids, finish, meta)

    async def stream(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> AsyncIterator[StreamChunk]:
        """Yield chunks of new text as they are generated."""
        ids = self.encode(prompt)
        chunks = self._run(ids, params or SamplingParams())
        done = object()
        try:
            while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
                yield chunk
        finally:
            chunks.close()  # frees the request's KV when the consumer stops early

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt, checked against the vocabulary and the context length."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []
        else:
            ids = list(prompt)
            bad = [
                t
                for t in ids
                if not isinstance(t, int) or not 0 <= t < self.model_config.vocab_size
            ]
            if bad:
                raise ValueError(
                    f"prompt token ids must be ints in [0, {self.model_config.vocab_size}); "
                    f"got {bad[:5]}"
                )
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.context_length:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the model's context is {self.context_length} "
                f"tokens, so at most {self.context_length - 1} fit with room to generate"
            )
        if len(ids) > self.kv.num_slots:
            raise ValueError(f"prompt has {len(ids)} tokens; the KV pool holds {self.kv.num_slots}")
        return ids

    def _run(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamChunk]:
        with self._lock:
            yield from self._decode_loop(prompt_ids, params)

    def _decode_loop(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamChunk]:
        if params.max_tokens == 0:
            yield StreamChunk("", [], "length")
            return
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        stops = StopStringMatcher(params.stop_strings)
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        max_new = min(params.max_tokens, self.context_length - len(prompt_ids))
        slots = self.kv.allocate(len(prompt_ids))
        try:
            new_tokens = prompt_ids
            for step in range(max_new):
                batch = ForwardBatch.build([new_tokens], [slots], device=self.device)
                logits = self.model(batch, self.kv)
                [token], _ = sample(logits, [params], [step_seed(seed, step)])
                finish = None
                if token in stop_ids:
                    finish, text = "stop", stops.flush()
                else:
                    text = stops.add(detok.add([token]))
                    if stops.stopped:
                        finish = "stop"
                    elif step == max_new - 1:
                        finish, text = "length", text + stops.flush()
                yield StreamChunk(text, [token], finish)
                if finish:
                    return
                if not self.kv.can_allocate(1):
                    yield StreamChunk(stops.flush(), [], "length")
                    return
                slots = torch.cat([slots, self.kv.allocate(1)])
                new_tokens = [token]
        finally:
            self.kv.free(slots)
