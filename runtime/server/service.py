"""What every generating route shares: admission under a queue limit, validation before the
response starts, engine streams timed for the metrics, and cancelling work whose client left.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request

from braid.grammars.compiling.compiler import CompileQueueFull
from braid.runtime.config import RequestLimits
from braid.runtime.engine.engine import Engine
from braid.runtime.loading.model_loader import resolve_model_dir
from braid.runtime.protocol.outputs import GenerateOutput, StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat import tools
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.metrics import Metrics
from braid.runtime.server.request_context import RequestContext
from braid.runtime.server.wire import BadRequest, ModelNotFound
from braid.runtime.text import template_render
from braid.runtime.text.chat_template import ChatTemplate
from braid.runtime.text.generation_openings import GenerationOpenings

T = TypeVar("T")
# A job's chunks from (prompt ids, params): Service.stream, or a route's wrapper of it.
Streamer = Callable[[list[int], SamplingParams], AsyncIterator[StreamChunk]]


class Overloaded(Exception):
    """The server holds as many requests as it may queue, or the engine as many constraints
    waiting to compile: a 503."""


class Service:
    def __init__(
        self,
        engine: Engine,
        model_name: str,
        max_queued_requests: int,
        limits: RequestLimits | None = None,
        aliases: tuple[str, ...] = (),
        accept_any_model: bool = False,
    ) -> None:
        self.engine = engine
        self.model_name = model_name  # the primary name: listed first, reported by /server_info
        # Every name a request may give (--served-model-name NAME ALIAS...), the primary first.
        self.model_names = tuple(dict.fromkeys((model_name, *aliases)))
        self.accept_any_model = accept_any_model
        self.created = int(time.time())  # the model cards' `created`
        self.limits = limits or RequestLimits()
        # Sequences (n counts each sample) the server holds, running or waiting in the engine.
        self.capacity = engine.config.max_running_requests + max_queued_requests
        self.num_active = 0  # touched only on the event loop thread
        self.metrics = Metrics(engine)
        self.model_path = str(resolve_model_dir(engine.config.model))
        try:
            self.chat_template: ChatTemplate | None = ChatTemplate.from_tokenizer(engine.tokenizer)
        except ValueError:  # the tokenizer has none
            self.chat_template = None
        # How its generation prompt opens an assistant message (/get_model_info reports it).
        self.generation_openings = GenerationOpenings.from_tokenizer(engine.tokenizer)
        # Whether the chat template renders tools and tool turns itself (chat/tools.py); under
        # harmony it does, in harmony's own format (chat/harmony.py).
        fmt = engine.reasoning_format
        self.tools_in_template = (fmt is not None and fmt.kind == "harmony") or (
            tools.template_renders_tools(engine.tokenizer)
        )
        # A reasoning format's plain tags, which templates split assistant turns on: left as
        # the request wrote them (template_render's `unmarked`).
        self.plain_tags = (
            frozenset((fmt.start, fmt.end)) if fmt is not None and not fmt.special else frozenset()
        )
        # Tokenizing and rendering a request's text cost time in proportion to it: they run
        # here, off the event loop (the tokenizer releases the GIL while it works).
        self._prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix="braid-prepare")

    @contextmanager
    def admit(self, num_sequences: int, checked: bool = False):
        """Hold room for a request's sequences while it runs; refuse when the queue is full
        (unless the caller `checked` already, before its response started)."""
        if not checked:
            self.check_room(num_sequences)
        self.num_active += num_sequences
        try:
            yield
        finally:
            self.num_active -= num_sequences

    def check_model(self, name: object) -> str | None:
        """A model name the model is not served as (its name or an alias) is a 404, as
        OpenAI answers, unless the server accepts any name (--accept-any-model). A loaded
        LoRA adapter's name, alone or as `<served name>:<adapter>`, is the model under that
        adapter: returns the adapter's name (None for the model itself)."""
        if not isinstance(name, str) or name in self.model_names:
            return None
        adapters = self.engine.adapters
        base, _, adapter = name.rpartition(":")
        if name in adapters:
            return name
        if base in self.model_names and adapter in adapters:
            return adapter
        if not self.accept_any_model:
            raise ModelNotFound(name)
        return None

    def reply_model(self, requested: object) -> str:
        """The model name a reply carries: the one the request gave (once checked: an alias,
        or any name under --accept-any-model), else the primary one."""
        return requested if isinstance(requested, str) and requested else self.model_name

    def check_room(self, num_sequences: int) -> None:
        """A 400 for a request that could never be held, a 503 while the server is full:
        called before a request's prompts are tokenized or its samples expanded."""
        if num_sequences > self.capacity:
            raise BadRequest(
                f"the request asks for {num_sequences} sequences (prompts x n); the server "
                f"holds at most {self.capacity} (max_running_requests + max_queued_requests)"
            )
        if self.num_active + num_sequences > self.capacity:
            raise Overloaded(
                f"the server is at its queue limit ({self.capacity} sequences); retry later"
            )

    async def off_loop(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._prep, fn, *args)

    async def encode(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids, checked against the context, the KV pool and
        --max-prompt-tokens (text by its length first, where no tokenization could fit)."""
        bound = self.limits.max_prompt_tokens
        if bound is not None and isinstance(prompt, str):
            self.check_text_length(len(prompt), "prompt")
        elif bound is not None and len(prompt) > bound:
            _too_long(len(prompt), bound)
        try:
            ids = await self.off_loop(self.engine.encode, prompt)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if bound is not None and len(ids) > bound:
            _too_long(len(ids), bound)
        return ids

    def check_prompt_tokens(self, num_tokens: int) -> None:
        """--max-prompt-tokens, for a prompt tokenized elsewhere than `encode`."""
        bound = self.limits.max_prompt_tokens
        if bound is not None and num_tokens > bound:
            _too_long(num_tokens, bound)

    async def build_reply(self, build: Callable[[], T], listings: bool) -> T:
        """A whole reply built, off the event loop when it lists logprobs: n x tokens x
        top_logprobs entries, each token's text decoded, held the loop for a second and more
        (docs/reliability.md)."""
        return await self.off_loop(build) if listings else build()

    def check_text_length(self, num_chars: int, what: str) -> None:
        """Refuse text (a prompt, a conversation's messages) too long for any tokenization of
        it to fit --max-prompt-tokens (without it, the model's context), before paying to
        tokenize or render it."""
        bound = self.limits.max_prompt_tokens
        room = (
            f"the {bound} tokens this server allows a prompt (--max-prompt-tokens)"
            if bound is not None
            else f"the model's context of {self.engine.context_length} tokens"
        )
        longest = self.engine.longest_token_chars
        if num_chars > (bound or self.engine.context_length) * longest:
            raise BadRequest(
                f"{what} has {num_chars} characters; no token spells more than {longest}, so "
                f"it cannot fit {room}"
            )

    def template_variables(self, kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """A request's chat_template_kwargs, which may set the template's variables but
        never apply_chat_template's own arguments (tokenization, the template itself...) or
        the special tokens."""
        if not kwargs:
            return {}
        tokenizer = self.engine.tokenizer
        # Its arguments, and the special tokens' texts (a template variable each, which a
        # request could otherwise redefine).
        own = set(inspect.signature(tokenizer.apply_chat_template).parameters)
        own |= {"messages", "kwargs", *tokenizer.special_tokens_map}
        taken = sorted(k for k in kwargs if k in own)
        if taken:
            raise BadRequest(
                f"chat_template_kwargs may not set {', '.join(taken)}: they are arguments of "
                "the template's rendering, not variables of the template"
            )
        return kwargs

    async def check_params(self, params: SamplingParams, request: Request) -> None:
        """Compile the constraint and stop regexes now, in the engine's bounded compile
        workers (the engine then finds them in the compile cache). A client that leaves
        meanwhile gives up its compiles (ClientGone), which frees their places in the queue
        for the clients still waiting."""
        try:
            await unless_disconnected(request, asyncio.wrap_future(self.engine.prepare(params)))
        except ValueError as e:
            raise BadRequest(str(e)) from None
        except CompileQueueFull as e:
            raise Overloaded(str(e)) from None

    async def render_chat(
        self,
        messages: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The conversation's prompt tokens through the model's chat template
        (`template_kwargs`: the template's own variables, checked by template_variables;
        `tools`: as templates take them). The text is checked by its length before it is
        tokenized: the template's own text and variables are in it, the callers having
        counted only the request's text (tools.rendered_chars) before rendering it. The
        special tokens the request's strings spell are tokenized as text, unless the server
        allows them (--allow-special-tokens-in-content)."""
        tokenizer = self.engine.tokenizer

        def render() -> str:
            return template_render.render(
                tokenizer,
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                variables=template_kwargs,
                mark_special_tokens=not self.limits.allow_special_tokens_in_content,
                unmarked=self.plain_tags,
            )

        try:
            text = await self.off_loop(render)
        except Exception as e:  # the template refused the conversation (a system message...)
            raise BadRequest(
                f"the model's chat template cannot render these messages: {e}"
            ) from None
        self.check_text_length(len(text), "the conversation as the chat template renders it")
        return await self.off_loop(template_render.tokenize, tokenizer, text)

    async def stream(
        self,
        ids: list[int],
        params: SamplingParams,
        ctx: RequestContext,
        on_submit: Callable[[int], None] | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """engine.stream for one sample per call (n is split into seeded samples by
        `samples`), under the HTTP request's context (its cache scope, adapter and program),
        timed into the latency histograms; leaving early aborts it. A request its own
        parameters failed raises BadRequest, an engine failure RuntimeError."""
        start = time.monotonic()
        first, num_tokens = None, 0
        chunks = self.engine.stream(
            ids,
            params,
            on_submit=on_submit,
            cache_salt=ctx.cache_salt,
            lora=ctx.lora,
            program=ctx.program,
        )
        async for chunk in chunks:
            if chunk.token_ids and first is None:
                first = time.monotonic()
                self.metrics.ttft.observe(first - start)
            num_tokens += len(chunk.token_ids)
            if chunk.finish_reason is not None and chunk.finish_reason != "abort":
                end = time.monotonic()
                self.metrics.e2e.observe(end - start)
                if first is not None and num_tokens > 1:
                    self.metrics.tpot.observe((end - first) / (num_tokens - 1))
            if chunk.error:
                raise (BadRequest if chunk.request_error else RuntimeError)(chunk.error)
            yield chunk

    def streamer(self, ctx: RequestContext) -> Streamer:
        """`stream` under `ctx`: what a route that reads its jobs' chunks as they come uses."""
        return partial(self.stream, ctx=ctx)

    async def collect(
        self, ids: list[int], params: SamplingParams, stream: Streamer
    ) -> GenerateOutput:
        """One sample's whole output, read from `stream`."""
        text, token_ids = [], []
        async for chunk in stream(ids, params):
            text.append(chunk.text)
            token_ids += chunk.token_ids
        return GenerateOutput("".join(text), token_ids, chunk.finish_reason, chunk.meta or {})

    async def collect_all(
        self, jobs: list[tuple[list[int], SamplingParams]], stream: Streamer
    ) -> list[GenerateOutput]:
        """Every job's output, the jobs admitted together; one failing cancels the rest."""
        with self.admit(len(jobs)):
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(self.collect(ids, p, stream)) for ids, p in jobs]
            except ExceptionGroup as eg:
                raise eg.exceptions[0] from None
        return [t.result() for t in tasks]

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text, for logprob listings."""
        return self.engine.tokenizer.batch_decode([[t] for t in ids]) if ids else []


def _too_long(num_tokens: int, bound: int) -> None:
    raise BadRequest(
        f"prompt has {num_tokens} tokens; this server allows at most {bound} (--max-prompt-tokens)"
    )


def samples(params: SamplingParams) -> list[SamplingParams]:
    """n > 1 as n requests of one sample each, seeded as the engine seeds its n samples (the
    shared prompt is computed once through the prefix cache)."""
    if params.n == 1:
        return [params]
    base = params.seed
    return [
        msgspec.structs.replace(params, n=1, seed=None if base is None else base + i)
        for i in range(params.n)
    ]


async def merged(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index, item) from several async iterators as items arrive. Leaving early, or an
    error in one, cancels them all (which aborts their engine requests)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
            queue.put_nowait((i, done))
        except Exception as e:  # handed to the consumer
            queue.put_nowait((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
